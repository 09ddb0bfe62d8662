"""Why a run stopped is a StopReason, never read back from its words: each stop resumes by its
reason whatever its line says, and a state file written before the reasons existed resumes."""

import json

import pytest

from perfloop.contract.playbook import SHIPPED, load
from perfloop.core.vocab import Stop, StopReason
from perfloop.plan import decide
from perfloop.store.session import LEGACY_STOP_WORDS, State, legacy_stop

FINAL = [r for r in StopReason if r.final]
# the words each rule wrote into a schema-2 state file
OLD_WORDS = {
    StopReason.MAX_ITERATIONS: "reached the iteration limit (25)",
    StopReason.ROOFLINE: "at the roofline: every shape runs at 97% of its physical floor or "
                         "more (least: head at 98.1%); nothing measurable is left",
    StopReason.NO_IMPROVEMENT: "no improvement in 2 consecutive iterations",
    StopReason.NOTHING_LEFT: "nothing left to try",
    StopReason.BASELINE_FAILED: "the baseline did not pass (correctness failed (a)); fix the "
                                "kernel first",
    StopReason.MINOR_GAIN: "1.20% faster: kept, gain under 2%: stop",
    StopReason.UNRECOGNISED: "stopped by words no rule ever wrote",
}


def state(**changes) -> State:
    return State(kernel="k", folder="kernels/k", branch="b", base_commit="a" * 40,
                 incumbent="a" * 40, judge="tests/j.py", judge_sha256="0" * 64, manifest="m",
                 **changes)


# ---- pure ------------------------------------------------------------------------------------
def test_each_stop_rule_names_its_reason():
    rules = load(SHIPPED).rules
    keep = decide.Verdict("keep", "PASS", "10% faster", 0.1, improved=True)
    minor = decide.Verdict("keep", "PASS", "1% faster: stop", 0.01, stop=True, improved=True)
    revert = decide.Verdict("revert", "PASS", "no improvement")
    found = {
        decide.stop_reason(rules.stop.max_iterations, [keep], rules.stop, 5).reason,
        decide.stop_reason(1, [keep], rules.stop, 5, floor_shares={"head": 0.99}).reason,
        decide.stop_reason(1, [minor], rules.stop, 5).reason,
        decide.stop_reason(3, [keep, revert, revert], rules.stop, 5).reason,
        decide.stop_reason(1, [keep], rules.stop, 0).reason,
    }
    assert found == {StopReason.MAX_ITERATIONS, StopReason.ROOFLINE, StopReason.MINOR_GAIN,
                     StopReason.NO_IMPROVEMENT, StopReason.NOTHING_LEFT}


@pytest.mark.parametrize("reason", FINAL)
def test_a_stop_round_trips_through_the_state_file_by_its_reason(reason):
    # the line is another rule's words: only the reason may decide what was read back
    words = OLD_WORDS[StopReason.NOTHING_LEFT if reason != StopReason.NOTHING_LEFT
                      else StopReason.ROOFLINE]
    before = state(stop=Stop(reason, words),
                   interrupted=Stop(StopReason.INTERRUPTED, "interrupted at 10:00:00"))
    raw = json.loads(json.dumps(before.to_dict()))
    assert raw["stopped"] == words and raw["stop_reason"] == reason and raw["schema"] == 3
    assert raw["interrupted"] == "interrupted at 10:00:00"
    assert State.from_dict(raw) == before


@pytest.mark.parametrize("reason", list(OLD_WORDS))
def test_a_schema_2_stop_is_read_from_the_words_its_rule_wrote(reason):
    old = {**state().to_dict(), "schema": 2, "stopped": OLD_WORDS[reason]}
    del old["stop_reason"]
    loaded = State.from_dict(old)
    assert loaded.stop == Stop(reason, OLD_WORDS[reason]) and loaded.interrupted is None
    assert legacy_stop(OLD_WORDS[reason]).reason is reason
    assert {r for r, _ in LEGACY_STOP_WORDS} | {StopReason.MINOR_GAIN} == {
        r for r in OLD_WORDS if r != StopReason.UNRECOGNISED}


@pytest.mark.parametrize("change, problem", [
    ({"stop_reason": "tired"}, "'tired' is not a valid StopReason"),
    ({"stopped": None, "stop_reason": "roofline"}, "'stop_reason' without 'stopped'"),
    ({"stopped": 3, "stop_reason": "roofline"}, "'stopped' is not a string"),
    ({"schema": 1}, "schema 1, expected 3"),
    ({"stop_reason": "interrupted"}, "'stop_reason' interrupted does not end a run"),
    ({"stop_reason": "iterations-asked"}, "'stop_reason' iterations-asked does not end a run"),
])
def test_a_state_file_with_a_stop_that_makes_no_sense_is_refused(change, problem):
    raw = {**state(stop=Stop(StopReason.ROOFLINE, "x")).to_dict(), **change}
    with pytest.raises(ValueError, match=problem):
        State.from_dict(raw)


# ---- through the CLI -------------------------------------------------------------------------
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
