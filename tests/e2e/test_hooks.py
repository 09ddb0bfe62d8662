"""A kernel's in-place contract through the loop: the worker reads the hooks from the run's
pinned kernel.py, checks every timed launch, and fails cheats the judge passed (the hooks
alone, on the CPU: tests/unit/contract/test_hooks.py)."""

import json
import shutil

import pytest
from conftest import ROOT

SUPPORT = ROOT / "tests" / "support"


@pytest.fixture
def inplace(scratch):
    """The scratch repository with the scripted kernel replaced by an in-place one."""
    shutil.copy(SUPPORT / "inplace_scripted.py", scratch.kernel / "kernel.py")
    shutil.copy(SUPPORT / "judge_inplace.py", scratch.path / "tests" / "judge_scripted.py")
    scratch.commit_all("an in-place kernel")
    return scratch


def _step_with_mode(repo, mode: str) -> dict:
    code, out, err = repo.cli("init", "--kernel", "scripted")
    assert code == 0 and out["experiment"]["status"] == "keep", (out, err)
    knobs = repo.kernel / "knobs.json"
    knobs.write_text(knobs.read_text().replace('"mode": "ok"', f'"mode": "{mode}"'))
    code, out, err = repo.cli("step", "--kernel", "scripted", "--describe", f"mode {mode}")
    assert code == 0, (out, err)
    return out["experiment"]


def test_an_in_place_kernel_is_timed_and_checked_through_the_loop(inplace):
    code, out, err = inplace.cli("init", "--kernel", "scripted")
    assert code == 0 and (out["experiment"]["status"], out["experiment"]["correctness"]) == (
        "keep", "PASS"), (out, err)
    # the baseline's timed launches were checked (y included: see the "once" cheat below)
    checked = inplace.records()[0]["timing"]["shapes"]["head"]
    assert "launches per batch" in inplace.records()[0]["timing"]["method"]["verified"]
    assert checked["reps_per_round"] > 1


@pytest.mark.parametrize("mode, reason", [
    ("once", "timed output differs from the reference at head (output 1:"),
    ("scribble", "wrote to input 1, which kernel.py does not declare in INPLACE"),
])
def test_in_place_cheats_that_pass_the_judge_fail_the_timed_check(inplace, mode, reason):
    e = _step_with_mode(inplace, mode)
    assert (e["status"], e["correctness"]) == ("revert", "FAIL"), e
    assert reason in e["reason"], e["reason"]


def test_a_wrong_in_place_declaration_fails_the_baseline_in_one_line(inplace):
    kernel = inplace.kernel / "kernel.py"
    kernel.write_text(kernel.read_text().replace("INPLACE = (2,)", "INPLACE = (7,)"))
    inplace.commit_all("a wrong declaration")
    code, out, err = inplace.cli("init", "--kernel", "scripted")
    assert code != 0 and "Traceback" not in err
    assert "INPLACE names input 7, but make_inputs returns 3 inputs" in json.dumps(out)
