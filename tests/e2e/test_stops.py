"""Why a run stopped, through the CLI: each stop resumes by its reason whatever its line says,
runs paused by their reason go on, and a state file written before the reasons existed resumes
(the pure functions: tests/unit/plan/test_stops.py)."""

import json

from support.stops import FINAL, OLD_WORDS

from perfloop.core.vocab import StopReason


def edit_state(scratch, **changes):
    path = scratch.path / "sandbox/scripted/state.json"
    raw = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps({k: v for k, v in raw.items() if v is not ...}))


def test_resume_after_each_stop_goes_by_its_reason_not_its_words(started):
    experiments = len(started.records())
    for n, reason in enumerate(FINAL):
        line = f"line {n}: {OLD_WORDS[StopReason.NOTHING_LEFT]}"   # words that name no reason
        edit_state(started, stopped=line, stop_reason=reason.value)
        code, st, err = started.cli("status", "--kernel", "scripted")
        assert code == 0, err
        assert (st["stopped"], st["stopped_by"], st["interrupted"]) == (line, reason, None)
        code, out, err = started.cli("next", "--kernel", "scripted")
        assert code == 0 and (out["stopped"], out["stopped_by"]) == (line, reason), err
        code, out, err = started.cli("run", "--kernel", "scripted", "--resume")
        assert code == 0, err
        assert (out["stop_reason"], out["stopped_by"]) == (line, reason)
        assert out["experiments_this_call"] == [] and len(started.records()) == experiments
        code, r, err = started.cli("report", "--kernel", "scripted")
        assert code == 0 and (r["stopped"], r["stopped_by"], r["stop_reason"]) == (
            line, reason, line), err


def test_runs_paused_by_their_reason_go_on_when_resumed(started):
    code, out, err = started.cli("run", "--kernel", "scripted", "--resume", "--max-iterations", "0")
    assert code == 0 and out["stopped_by"] == StopReason.ITERATIONS_ASKED, err
    assert out["stop_reason"] == "stopped after 0 iterations as asked (--max-iterations)"
    assert out["status"]["stopped"] is None and out["status"]["stopped_by"] is None
    edit_state(started, interrupted="interrupted at 10:00:00")
    code, st, _ = started.cli("status", "--kernel", "scripted")
    assert st["interrupted"] == "interrupted at 10:00:00" and st["stopped_by"] is None
    code, out, err = started.cli("run", "--kernel", "scripted", "--resume", "--max-iterations", "1")
    assert code == 0 and len(out["experiments_this_call"]) == 1, err
    assert out["stopped_by"] == StopReason.ITERATIONS_ASKED and out["status"]["interrupted"] is None


def test_a_state_file_of_the_previous_version_resumes(started):
    """Schema 2: no stop_reason, a stop kept as its words, an interruption as a line."""
    edit_state(started, schema=2, stop_reason=..., interrupted="interrupted at 10:00:00")
    code, out, err = started.cli("run", "--kernel", "scripted", "--resume", "--max-iterations", "1")
    assert code == 0 and len(out["experiments_this_call"]) == 1, err
    assert json.loads((started.path / "sandbox/scripted/state.json").read_text())["schema"] == 3
    for reason, words in OLD_WORDS.items():
        edit_state(started, schema=2, stop_reason=..., stopped=words)
        code, out, err = started.cli("run", "--kernel", "scripted", "--resume")
        assert code == 0 and (out["stop_reason"], out["stopped_by"]) == (words, reason), err
        assert out["experiments_this_call"] == []


def test_a_broken_stop_in_the_state_file_is_one_line(started):
    edit_state(started, stopped="x", stop_reason="tired")
    code, out, _ = started.cli("status", "--kernel", "scripted")
    assert code == 2 and "state.json is corrupted" in out["error"] and "tired" in out["error"]
    assert "\n" not in out["error"]
