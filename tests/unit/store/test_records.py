"""The record's types: one reader and one writer for every line of experiments.jsonl, a line
written before the types existed loading and writing back unchanged, and one-line errors."""

import json

import pytest
from conftest import LEGACY

from perfloop.core.errors import CorruptRecord
from perfloop.core.vocab import Correctness, Kind, Outcome, Status
from perfloop.store import records


def legacy_lines() -> list[str]:
    return LEGACY.read_text().splitlines()


def test_the_vocabularies_are_the_strings_written_before():
    assert set(Status) == {"keep", "revert", "crash"}
    assert set(Correctness) == {"PASS", "FAIL", ""}
    assert set(Outcome) == {"ok", "fail", "crash", "slow", "screened"}
    assert set(Kind) == {"baseline", "playbook", "agent", "confirmation"}


def test_a_record_written_before_the_types_loads_typed():
    recs = records.load(LEGACY)
    *experiments, confirmation = recs
    assert all(isinstance(r, records.Experiment) for r in experiments)
    assert isinstance(confirmation, records.Confirmation)
    assert [r.status for r in experiments] == [
        Status.KEEP, Status.KEEP, Status.REVERT, Status.REVERT, Status.KEEP, Status.KEEP,
        Status.CRASH, Status.REVERT, Status.REVERT]
    assert all(type(r.status) is Status and type(r.correctness) is Correctness
               and type(r.kind) is Kind for r in experiments)
    failed = next(r for r in experiments if r.optimization == "inject_wrong")
    assert failed.correctness is Correctness.FAIL and failed.reason.startswith("correctness")
    outcomes = {o["outcome"] for r in experiments for o in r.outcomes.values()}
    assert outcomes == {"ok", "fail", "crash", "slow", "screened"} <= set(Outcome)
    joint = experiments[-1]
    assert {"sampler", "screening", "candidates", "incumbent_value"} <= set(joint.extra)
    assert confirmation.shapes["head"]["speedup"] > 1 and confirmation.wall_s > 0


def test_every_line_written_back_is_the_same_line(tmp_path):
    lines = legacy_lines()
    for line, record in zip(lines, records.load(LEGACY), strict=True):
        assert record.to_dict() == json.loads(line)
    out = tmp_path / "experiments.jsonl"
    for record in records.load(LEGACY):
        records.append(out, record)
    assert out.read_text() == LEGACY.read_text()   # byte for byte


def test_keys_this_perfloop_does_not_know_survive_a_round_trip():
    raw = json.loads(legacy_lines()[1])
    raw.update(added_later={"nested": [1, 2]}, note=None)
    record = records.from_dict(raw)
    assert record.extra["added_later"] == {"nested": [1, 2]} and record.to_dict() == raw
    confirmation = {**json.loads(legacy_lines()[-1]), "error": None, "detail": "x"}
    assert records.from_dict(confirmation).to_dict() == confirmation   # a null stays a null


def _broken(change: dict, drop: str | None = None) -> dict:
    raw = {**json.loads(legacy_lines()[0]), **change}
    raw.pop(drop, None)
    return raw


BROKEN = {
    "not an object": ([1, 2], "not a JSON object"),
    "no decision": (_broken({}, drop="decision"), "missing decision"),
    "a decision without its reason": (_broken({"decision": {"gain": 0.1}}),
                                      "missing decision.reason"),
    "an iteration that is a string": (_broken({"iteration": "1"}), "iteration has the wrong type"),
    "a latency that is a boolean": (_broken({"latency_ms": True}),
                                    "latency_ms has the wrong type"),
    "a status nobody writes": (_broken({"status": "kept"}),
                               "status 'kept' is not one of 'keep', 'revert', 'crash'"),
    "a correctness in lower case": (_broken({"correctness": "pass"}),
                                    "correctness 'pass' is not one of 'PASS', 'FAIL', ''"),
    "a confirmation without its shapes": (
        {k: v for k, v in json.loads(legacy_lines()[-1]).items() if k != "shapes"},
        "missing shapes"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_line_is_named_in_one_line(tmp_path, case):
    raw, problem = BROKEN[case]
    path = tmp_path / "experiments.jsonl"
    path.write_text(legacy_lines()[0] + "\n" + json.dumps(raw) + "\n")
    with pytest.raises(CorruptRecord) as caught:
        records.load(path)
    message = str(caught.value)
    assert message == (f"{path}: line 2 is not an experiment record ({problem}); restore the "
                       "file or move it aside")
    assert "\n" not in message
