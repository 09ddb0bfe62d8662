"""kill -9 in the middle of an iteration, at every phase, then `perfloop run --resume`."""

import json

import pytest
from conftest import git
from support.runs import GAINS, assert_consistent

from perfloop.store import table

PHASES = ["started", "correctness", "timing", "commit", "record", "git", "table"]


@pytest.mark.parametrize("phase", PHASES)
def test_resume_after_kill_at_each_phase(scratch, phase):
    scratch.script(GAINS)
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, _, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math",
                             env={"PERFLOOP_CRASH_AT": f"{phase}@1"})
    assert code == -9
    refused, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape")
    assert refused == 2 and "--resume" in out["error"]
    code, out, err = scratch.cli("run", "--kernel", "scripted", "--resume", "--max-iterations", "0")
    assert code == 0, err
    state, recs = assert_consistent(scratch, 2)
    assert recs[1]["optimization"] == "fast_math" and recs[1]["status"] == "keep"
    assert '"fast_math": true' in (scratch.kernel / "knobs.json").read_text()
    abandoned = git(scratch.path, "for-each-ref", "--format=%(refname)",
                    f"refs/perfloop/{state['branch']}/abandoned-01-*")
    assert bool(abandoned) == (phase == "commit")   # a commit made but never recorded is kept aside


def test_resume_after_kill_during_the_baseline(scratch):
    code, _, _ = scratch.cli("init", "--kernel", "scripted", env={"PERFLOOP_CRASH_AT": "timing@0"})
    assert code == -9
    code, out, err = scratch.cli("run", "--kernel", "scripted", "--resume", "--max-iterations", "0")
    assert code == 0, err
    assert_consistent(scratch, 1)


def test_an_interrupted_run_resumed_ends_where_an_uninterrupted_one_does(scratch):
    scratch.script(GAINS)
    scratch.commit_all("script")
    code, _, _ = scratch.cli("run", "--kernel", "scripted", env={"PERFLOOP_CRASH_AT": "record@2"})
    assert code == -9
    code, out, err = scratch.cli("run", "--kernel", "scripted", "--resume")
    assert code == 0, err
    _, recs = assert_consistent(scratch, 7)
    assert [r["optimization"] for r in recs] == ["baseline", "fast_math", "tile_shape", "occupancy",
                                                 "persistent", "joint", "bucket-joint"]
    assert out["stopped_by"] == "minor-gain"


def test_resume_with_nothing_interrupted_says_so(started):
    code, out, _ = started.cli("step", "--kernel", "scripted", "--resume")
    assert code == 2 and "nothing to resume" in out["error"]


def test_an_agent_edit_interrupted_while_judged_is_redone_on_resume(scratch):
    scratch.script(GAINS)
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    knobs = scratch.kernel / "knobs.json"
    knobs.write_text(knobs.read_text().replace('"fast_math": false', '"fast_math": true'))
    code, _, _ = scratch.cli("step", "--kernel", "scripted", "--describe", "fast math by hand",
                             env={"PERFLOOP_CRASH_AT": "timing@1"})
    assert code == -9
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--resume")
    assert code == 0, err
    _, recs = assert_consistent(scratch, 2)
    assert (recs[1]["kind"], recs[1]["describe"], recs[1]["status"]) == \
        ("agent", "fast math by hand", "keep")
    assert '"fast_math": true' in knobs.read_text()


