"""Kernel code never shares a process with a verdict: each kind of attack an agent paid for speed
has been seen to try (perfloop issue 28), tried here by the scripted kernel's `mode` knob (an
edit to kernel code), and none of them recorded as a keep of a wrong or a not-faster kernel.

The references and the verdict come from processes that never import kernel code, the clock
is the trusted timer's, each variant runs in a launcher of its own, every timed launch runs on
inputs drawn for it, and what kernel code runs in is confined (Landlock, where the kernel has
it) and killed when its turn or phase ends. docs/threat-model.md says what each test guards.
"""

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, Scratch, git

from perfloop.isolation import sandbox

LANDLOCK = pytest.mark.skipif(sandbox.abi() < 1, reason="this kernel has no Landlock")
REAL_CLOCK = {"SCRIPTED_REAL_CLOCK": "1"}   # launches sleep their scripted time; wall clock
# Identical work timed on a wall clock by a loaded 2-core machine reads up to about 1% apart
# between two launcher processes, now and then with an interval clear of 1 (CI once kept
# "tamper" so, at a gain the rules count from 0.5%). What a trick would gain is 50% and
# more: counting gains from 5% only tells the trick from that noise. For the same reason a
# baseline is refused only when its A/A control is 25% apart, not 5% (a loaded machine read
# 5.1% and 5.7%, and the test never reached its trick).
TRICK_GAIN = "0.05"
TRICK_CONTROL_GAP = "0.25"


def _step(scratch: Scratch, mode: str, *, env: dict | None = None, script=None) -> dict:
    """The incumbent before, and the experiment of an agent step that sets the kernel's mode."""
    if env is REAL_CLOCK:
        scratch.rules(min_gain=TRICK_GAIN, max_control_gap=TRICK_CONTROL_GAP)
    if script is not None:
        scratch.script(script)
    if env is REAL_CLOCK or script is not None:
        scratch.commit_all("script and rules")
    code, out, err = scratch.cli("init", "--kernel", "scripted", env=env)
    assert code == 0, (out["experiment"]["reason"] if out else None, err)
    knobs = scratch.kernel / "knobs.json"
    knobs.write_text(knobs.read_text().replace('"mode": "ok"', f'"mode": "{mode}"'))
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--describe", f"mode {mode}",
                                 env=env)
    assert code in (0, 1), (out, err)
    return out["experiment"]


def _not_kept(e: dict, *reason: str) -> None:
    assert e["status"] != "keep", e
    assert all(r in e["reason"] for r in reason), e["reason"]


# ---- references and verdicts come from processes without kernel code --------------------
@pytest.mark.parametrize("mode", ["forge-torch", "tamper-judge"])
def test_a_wrong_kernel_that_forges_what_its_own_process_computes_fails(scratch, mode):
    """forge-torch makes `2 * x` triple in its process (the judge's and the timer's references
    were once computed beside kernel code); tamper-judge replaces perfloop's comparison there."""
    e = _step(scratch, mode)
    _not_kept(e, "correctness failed")
    assert e["correctness"] == "FAIL"


def test_a_wrong_kernel_that_feeds_its_judge_right_outputs_fails_where_it_is_timed(scratch):
    """It delivers doubled outputs to the judge while it triples: the judge passes it, and the
    trusted timer's checks of launches it cannot tell from the others fail it (a timed launch,
    or one of the judge's cases replayed: whichever the timer runs first)."""
    e = _step(scratch, "forge-judge")
    _not_kept(e)
    assert any(why in e["reason"] for why in ("timed output differs from the reference",
                                              "replayed judge case")), e["reason"]
    assert e["correctness"] == "FAIL"


# ---- the clock is the trusted timer's ----------------------------------------------------
def test_rewriting_the_clocks_of_its_own_process_gains_nothing(scratch):
    """It makes time.perf_counter run at half speed and time.thread_time stand still, in its
    process; the wall clock that times it is the trusted timer's."""
    e = _step(scratch, "tamper", env=REAL_CLOCK)
    _not_kept(e)
    assert e["correctness"] == "PASS"  # (its hashing may even cost: "regression")


