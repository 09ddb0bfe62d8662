"""The fleet (perfloop.fleet): a step's candidates split across workers and merged by ratios
formed on one GPU each, a lost worker's task run again and named, Ctrl-C reaching every
worker's children, and one line for what cannot start. Its runs end to end:
tests/e2e/test_fleet.py."""

import os
import threading
import time
from pathlib import Path

import pytest
from conftest import git

from perfloop.core.errors import Busy, UserError
from perfloop.core.vocab import CONTROL, INCUMBENT, Kind
from perfloop.fleet import cluster, lanes
from perfloop.fleet import task as tasks
from perfloop.measure.trial import Measured

distributed = pytest.importorskip("distributed")


# ---- the split and the merge: pure -------------------------------------------------------
def test_candidates_are_dealt_out_in_turn_and_no_group_is_empty():
    assert tasks.groups(list("abcdefg"), 3) == [list("adg"), list("be"), list("cf")]
    assert tasks.groups(list("ab"), 5) == [["a"], ["b"]]
    assert tasks.groups(list("abc"), 1) == [list("abc")]


def _measured(best, ratios: dict, outcome="ok") -> Measured:
    """A group's result: its best candidate's ratio to its own GPU's incumbent per shape."""
    summary = {shape: {"vs_incumbent": {CONTROL: {"ratio": 1.0}, best: {"ratio": r}}}
               for shape, r in ratios.items()}
    return Measured(outcome={best: (outcome, "")}, passes=[summary], best=best,
                    judge_passed=True)


def test_the_group_fastest_against_its_own_incumbent_decides():
    """Ratios are formed within a GPU only: group b's candidate is 0.9 of its GPU's incumbent,
    group a's 0.95 of its own, so b's decides, whatever either GPU's milliseconds."""
    a, b = _measured("c0", {"head": 0.95, "guard": 1.0}), _measured("c1", {"head": 0.9,
                                                                          "guard": 1.0})
    merged, select = tasks.merge([a, b], "head", 0.01)
    assert merged.best == "c1" and select
    assert merged.outcome == {"c0": ("ok", ""), "c1": ("ok", "")}


def test_a_group_whose_best_regresses_somewhere_gives_way_to_one_that_does_not():
    a = _measured("c0", {"head": 0.8, "guard": 1.2})    # faster at the headline, slower at guard
    b = _measured("c1", {"head": 0.9, "guard": 1.0})
    merged, _ = tasks.merge([a, b], "head", 0.01)
    assert merged.best == "c1"


def test_one_group_with_a_best_needs_no_selection_pass():
    merged, select = tasks.merge([_measured("c0", {"head": 0.9}),
                                  Measured(outcome={"c1": ("fail", "wrong")})], "head", 0.01)
    assert merged.best == "c0" and not select and merged.outcome["c1"] == ("fail", "wrong")


def test_a_selection_pass_runs_from_its_groups_exports_while_they_hold_its_files(tmp_path):
    """cuTile's compile cache keys on the source's path: the fresh pass that decides runs the
    kernels its group compiled on that worker, from the same folders, unless one changed."""
    from perfloop.fleet import worker
    from perfloop.measure.trial import Plan
    from perfloop.store import snapshot

    files = {"kernel.py": (snapshot.REGULAR, b"x = 1\n")}
    digest = snapshot.digest(files)
    variant = {"label": "c0", "folder": digest, "knobs": {}}
    plan = Plan(Kind.PLAYBOOK, 1, {**variant, "label": INCUMBENT}, {**variant, "label": CONTROL},
                [variant], {}, [], "head", {}, None, True, 0.0)

    def task(key):
        return tasks.Task(key, "k", "kernels/k", {}, "", "", {digest: files}, plan, 60.0, "s")

    group = task("k-01-ab")
    first = worker._exports(group, tmp_path)[digest]
    assert worker._exports(tasks.selection(group, "c0"), tmp_path)[digest] == first
    assert worker._exports(task("k-02-cd"), tmp_path)[digest] != first   # another's: its own
    os.chmod(first / "kernel.py", 0o644)
    (first / "kernel.py").write_text("x = 2\n")   # what a child might have left
    fresh = worker._exports(tasks.selection(group, "c0"), tmp_path)[digest]
    assert fresh != first and snapshot.read_back(fresh) == files


def test_ctrl_c_while_a_selection_pass_compiles_stops_its_warmers_and_timer(monkeypatch):
    """A selection pass (judged before) waits for its warmers instead of a judge; a Ctrl-C
    then stops them and the timer waiting for them, as it does while judging."""
    from types import SimpleNamespace

    from perfloop.measure import measurement, phases, process
    from perfloop.measure.trial import Plan

    done = []
    monkeypatch.setattr(measurement, "_start_timer", lambda plan, place, waiting: "timer")
    monkeypatch.setattr(phases, "start_warmers", lambda *a, **k: ["warmer"])

    def interrupted(warmers, until):
        raise KeyboardInterrupt

    monkeypatch.setattr(phases, "wait_warmers", interrupted)
    monkeypatch.setattr(phases, "stop_warmers", lambda warmers: done.append(("stop", warmers)))
    monkeypatch.setattr(phases, "abandon", lambda timer: done.append(("abandon", timer)))
    monkeypatch.setattr(process, "kill_strays", lambda: done.append(("strays",)))
    variant = {"label": "c0", "folder": "x", "knobs": {}}
    plan = Plan(Kind.PLAYBOOK, 1, {**variant, "label": INCUMBENT}, {**variant, "label": CONTROL},
                [variant], {}, [], "head", {}, SimpleNamespace(compile_processes=2), True, 0.0,
                judge=False)
    place = SimpleNamespace(pinned=SimpleNamespace(contract="c"), work="w", root="r", env={},
                            confinement=None, cache=None)
    with pytest.raises(KeyboardInterrupt):
        measurement.measure(plan, place)
    assert done == [("stop", ["warmer"]), ("abandon", "timer"), ("strays",)]


