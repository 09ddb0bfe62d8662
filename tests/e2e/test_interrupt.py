"""Ctrl-C as a terminal sends it (SIGINT to perfloop's whole process group, GitPython's git
helpers included) at every phase of `init`, `step` and `run`: exit 130, the interruption
written into state.json, and `--resume` goes on to a consistent run.

Each test walks every phase in one repository (interrupt, check, resume, interrupt the next
experiment at the next phase), so that the phases cost one run, not one each."""

import json
import os
import signal

import pytest
from conftest import git
from support.reliability import answer, group_alive, spawn, wait_until_timing
from support.runs import GAINS, assert_consistent

# every point where perfloop.core.faults can interrupt an experiment ("committed": right after
# a commit, before the in-flight marker knows it); from "record" on, the experiment is
# recorded and the resume finishes it instead of redoing it
PHASES = ["started", "correctness", "timing", "commit", "committed", "record", "git", "table"]
RECORDED = ("record", "git", "table")


def ctrl_c_at(scratch, phase: str, iteration: int, *args: str):
    """The command, with a Ctrl-C sent to its process group at `phase` of `iteration`."""
    at = phase if phase in ("committed", "branched") else f"{phase}@{iteration}"
    return answer(spawn(scratch.path, *args, env={"PERFLOOP_CRASH_AT": at,
                                                  "PERFLOOP_CRASH_SIGNAL": "INT"}), timeout=600)


def state(scratch) -> dict:
    return json.loads((scratch.path / "sandbox/scripted/state.json").read_text())


def assert_interrupted(scratch, code: int, out: dict, err: str, phase: str):
    assert code == 130, (phase, out, err)
    assert out["exit_code"] == 130 and "--resume" in out["error"], (phase, out)
    assert "Traceback" not in err and "internal error" not in out["error"], (phase, err)
    assert state(scratch)["interrupted"].startswith("interrupted at"), phase


@pytest.fixture
def gains(scratch):
    scratch.script(GAINS)
    scratch.commit_all("script")
    return scratch


def test_ctrl_c_during_a_step_at_each_phase(gains):
    assert gains.cli("init", "--kernel", "scripted")[0] == 0
    for n, phase in enumerate(PHASES, start=1):
        opt = ["--opt", "fast_math"] if n == 1 else ["--opt", "occupancy", "--value", "2"]
        code, out, err = ctrl_c_at(gains, phase, n, "step", "--kernel", "scripted", *opt)
        assert_interrupted(gains, code, out, err, phase)
        assert state(gains)["in_flight"]["iteration"] == n  # for `step --resume`
        code, out, err = gains.cli("step", "--kernel", "scripted", "--resume")
        assert code == 0, (phase, err)
        st, recs = assert_consistent(gains, n + 1)
        assert st["interrupted"] is None and recs[n]["optimization"] == opt[1], phase
    assert recs[1]["status"] == "keep" and '"fast_math": true' in (
        gains.kernel / "knobs.json").read_text()


def test_ctrl_c_during_a_run_at_each_phase(gains):
    """`run` sets an unrecorded experiment aside (it is planned again); a recorded one is
    finished. Before, a Ctrl-C to the group exited 1 with BrokenPipeError."""
    command = ["run", "--kernel", "scripted"]
    for phase in PHASES:
        before = len(gains.records())
        iteration = max(before, 1)
        code, out, err = ctrl_c_at(gains, phase, iteration, *command)
        assert_interrupted(gains, code, out, err, phase)
        st, recs = assert_consistent(gains, iteration + (phase in RECORDED))
        assert st["in_flight"] is None and st["stopped"] is None
        command = ["run", "--kernel", "scripted", "--resume"]
    code, out, err = gains.cli(*command)
    assert code == 0, err
    st, recs = assert_consistent(gains, 7)
    assert st["interrupted"] is None and out["stopped_by"] == "minor-gain"
    assert [r["optimization"] for r in recs] == ["baseline", "fast_math", "tile_shape",
                                                 "occupancy", "persistent", "joint",
                                                 "bucket-joint"]
    assert git(gains.path, "for-each-ref", "--format=%(refname)",
               f"refs/perfloop/{st['branch']}/abandoned-01-*")  # the commit set aside