def test_deprioritizing_the_other_launchers_gains_nothing(scratch):
    """It gives the incumbent's and the control's launchers SCHED_IDLE and nice 19 from its own
    (a change that outlives its turn; the scripted launch then takes twice its time): each
    batch runs with the timer's scheduling, set back before it (or, where it cannot be set
    back, nothing of the experiment is timed)."""
    e = _step(scratch, "deprioritize", env=REAL_CLOCK)
    _not_kept(e)


def test_less_work_on_inputs_it_has_seen_gains_nothing(scratch):
    """It remembers results by the content of its inputs (a tenth of the time when they come
    again): they never do, every timed launch runs on inputs drawn for it."""
    e = _step(scratch, "memo", env=REAL_CLOCK)
    _not_kept(e)
    assert e["correctness"] == "PASS"  # (hashing its inputs may even cost: "regression")


def test_work_done_only_on_outputs_perfloop_poisoned_gains_nothing(scratch):
    """A kernel that computes only where it finds its output NaN (what perfloop, and judges,
    filled outputs with) is wrong for a user whose output holds anything else; a red-team
    one was kept so. The timer now poisons with NaN, noise or zeros, drawn per batch."""
    e = _step(scratch, "nan-out", script=[{"when": {"mode": "nan-out"}, "factor": {"*": 0.5}}])
    _not_kept(e)
    assert e["correctness"] == "FAIL", e


def test_an_honest_edit_thirty_percent_faster_is_kept(scratch):
    e = _step(scratch, "fast", env=REAL_CLOCK,
              script=[{"when": {"mode": "fast"}, "factor": {"*": 0.7}}])
    assert (e["status"], e["correctness"]) == ("keep", "PASS"), e
    assert e["gain"] > 0.15


# ---- what kernel code runs in is confined and ends with its turn --------------------------
def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()


@LANDLOCK
def test_kernel_code_cannot_write_a_git_hook_or_perfloops_own_source(scratch):
    package = ROOT / "perfloop"
    before = _digest(package)
    e = _step(scratch, "plant")
    assert e["correctness"] == "PASS"
    assert not (scratch.path / ".git" / "hooks" / "post-commit").exists()
    assert _digest(package) == before


@LANDLOCK
def test_a_daemon_left_by_kernel_code_changes_nothing_after_the_step(scratch):
    """It leaves its session, outlives its process, and two seconds later writes to the run's
    record, table and state, a branch and a git hook: it is killed when its phase ends (and,
    confined, could not have written there anyway)."""
    run = scratch.path / "sandbox" / "scripted"
    e = _step(scratch, "daemon")
    assert e["correctness"] == "PASS"
    files = {name: (run / name).read_bytes()
             for name in ("experiments.jsonl", "perf_results.md", "state.json")}
    time.sleep(4)
    assert {name: (run / name).read_bytes() for name in files} == files
    assert not (scratch.path / ".git" / "refs" / "heads" / "forged").exists()
    assert not (scratch.path / ".git" / "hooks" / "post-commit").exists()
    assert b"forged" not in b"".join(files.values())