# ---- the workers ------------------------------------------------------------------------
@pytest.fixture
def fleet(tmp_path):
    """A fleet of two local worker processes without GPUs, as --workers 2 starts."""
    import cloudpickle

    from support import fleet_tasks

    cloudpickle.register_pickle_by_value(fleet_tasks)
    started = cluster.start(workers=2)
    try:
        yield started
    finally:
        started.close()


def test_every_worker_says_where_it_runs(fleet):
    assert len(fleet.workers) == 2 and not fleet.gpu
    assert all(ident["gpus"] == [] and ident["host"] for ident in fleet.workers.values())
    assert len({ident["pid"] for ident in fleet.workers.values()}) == 2


def test_a_worker_lost_mid_experiment_costs_a_run_again_and_is_named(fleet, tmp_path, caplog):
    from support import fleet_tasks

    from perfloop.fleet.driver import Remote

    remote = Remote(fleet)
    jobs = [fleet_tasks.Job(f"job-{n}", marker=str(tmp_path / "died"), n=n) for n in (1, 2)]
    results, lost = remote.run(jobs, fn=fleet_tasks.dies_once)
    assert [r["job"]["n"] for r in results] == [1, 2]
    assert len(lost) == 1 and lost[0]["worker"], lost
    # named once, by the driver: not again in the scheduler's ERROR line on the terminal
    assert not [r for r in caplog.records if cluster.LOST_WORKER in r.getMessage()]


def test_ctrl_c_of_the_driver_stops_every_workers_children(fleet, tmp_path):
    from support import fleet_tasks

    from perfloop.fleet.driver import Remote, Stopping

    remote = Remote(fleet)
    pid_file = tmp_path / "child.pid"
    job = fleet_tasks.Job("sleeper", log=str(tmp_path / "child.log"), pid=str(pid_file))
    said = {}

    def drive():
        try:
            remote.run([job], fn=fleet_tasks.child_sleeps)
        except Stopping:
            said["stopped"] = True

    waiting = threading.Thread(target=drive)
    waiting.start()
    until = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < until:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    remote.stop()
    waiting.join(10)
    assert said.get("stopped") and not waiting.is_alive()
    until = time.monotonic() + 10
    while _alive(child) and time.monotonic() < until:
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# ---- one line for what cannot start ------------------------------------------------------
def test_a_scheduler_nobody_runs_is_one_line():
    with pytest.raises(UserError, match="no scheduler answered"):
        cluster.start(scheduler="tcp://127.0.0.1:9", timeout_s=2)


def test_gpus_this_machine_does_not_have_are_refused(monkeypatch):
    monkeypatch.setattr(cluster, "local_gpus", lambda: ["0", "1"])
    with pytest.raises(UserError, match="no GPU 2 here"):
        cluster.chosen_gpus("0,2")
    with pytest.raises(UserError, match="has 2 GPUs"):
        cluster.chosen_gpus("4")
    assert cluster.chosen_gpus("all") == ["0", "1"] and cluster.chosen_gpus("1") == ["0"]


def test_workers_that_share_a_gpu_or_see_several_are_refused():
    one = {"host": "n1", "gpus": ["GPU-a"]}
    with pytest.raises(UserError, match="both see GPU GPU-a"):
        cluster.checked({"w1": one, "w2": dict(one)}, gpu=True)
    with pytest.raises(UserError, match="sees 2 GPUs"):
        cluster.checked({"w1": {"host": "n1", "gpus": ["GPU-a", "GPU-b"]}}, gpu=True)
    assert cluster.checked({"w1": one, "w2": {"host": "n2", "gpus": ["GPU-a"]}}, gpu=True)


def test_two_fleets_on_one_repository_are_refused(tmp_path):
    from perfloop.store import gitops

    git(tmp_path, "init", "-q")
    (tmp_path / "a").write_text("a")
    git(tmp_path, "add", "a")
    git(tmp_path, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "a")
    repo = gitops.open_repo(tmp_path)
    with lanes.hold(repo):
        with pytest.raises(Busy, match="this repository's fleet"):
            with lanes.hold(repo):
                pass


def test_a_lanes_bug_is_one_line_and_its_traceback_is_kept():
    from types import SimpleNamespace

    def body(s):
        if s.spec.name == "b":
            missing = {}["key"]   # noqa: F841 (a bug in one lane)
        return {"ok": True}

    lane = [SimpleNamespace(spec=SimpleNamespace(name=n)) for n in ("a", "b")]
    answers = lanes.run(lane, remote=None, body=body)
    assert answers["a"] == {"ok": True}
    said = answers["b"]["error"]
    assert said.startswith("internal error KeyError") and answers["b"]["exit_code"] == 1
    kept = Path(said.split("traceback in ", 1)[1].rstrip(")"))
    assert 'missing = {}["key"]' in kept.read_text()