def test_ctrl_c_stops_the_run_and_resume_goes_on(scratch):
    import os
    import signal
    import subprocess
    import sys

    from conftest import pythonpath

    scratch.script(GAINS)
    scratch.commit_all("script")
    env = {**os.environ, "PYTHONPATH": pythonpath(), "SCRIPTED_DELAY_S": "0.002"}
    proc = subprocess.Popen([sys.executable, "-m", "perfloop", "run", "--kernel", "scripted"],
                            cwd=scratch.path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            # a shell that started the tests in the background ignores SIGINT,
                            # and its children inherit that: give this one Ctrl-C back
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    from support.reliability import wait_until_timing

    wait_until_timing(scratch.path, 60)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "--resume" in err
    state = json.loads((scratch.path / "sandbox/scripted/state.json").read_text())
    assert state["interrupted"].startswith("interrupted") and state["in_flight"] is None
    assert state["stopped"] is None
    assert_consistent(scratch, 1)
    code, out, err = scratch.cli("run", "--kernel", "scripted", "--resume")
    assert code == 0, err
    _, recs = assert_consistent(scratch, 7)   # ... occupancy, persistent, the joint searches
    assert recs[1]["optimization"] == "fast_math" and recs[5]["optimization"] == "joint"
    assert recs[6]["optimization"] == "bucket-joint"


@pytest.mark.parametrize("kind", ["agent", "playbook"])
def test_kill_right_after_a_commit_before_the_marker_knows_it(scratch, kind):
    scratch.script(GAINS)
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    if kind == "agent":
        knobs = scratch.kernel / "knobs.json"
        knobs.write_text(knobs.read_text().replace('"fast_math": false', '"fast_math": true'))
        args = ["--describe", "fast math by hand"]
    else:
        args = ["--opt", "fast_math"]
    code, _, _ = scratch.cli("step", "--kernel", "scripted", *args,
                             env={"PERFLOOP_CRASH_AT": "committed"})
    assert code == -9
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--resume")
    assert code == 0, err
    state, recs = assert_consistent(scratch, 2)
    assert (recs[1]["kind"], recs[1]["status"]) == (kind, "keep")
    assert git(scratch.path, "for-each-ref", "--format=%(refname)",
               f"refs/perfloop/{state['branch']}/abandoned-01-*")


def test_ctrl_c_while_judging_in_parallel_kills_every_judge_at_once(scratch):
    """Two judge processes, one hanging: Ctrl-C must not wait for either."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import pythonpath

    scratch.rules(judge_processes="2", stall_timeout_s="300")
    scratch.add_optimization("modes", "mode", ["hang", "ok-too"])
    scratch.commit_all("a hanging candidate")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    env = {**os.environ, "PYTHONPATH": pythonpath()}
    proc = subprocess.Popen([sys.executable, "-m", "perfloop", "step", "--kernel", "scripted",
                             "--opt", "modes"], cwd=scratch.path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    work = scratch.path / "sandbox/scripted/work"
    deadline = time.monotonic() + 60
    def requests():
        return list(work.glob("iter-01-*/k-*/request.json"))

    while len(requests()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert time.monotonic() < deadline          # both judges started (and one hangs)
    time.sleep(2)
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and time.monotonic() - started < 15, err
    left = subprocess.run(["pgrep", "-f", str(work)], capture_output=True, text=True).stdout
    assert left.strip() == "", f"judge processes left running: {left}"


@pytest.mark.parametrize("phase", ["record", "git", "table"])
def test_resume_refused_for_edits_inside_changes_nothing(scratch, phase):
    """Found by the state machine: killed after the record was written, then an edit inside
    the folder; `run --resume` finished the recorded experiment, then refused its next step for
    the edit: a refused command that changed the run's state. It now refuses first."""
    scratch.script(GAINS)
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, _, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math",
                             env={"PERFLOOP_CRASH_AT": f"{phase}@1"})
    assert code == -9
    knobs = scratch.kernel / "knobs.json"
    knobs.write_text(knobs.read_text().replace('"fast_math": true', '"fast_math": false'))
    sandbox = scratch.path / "sandbox/scripted"
    before = {p.name: p.read_bytes() for p in sandbox.iterdir() if p.is_file()}
    head, edited = scratch.head(), knobs.read_text()
    code, out, _ = scratch.cli("run", "--kernel", "scripted", "--resume", "--max-iterations", "1")
    assert code == 2 and "uncommitted edits inside" in out["error"]
    assert {p.name: p.read_bytes() for p in sandbox.iterdir() if p.is_file()} == before
    assert scratch.head() == head and knobs.read_text() == edited
    git(scratch.path, "checkout", "--", "kernels/scripted/knobs.json")
    code, out, err = scratch.cli("run", "--kernel", "scripted", "--resume", "--max-iterations", "0")
    assert code == 0, err
    assert_consistent(scratch, 2)


# ---- a table that the record does not match, with an experiment in flight (issue 29) -------
def kill_during_a_step(scratch, opt: str, phase: str, iteration: int) -> dict:
    code, _, _ = scratch.cli("step", "--kernel", "scripted", "--opt", opt,
                             env={"PERFLOOP_CRASH_AT": f"{phase}@{iteration}"
                                  if phase != "committed" else phase})
    assert code == -9
    state = json.loads((scratch.path / "sandbox/scripted/state.json").read_text())
    assert state["in_flight"]["iteration"] == iteration
    return state


