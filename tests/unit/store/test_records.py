"""The record's types: one reader and one writer for every line of experiments.jsonl, lines
written before the types existed (93a61bb) and before the timing in them had types (4df2488)
loading and writing back unchanged, and one-line errors."""

import json
import math

import pytest
from conftest import LEGACY

from perfloop.core.errors import CorruptRecord
from perfloop.core.vocab import Correctness, Kind, Outcome, Status
from perfloop.store import records

# written by 4df2488, before a line's timing had types
TIMED = LEGACY.with_name("experiments-4df2488.jsonl")


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
    assert joint.sampler == {"chosen": 18, "name": "all", "space": 18}
    assert joint.screening["shape"] == "head" and joint.every_bucket is None
    assert {"candidates", "incumbent_value"} <= set(joint.extra)
    assert confirmation.shapes["head"]["speedup"] > 1 and confirmation.wall_s > 0


def test_a_records_timing_loads_typed_to_each_variants_statistics():
    recs = records.load(TIMED)
    *experiments, confirmation = recs
    assert isinstance(confirmation, records.Confirmation)
    assert [r.optimization for r in experiments] == [
        "baseline", "fast_math", "inject_wrong", "tile_shape", "dispatch", "occupancy",
        "inject_crash", "persistent", "joint", "bucket-joint"]
    untimed = [r.iteration for r in experiments if r.timing is None]
    assert untimed == [2]   # the judge failed it: nothing was timed
    timed = [r for r in experiments if r.timing is not None]
    for record in timed:
        assert isinstance(record.timing, records.TimingDetail)
        for shape in [*record.timing.shapes.values(), *(record.timing.selection or {}).values()]:
            assert isinstance(shape, records.ShapeSummary) and shape.noise >= 0
            assert set(shape.vs_incumbent) == set(shape.variants) - {"incumbent"}
            for stats in shape.variants.values():
                assert isinstance(stats, records.VariantStats)
                assert stats.ci_low_ms <= stats.median_ms <= stats.ci_high_ms
                assert stats.n >= len(stats.round_medians_ms) > 0
    steps = {r.optimization: r for r in timed}
    head = steps["fast_math"].timing.shapes["head"]
    assert steps["fast_math"].every_bucket and steps["fast_math"].timing.chosen == "candidate-0"
    assert head.bucket == "big" and not head.held_back and head.floor_ms is None
    assert head.vs_incumbent["candidate-0"].comparison.gain == pytest.approx(0.2, abs=0.01)
    assert head.variants["candidate-0"].median_ms == steps["fast_math"].latency_ms
    held = steps["dispatch"].timing.shapes
    assert {n for n, sh in held.items() if sh.held_back} >= {"held:head", "held:tail"}
    assert "bytes" in head.extra and "samples_ms" in head.variants["incumbent"].extra
    assert steps["bucket-joint"].sampler["shape"] == "guard"
    assert steps["joint"].screening["shape"] == "head"


@pytest.mark.parametrize("path", [LEGACY, TIMED], ids=["93a61bb", "4df2488"])
def test_every_line_written_back_is_the_same_line(tmp_path, path):
    lines = path.read_text().splitlines()
    for line, record in zip(lines, records.load(path), strict=True):
        assert record.to_dict() == json.loads(line)
    out = tmp_path / "experiments.jsonl"
    for record in records.load(path):
        records.append(out, record)
    assert out.read_text() == path.read_text()   # byte for byte


def test_a_number_written_as_null_reads_as_nan_and_is_written_as_null_again(tmp_path):
    """perfloop writes a NaN or an infinity as null (perfloop.core.atomic.dumps): a typed time
    or ratio reads it back as NaN, which no comparison takes for a gain."""
    line = json.loads(TIMED.read_text().splitlines()[1])
    versus = line["timing"]["shapes"]["head"]["vs_incumbent"]["candidate-0"]
    versus.update(ratio=None, ci_high=None)
    record = records.Experiment.from_dict(line)
    typed = record.timing.shapes["head"].vs_incumbent["candidate-0"]
    assert math.isnan(typed.ratio) and math.isnan(typed.ci_high) and typed.ci_low > 0
    out = tmp_path / "experiments.jsonl"
    records.append(out, record)
    assert json.loads(out.read_text()) == line


def test_keys_this_perfloop_does_not_know_survive_a_round_trip():
    raw = json.loads(legacy_lines()[1])
    raw.update(added_later={"nested": [1, 2]}, note=None)
    record = records.from_dict(raw)
    assert record.extra["added_later"] == {"nested": [1, 2]} and record.to_dict() == raw
    confirmation = {**json.loads(legacy_lines()[-1]), "error": None, "detail": "x"}
    assert records.from_dict(confirmation).to_dict() == confirmation   # a null stays a null


def test_a_key_only_some_lines_hold_is_typed_and_left_out_where_it_was():
    raw = json.loads(legacy_lines()[1])   # a one-knob step: no sampler, screening, every_bucket
    record = records.from_dict(raw)
    assert record.incumbent_before == raw["incumbent_before"]
    assert record.sampler is record.screening is record.every_bucket is None
    assert record.to_dict() == raw          # (not written back as nulls)
    nulls = {**raw, "sampler": None, "every_bucket": None}
    assert records.from_dict(nulls).to_dict() == nulls   # and a null stays a null


def _broken(change: dict, drop: str | None = None) -> dict:
    raw = {**json.loads(legacy_lines()[0]), **change}
    raw.pop(drop, None)
    return raw


def _broken_head(change: dict) -> dict:
    """The 4df2488 baseline with its timing at the headline changed."""
    raw = json.loads(TIMED.read_text().splitlines()[0])
    head = raw["timing"]["shapes"]["head"]
    return {**raw, "timing": {**raw["timing"], "shapes": {"head": {**head, **change}}}}


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
    "a variant's statistics without a median": (
        _broken_head({"variants": {"incumbent": {"n": 1}}}),
        "missing timing.shapes.head.variants.incumbent.median_ms"),
    "a shape's noise that is a string": (_broken_head({"noise": "low"}),
                                         "timing.shapes.head.noise has the wrong type"),
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
