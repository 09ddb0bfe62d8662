"""Why a run stopped is a StopReason, never read back from its words: each stop resumes by its
reason whatever its line says, and a state file written before the reasons existed resumes;
here as pure functions, through the CLI in tests/e2e/test_stops.py."""

import json

import pytest
from support.stops import FINAL, OLD_WORDS

from perfloop.contract.playbook import SHIPPED, load
from perfloop.core.vocab import Stop, StopReason
from perfloop.plan import decide
from perfloop.store.session import LEGACY_STOP_WORDS, State, legacy_stop


def state(**changes) -> State:
    return State(kernel="k", folder="kernels/k", branch="b", base_commit="a" * 40,
                 incumbent="a" * 40, judge="tests/j.py", judge_sha256="0" * 64, manifest="m",
                 **changes)


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