@LANDLOCK
def test_code_imported_from_outside_the_repository_never_runs(scratch, tmp_path):
    """Imported from a folder no experiment commits, it could be swapped after the keep."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "outside_helper.py").write_text("VALUE = 1\n")
    e = _step(scratch, "outside", env={"SCRIPTED_OUTSIDE": str(outside)})
    _not_kept(e)


@LANDLOCK
def test_code_kernel_code_puts_in_dev_shm_is_never_imported(scratch, tmp_path):
    """/dev/shm: every process may use it, no experiment commits it, and it outlives the
    experiment, so a module put there could be swapped after the keep (a red-team kernel was
    kept so). The mode runs twice as fast, as the helper it imports would make it."""
    tag = hashlib.sha256(str(tmp_path).encode()).hexdigest()[:12]
    helper = Path("/dev/shm") / f"scripted_{tag}.py"
    try:
        e = _step(scratch, "shm", env={"SCRIPTED_SHM_TAG": tag},
                  script=[{"when": {"mode": "shm"}, "factor": {"*": 0.5}}])
        _not_kept(e)
        assert not helper.exists()
    finally:
        helper.unlink(missing_ok=True)


def test_perfloops_own_files_changed_since_the_run_started_refuse_the_next_step(scratch):
    """Where no sandbox kept kernel code from perfloop's source, the change is seen."""
    code, out, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0, err
    state = scratch.path / "sandbox" / "scripted" / "state.json"
    raw = json.loads(state.read_text())
    raw["perfloop_sha256"] = "0" * 64   # as if the files had changed since it was pinned
    state.write_text(json.dumps(raw))
    code, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 2 and "perfloop's own source files changed" in out["error"]
    assert len(scratch.records()) == 1


def test_a_fifo_in_the_kernel_folder_stalls_no_trusted_process(scratch):
    """A FIFO beside a real edit: perfloop compares, digests and judges the folder's files
    and reads its children's logs without waiting on one (it once waited in open())."""
    code, out, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0, err
    os.mkfifo(scratch.kernel / "pipe.py")
    with open(scratch.kernel / "kernel.py", "a") as f:
        f.write("\n# an edit beside the FIFO\n")
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--describe", "fifo",
                                 timeout=240)
    assert code in (0, 1) and out["experiment"]["status"] in ("keep", "revert", "crash"), err


# ---- the commit is what ran (issue 52) ----------------------------------------------------
class _Agent:
    """An agent's process beside the step: once `when()` holds, it runs `act()`; after the step
    it runs `undo()`, as one that puts things back to hide what it did."""

    def __init__(self, when, act, undo=lambda: None):
        import threading

        self.when, self.act, self.undo, self.acted = when, act, undo, False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self.stop.is_set():
            try:
                if self.when():
                    self.act()
                    self.acted = True
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.002)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.undo()


def _in_flight(scratch: Scratch, key: str = "iteration") -> bool:
    raw = json.loads((scratch.path / "sandbox" / "scripted" / "state.json").read_text())
    return bool(raw.get("in_flight")) and raw["in_flight"].get(key) is not None


def _set_knob_mode(scratch: Scratch, mode: str) -> None:
    knobs = scratch.kernel / "knobs.json"
    raw = json.loads(knobs.read_text())
    knobs.write_text(json.dumps({**raw, "mode": mode}, indent=2) + "\n")


def _last_record(scratch: Scratch) -> dict:
    return scratch.records()[-1]


def test_a_kernel_rewritten_once_its_commit_exists_is_judged_as_committed(scratch):
    """The agent commits a wrong kernel (mode wrong-fast), and once the commit exists puts an
    honest fast one (mode fast) in the folder for the judge and the timer to find, then the
    wrong one back: perfloop judged the live folder and kept the wrong commit at 27.9%."""
    scratch.script([{"when": {"mode": "fast"}, "factor": {"*": 0.7}},
                    {"when": {"mode": "wrong"}, "factor": {"*": 0.7}}])
    scratch.commit_all("script")
    code, out, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0, err
    _set_knob_mode(scratch, "wrong")
    with _Agent(lambda: _in_flight(scratch, "commit"), lambda: _set_knob_mode(scratch, "fast"),
                lambda: _set_knob_mode(scratch, "wrong")) as agent:
        code, out, err = scratch.cli("step", "--kernel", "scripted", "--describe", "fast")
    assert agent.acted
    e = _last_record(scratch)
    assert e["status"] != "keep", e["decision"]
    committed = json.loads(git(scratch.path, "show", f"{e['commit']}:kernels/scripted/knobs.json"))
    assert committed["mode"] == "wrong" and e["knobs"]["mode"] == "wrong"
    assert e["correctness_detail"]["passed"] == {"candidate-0": False}   # what was judged