def test_ctrl_c_during_init_at_each_phase(scratch):
    baseline_phases = [p for p in PHASES if p not in ("commit", "committed")]  # (no commit)
    for n, phase in enumerate(baseline_phases):
        args = ["init", "--kernel", "scripted"] + (["--new"] if n else [])
        code, out, err = ctrl_c_at(scratch, phase, 0, *args)
        assert_interrupted(scratch, code, out, err, phase)
        code, out, err = scratch.cli("run", "--kernel", "scripted", "--resume",
                                     "--max-iterations", "0")
        assert code == 0, (phase, err)
        st, recs = assert_consistent(scratch, 1)
        assert st["interrupted"] is None and recs[0]["status"] == "keep", phase
    assert len(list((scratch.path / "sandbox/_archive/scripted").iterdir())) == \
        len(baseline_phases) - 1


def test_ctrl_c_before_the_runs_state_is_saved_leaves_no_branch(scratch):
    """The run's branch is made, then its state saved: a Ctrl-C between the two puts the user
    back on their branch, with no run and no branch left behind, and init starts again."""
    before = scratch.snapshot()
    code, out, err = ctrl_c_at(scratch, "branched", 0, "init", "--kernel", "scripted")
    assert code == 130 and "Traceback" not in err, (out, err)
    assert scratch.snapshot() == before and scratch.branch() == "main"
    assert not (scratch.path / "sandbox/scripted/state.json").exists()
    code, out, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0, err
    assert_consistent(scratch, 1)


def test_ctrl_c_to_the_group_while_timing_mid_run(gains):
    """A Ctrl-C at a moment of its own (not at a fault point) during a run's timing: before,
    the signal also killed GitPython's `git cat-file` helper in perfloop's group, and the
    clean-up died talking to it (exit 1, BrokenPipeError, no interruption recorded)."""
    proc = spawn(gains.path, "run", "--kernel", "scripted", env={"SCRIPTED_DELAY_S": "0.002"})
    wait_until_timing(gains.path, 300)
    os.killpg(proc.pid, signal.SIGINT)
    code, out, err = answer(proc, timeout=120)
    assert_interrupted(gains, code, out, err, "timing")
    assert not group_alive(proc.pid)  # nothing of perfloop's group outlived it
    assert_consistent(gains, 1)
    code, out, err = gains.cli("run", "--kernel", "scripted", "--resume", "--max-iterations", "1")
    assert code == 0, err
    _, recs = assert_consistent(gains, 2)
    assert recs[1]["optimization"] == "fast_math"


def test_sigterm_mid_run_is_recorded_as_an_interruption(gains):
    """`kill PID` (a scheduler's time limit, a supervisor) during a run's timing: exit 143,
    the interruption in state.json as for Ctrl-C, and `--resume` goes on. Before, SIGTERM
    killed perfloop where it stood and `interrupted` stayed null."""
    proc = spawn(gains.path, "run", "--kernel", "scripted", env={"SCRIPTED_DELAY_S": "0.002"})
    wait_until_timing(gains.path, 300)
    os.kill(proc.pid, signal.SIGTERM)  # perfloop alone, not its group
    code, out, err = answer(proc, timeout=120)
    assert code == 143 and out["exit_code"] == 143, (out, err)
    assert "SIGTERM" in out["error"] and "--resume" in out["error"] and "Traceback" not in err
    assert state(gains)["interrupted"].startswith("interrupted at")
    assert state(gains)["interrupted"].endswith("by SIGTERM")
    assert not group_alive(proc.pid)
    assert_consistent(gains, 1)
    code, out, err = gains.cli("run", "--kernel", "scripted", "--resume", "--max-iterations", "1")
    assert code == 0, err
    st, recs = assert_consistent(gains, 2)
    assert st["interrupted"] is None and recs[1]["optimization"] == "fast_math"
