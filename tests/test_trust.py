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
import sys
import time
from pathlib import Path

import pytest
from conftest import Scratch, pythonpath

from perfloop.core import sandbox

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
    package = Path(__file__).resolve().parent.parent / "perfloop"
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


def _confined_attempts(confine: str, attempts: dict, env: dict, cwd) -> str:
    """In a fresh interpreter, `confine` (an expression that confines it and says how), then
    each attempt (name -> an expression that touches a file): "name: done" or "name: refused"
    for each, joined by ";"."""
    tries = ", ".join(f"({name!r}, lambda: {expr})" for name, expr in attempts.items())
    code = (f"import os\nfrom perfloop.core import sandbox\nprint({confine})\nout = []\n"
            f"for what, fn in ({tries},):\n    try:\n        fn()\n"
            f"        out.append(what + ': done')\n    except OSError:\n"
            f"        out.append(what + ': refused')\nprint(';'.join(out))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=cwd)
    lines = result.stdout.strip().splitlines()
    assert lines and lines[0].startswith("landlock ABI"), result
    return lines[1]


@LANDLOCK
def test_a_child_that_runs_kernel_code_is_confined_where_the_kernel_allows(tmp_path):
    """The sandbox itself: writes only beneath the allowed folders, reads only the allowed."""
    ok, secret = tmp_path / "ok", tmp_path / "secret"
    ok.mkdir()
    secret.mkdir()
    (secret / "s.txt").write_text("secret")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    said = _confined_attempts(
        f"sandbox.confine([{str(ok)!r}], sandbox.environment_reads({str(tmp_path)!r}))",
        {"write ok": f"open({str(ok / 'a')!r}, 'w').write('x')",
         "write secret": f"open({str(secret / 'b')!r}, 'w').write('x')",
         "read secret": f"open({str(secret / 's.txt')!r}).read()"}, env, tmp_path)
    assert said == "write ok: done;write secret: refused;read secret: refused"


@LANDLOCK
def test_a_confined_child_opens_devices_and_shared_memory_but_makes_nothing_in_dev(tmp_path):
    """/dev/null and memory the trusted side shared (a file it made in /dev/shm) open for
    writing, and the file may be removed (torch unlinks what it was the last to use); a new
    file in /dev/shm, and any other device, do not."""
    shared = Path("/dev/shm") / f"perfloop_test_{os.getpid()}_{tmp_path.name}"
    made = shared.with_name(shared.name + "_made.py")
    removed = shared.with_name(shared.name + "_removed")
    shared.write_bytes(b"\0" * 64)
    removed.write_bytes(b"\0")
    env = sandbox.child_environment({**os.environ, "PYTHONPATH": pythonpath()},
                                    tmp_path / "child", reads=[], root=tmp_path)
    try:
        said = _confined_attempts(
            "sandbox.apply_from_environ()",
            {"null": "open('/dev/null', 'w').write('x')",
             "shared": f"open({str(shared)!r}, 'r+b').write(b'y')",
             "made": f"open({str(made)!r}, 'w').write('VALUE = 1')",
             "removed": f"os.unlink({str(removed)!r})",
             "random": "open('/dev/random', 'wb').write(b'x')"}, env, tmp_path)
        assert said == "null: done;shared: done;made: refused;removed: done;random: refused"
        assert shared.read_bytes()[:1] == b"y" and not made.exists() and not removed.exists()
    finally:
        for path in (shared, made, removed):
            path.unlink(missing_ok=True)


def test_a_timer_started_ahead_leaves_cutile_to_its_launchers(tmp_path):
    # cuda.tile imported in the timer makes its context (a temporary folder in /tmp) before the
    # launchers are forked: confined, they could not write there
    task = tmp_path / "task.json"
    task.write_text("{}")
    code = ("import sys; from perfloop.core.lifeline import wait_for_task; "
            "from perfloop.referee import timer; from pathlib import Path; "
            f"assert wait_for_task(Path({str(task)!r}), timer.PRELOAD); "
            "print('cuda.tile' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": pythonpath()}, check=True).stdout
    assert out.split() == ["False", "True"]


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