def test_a_clean_filter_makes_no_commit_other_than_what_ran(scratch):
    """With a .gitattributes in the kernel folder and a clean filter in .git/config, `git add`
    committed other knobs (1.375x slower) than those judged and timed."""
    scratch.script([{"when": {"mode": "fast"}, "factor": {"*": 0.7}}])
    scratch.commit_all("script")
    code, out, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0, err
    git(scratch.path, "config", "filter.swap.clean", "sed s/fast/slow/")
    (scratch.kernel / ".gitattributes").write_text("knobs.json filter=swap\n")
    _set_knob_mode(scratch, "fast")
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--describe", "fast")
    e = _last_record(scratch)
    assert e["status"] == "keep", e["decision"]
    committed = subprocess.run(["git", "cat-file", "blob",
                                f"{e['commit']}:kernels/scripted/knobs.json"],
                               cwd=scratch.path, capture_output=True, check=True).stdout
    assert json.loads(committed)["mode"] == "fast" == e["knobs"]["mode"]


def test_the_judge_and_its_tolerances_are_read_as_pinned_whatever_the_tree_says(scratch):
    """Between the step's start and the judge's end the agent loosens kernel.toml's tolerance
    and swaps the judge for one without the case its kernel fails, then restores both: the
    judge runs from the run's pinned tree."""
    scratch.script([{"when": {"mode": "off-at-5"}, "factor": {"*": 0.7}}])
    scratch.commit_all("script")
    code, out, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0, err
    manifest, judge = scratch.kernel / "kernel.toml", scratch.path / "tests" / "judge_scripted.py"
    pinned = {manifest: manifest.read_text(), judge: judge.read_text()}

    def loosen():
        manifest.write_text(pinned[manifest].replace("atol = 0.0", "atol = 1.0"))
        judge.write_text(pinned[judge].replace("[1, 5, 1000]", "[1, 1000]"))

    _set_knob_mode(scratch, "off-at-5")
    with _Agent(lambda: _in_flight(scratch), loosen,
                lambda: [p.write_text(t) for p, t in pinned.items()]) as agent:
        scratch.cli("step", "--kernel", "scripted", "--describe", "off at five")
    assert agent.acted
    e = _last_record(scratch)
    assert e["status"] != "keep" and e["correctness"] == "FAIL", e["decision"]
    assert any(c["case"] == "n=5" and not c["passed"]
               for c in e["correctness_detail"]["cases"]["candidate-0"]), e["correctness_detail"]


def test_an_edit_to_the_folder_while_a_step_runs_is_refused_and_left_as_it_is(scratch):
    scratch.script([{"when": {"mode": "fast"}, "factor": {"*": 0.7}}])
    scratch.commit_all("script")
    code, out, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0, err
    _set_knob_mode(scratch, "fast")
    later = scratch.kernel / "later.py"
    with _Agent(lambda: _in_flight(scratch, "commit"), lambda: later.write_text("X = 1\n")):
        scratch.cli("step", "--kernel", "scripted", "--describe", "fast")
    e = _last_record(scratch)
    assert e["status"] != "keep" and "was edited while the step ran" in e["decision"]["reason"]
    assert later.read_text() == "X = 1\n"   # never overwritten by the revert


@LANDLOCK
def test_code_from_a_file_beside_the_judge_that_no_commit_holds_never_runs(scratch):
    """A kernel read its factor from an untracked file in the judge's folder, was kept, and
    computed wrong results once the file was rewritten: children read no working tree."""
    (scratch.path / "tests" / "beside_judge.txt").write_text("FACTOR = 2\n")
    e = _step(scratch, "beside-judge", script=[{"when": {"mode": "beside-judge"},
                                                "factor": {"*": 0.5}}])
    _not_kept(e)