def test_a_table_row_the_record_lacks_is_repaired_by_resume(started):
    """A row for the experiment in flight that has no record line (a table edited by hand, or
    written ahead of its record): no ref of that number exists, so no experiment is lost by
    dropping it. Before, `run --resume` refused for it, and so did `run --new`."""
    kill_during_a_step(started, "fast_math", "committed", 1)
    path = started.path / "sandbox/scripted/perf_results.md"
    path.write_text(path.read_text() + table.format_row(1, "invented", 0.1, "PASS", "keep"))
    code, out, err = started.cli("run", "--kernel", "scripted", "--resume", "--max-iterations",
                                 "0")
    assert code == 0, err
    assert "had 2 rows for 1 experiments; rewritten from the record" in err
    state, recs = assert_consistent(started, 2)
    assert recs[1]["optimization"] == "fast_math" and "invented" not in started.table()
    assert "invented" in next(path.parent.glob("perf_results.replaced-*.md")).read_text()
    assert git(started.path, "for-each-ref", "--format=%(refname)",
               f"refs/perfloop/{state['branch']}/abandoned-01-*")  # the first try, set aside


def test_a_record_that_lost_experiments_is_set_aside_by_new(started):
    """The record cut back to its baseline while iteration 2 is in flight: iteration 1's row
    and ref outlive it, so repairing the table would let the next experiment take over the
    ref iter-01. `--resume` refuses, naming --new; `--new` sets the run aside (before, it
    refused too, for the experiment in flight: a dead end)."""
    assert started.cli("step", "--kernel", "scripted", "--opt", "fast_math")[0] == 0
    old = kill_during_a_step(started, "tile_shape", "committed", 2)
    unrecorded = started.head()
    records = started.path / "sandbox/scripted/experiments.jsonl"
    records.write_text(records.read_text().splitlines(keepends=True)[0])
    (started.path / "notes.txt").write_text("the user's own\n")
    before = started.snapshot()
    for args in (["run", "--resume"], ["status"]):
        code, out, err = started.cli(*args[:1], "--kernel", "scripted", *args[1:])
        assert code == 2 and "--new" in out["error"] and "iter-01" in out["error"], err
        assert started.snapshot() == before
    code, out, err = started.cli("run", "--kernel", "scripted", "--new", "--max-iterations", "0")
    assert code == 0, err
    assert (started.path / "notes.txt").read_text() == "the user's own\n"
    (started.path / "notes.txt").unlink()
    state, recs = assert_consistent(started, 1)
    # the new run starts from the old incumbent, not from the experiment never finished
    assert state["base_commit"] == old["incumbent"] and state["branch"] != old["branch"]
    refs = git(started.path, "for-each-ref", "--format=%(objectname) %(refname)")
    assert f"{unrecorded} refs/perfloop/{old['branch']}/abandoned-02-" in refs
    assert f"refs/perfloop/{old['branch']}/iter-01" in refs
    assert git(started.path, "rev-parse", old["branch"]) == unrecorded  # left as it was
    archived = started.path / "sandbox/_archive/scripted"
    assert [p.name for p in archived.iterdir()] == [f"{old['branch']}-{int(old['started_at'])}"]


def test_new_puts_back_the_knobs_perfloop_wrote_for_an_experiment_in_flight(started):
    """Killed between writing knobs.json and committing it: that file is perfloop's (the
    marker holds its digest), so `init --new` puts it back instead of refusing it as the
    user's uncommitted change."""
    from perfloop.run.finish import knobs_digest

    kill_during_a_step(started, "fast_math", "timing", 1)
    knobs = started.kernel / "knobs.json"
    committed = knobs.read_text()
    text = committed.replace('"fast_math": false', '"fast_math": true')
    path = started.path / "sandbox/scripted/state.json"
    state = json.loads(path.read_text())
    state["in_flight"]["knobs_sha256"] = knobs_digest(text)
    path.write_text(json.dumps(state))
    knobs.write_text(text)
    code, out, err = started.cli("init", "--kernel", "scripted", "--new")
    assert code == 0, err
    assert knobs.read_text() == committed
    assert_consistent(started, 1)