@LANDLOCK
def test_nothing_a_launcher_sees_names_its_role(scratch):
    """The incumbent, its control and the candidate each write what they see of themselves;
    once random names are masked, the three read the same: no path, log, command line,
    environment or neighbour tells a kept kernel that it now runs as the incumbent (one that
    ran slow only from the incumbent's export made every later step win)."""
    import re

    e = _step(scratch, "tells", script=[{"when": {"mode": "tells"}, "factor": {"*": 0.7}}])
    assert e["status"] == "keep", e
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math")
    assert code in (0, 1), err
    work = scratch.path / "sandbox" / "scripted" / "work"
    tells = [json.loads(p.read_text()) for p in work.glob("iter-02-*/k-*/tmp/tells.json")]
    specs = [json.loads(p.read_text()) for p in work.glob("iter-02-*/timing-*-spec.json")]
    roles = {str(Path(v["folder"]).resolve() / "kernel.py"): v["label"]
             for spec in specs for v in spec["variants"]}
    seen = {roles[t["file"]]: t for t in tells if t["file"] in roles}
    assert {"incumbent", "incumbent-again", "candidate-0"} <= set(seen), sorted(seen)

    def masked(t):   # (random names; a pipe's number, which the kernel hands out)
        text = json.dumps({k: v for k, v in t.items() if k != "environ"}, sort_keys=True)
        env = {k: re.sub(r"[0-9a-f]{8,}", "X", v) for k, v in t["environ"].items()}
        return re.sub(r"pipe:\[\d+\]", "pipe", re.sub(r"[0-9a-f]{8,}", "X", text)), env

    views = {role: masked(t) for role, t in seen.items()}
    assert views["incumbent"] == views["candidate-0"] == views["incumbent-again"], views
    assert "refused" in seen["incumbent"]["siblings"] and "refused" in seen["incumbent"]["repository"]


def test_the_users_secrets_never_reach_kernel_code(scratch):
    """A kernel that finds the user's secret in its environment, or in that of a process above
    it (/proc/<timer>/environ), computes wrong: it must never find it."""
    e = _step(scratch, "environ", env={"CI_SECRET_TOKEN": "hunter2"})
    assert e["correctness"] == "PASS", e
    assert "hunter2" not in json.dumps(scratch.records())


def test_a_launcher_that_lowers_the_timers_limits_or_priority_is_failed(scratch):
    """Any process of the user may lower another's resource limits or priority; the only
    launcher that ran in that turn is failed, and the timer sets its own back."""
    e = _step(scratch, "limit-timer", env=REAL_CLOCK)
    _not_kept(e, "changed the trusted timer's")


def test_a_launcher_that_weights_its_own_session_gains_nothing(scratch):
    """`echo -20 > /proc/self/autogroup` (root may) gives a launcher's session more of a busy
    CPU; the timer sets it back before every batch, and fails one that takes it while timed."""
    if os.geteuid() != 0:
        pytest.skip("only root may weight a session above its parent's")
    e = _step(scratch, "autogroup", env=REAL_CLOCK)
    _not_kept(e)


def test_a_candidate_that_takes_no_time_is_failed_not_kept_at_zero(scratch):
    """A time of zero is impossible: the clamp to zero once kept identical code as "100%
    faster", after which every command failed dividing by it."""
    scratch.script([{"when": {"fast_math": True}, "factor": {"*": 0.0}}])
    scratch.commit_all("script")
    code, out, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0, err
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math")
    e = _last_record(scratch)
    assert e["status"] != "keep" and "took no time at all" in \
        e["outcomes"]["candidate-0"]["reason"], e["outcomes"]
    for command in ("status", "report", "next"):
        code, out, err = scratch.cli(command, "--kernel", "scripted")
        assert code == 0, (command, out, err)
