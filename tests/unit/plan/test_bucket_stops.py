"""The stop rules per bucket (perfloop.plan.bucket_stops): a run whose benchmark spans several
buckets stops on "no improvement" or "gain under 2%" only when every bucket has stopped."""

from __future__ import annotations

import pytest
from support.records import experiment
from support.records import summary as typed

from perfloop.contract.playbook import SHIPPED, load
from perfloop.core.vocab import StopReason
from perfloop.plan import bucket_stops, decide

RULES = load(SHIPPED).rules
SHAPES = {"head": "big", "tail": "big", "guard": "small"}


def _versus(ratio: float) -> dict:
    """The final pass's comparison of the chosen candidate, as the verdict weighed it."""
    return {"candidate-0": {"ratio": ratio, "ci_low": ratio - 0.002, "ci_high": ratio + 0.002,
                            "noise": 0.001}}


def baseline(shapes: dict | None = None):
    if shapes is None:
        shapes = {n: {"bucket": b} for n, b in SHAPES.items()}
        shapes["held:head"] = {"bucket": "big", "held_back": True}
    return experiment({"kind": "baseline", "iteration": 0, "status": "keep",
                       "timing": {"shapes": shapes}})


def step(i: int, ratios: dict[str, float], status: str = "keep",
         optimization: str = "tile_shape", selection: dict | None = None, **more):
    """An experiment whose candidate ran at `ratios` of the incumbent's time per shape."""
    shapes = {n: {"bucket": b, "vs_incumbent": _versus(ratios.get(n, 1.0))}
              for n, b in SHAPES.items()}
    return experiment({
        "kind": "playbook", "iteration": i, "optimization": optimization, "status": status,
        "timing": {"chosen": "candidate-0" if status == "keep" else None, "shapes": shapes,
                   **({"selection": selection} if selection else {})}, **more})


def stops(recs):
    return bucket_stops.bucket_stops(recs, "head", RULES.decision,
                                     RULES.stop.no_improvement_streak)


def test_each_bucket_is_decided_at_its_own_shape_the_headline_in_its_bucket():
    assert bucket_stops.focus_shapes([baseline()], "tail") == {"big": "tail", "small": "guard"}
    assert bucket_stops.focus_shapes([baseline()], "head") == {"big": "head", "small": "guard"}


def test_a_minor_gain_at_the_headline_stops_its_bucket_only():
    recs = [baseline(), step(1, {"head": 0.99, "tail": 0.99, "guard": 0.90})]
    got = stops(recs)
    assert got["big"].reason is StopReason.MINOR_GAIN and "1.00% faster" in got["big"].detail
    assert got["small"] is None
    args = bucket_stops.stop_args(recs, "head", RULES.decision,
                                  RULES.stop.no_improvement_streak)
    assert args == {"per_bucket": True}
    # the run-wide rule would have stopped here; per bucket the small one still gains
    verdict = decide.Verdict("keep", "PASS", "1.00% faster: kept, gain under 2%: stop", 0.01,
                             stop=True, improved=True)
    assert decide.stop_reason(1, [verdict], RULES.stop, 5).reason is StopReason.MINOR_GAIN
    assert decide.stop_reason(1, [verdict], RULES.stop, 5, **args) is None


def test_reverts_add_to_every_buckets_streak_and_the_run_stops_when_all_have_stopped():
    recs = [baseline(), step(1, {"head": 0.99, "guard": 0.90}),
            step(2, {"head": 1.0, "guard": 1.0}, "revert"),
            step(3, {"head": 1.1, "guard": 0.95}, "revert")]
    got = stops(recs)
    assert got["big"].reason is StopReason.MINOR_GAIN
    assert got["small"].reason is StopReason.NO_IMPROVEMENT and "2 catalog" in got["small"].detail
    args = bucket_stops.stop_args(recs, "head", RULES.decision,
                                  RULES.stop.no_improvement_streak)
    stop = decide.stop_reason(3, [], RULES.stop, 5, **args)
    assert stop.reason is StopReason.MINOR_GAIN
    assert "every bucket has stopped" in stop.detail and "small: no improvement" in stop.detail


def test_a_search_does_not_add_to_a_streak_and_a_larger_gain_sets_a_bucket_going_again():
    recs = [baseline(), step(1, {"head": 0.99, "guard": 0.9}),
            step(2, {"head": 1.0, "guard": 1.0}, "revert", optimization="dispatch"),
            step(3, {"head": 0.90, "guard": 1.0})]
    got = stops(recs)
    assert got["big"] is None                      # 10% in iteration 3
    assert got["small"] is None    # one catalog step without a gain there (2 is a search)
    recs.append(step(4, {"head": 1.0, "guard": 1.0}, "revert"))
    assert stops(recs)["small"].reason is StopReason.NO_IMPROVEMENT


def test_one_bucket_keeps_the_run_wide_rules():
    recs = [baseline({"head": {"bucket": "all"}})]
    assert bucket_stops.stop_args(recs, "head", RULES.decision, 2) == {}


def test_a_bucket_counts_the_final_pass_its_verdict_weighed_not_the_selection():
    # (the README kernel's tile step was kept at a real gain in its final pass while its noisy
    # selection pass could not tell: the bucket must see what the verdict saw)
    record = step(1, {"head": 0.9, "guard": 0.9},
                  selection={n: {"bucket": b, "vs_incumbent": _versus(1.0)}
                             for n, b in SHAPES.items()})
    assert stops([baseline(), record]) == {"big": None, "small": None}


def test_a_verdicts_minor_gain_names_its_bucket_when_the_benchmark_spans_several():
    from perfloop.plan import weigh

    def summary(buckets: dict[str, str]) -> dict:
        return typed({n: {"bucket": b, "held_back": False, "floor_ms": None,
                          "variants": {"candidate-0": {"median_ms": 0.99}},
                          "vs_incumbent": _versus(0.99)} for n, b in buckets.items()})

    several = weigh.verdict(summary(SHAPES), "candidate-0", "head", RULES.decision)
    one = weigh.verdict(summary({"head": "big", "tail": "big"}), "candidate-0", "head",
                      RULES.decision)
    assert several.stop and several.reason.endswith("at head: its bucket stops")
    assert one.stop and one.reason.endswith("gain under 2%: stop")


def _pass(ratios: dict[str, tuple[str, float, bool]]) -> dict:
    """A final pass: shape -> (bucket, the candidate's ratio to the incumbent, held back)."""
    return typed({n: {"bucket": b, "held_back": held, "floor_ms": None,
                      "variants": {"candidate-0": {"median_ms": r},
                                   "incumbent": {"median_ms": 1.0}},
                      "vs_incumbent": _versus(r)} for n, (b, r, held) in ratios.items()})


TABLE = {"big": {"tile": 64}, "small": {"tile": 16}}


def test_a_dispatch_that_loses_in_one_bucket_is_kept_in_the_other():
    from perfloop.plan import weigh

    summary = _pass({"head": ("big", 0.7, False), "held:head": ("big", 0.75, True),
                     "guard": ("small", 0.9, False), "held:guard": ("small", 1.4, True)})
    v = weigh.verdict(summary, "candidate-0", "head", RULES.decision, dispatch_value=TABLE,
                    incumbent_knobs={})
    assert (v.status, v.dropped_buckets) == ("keep", ("small",)), v
    assert v.reason.startswith("kept at big, not at small (regression on held:guard")
    assert v.gain == pytest.approx(0.3)
    # the same loss in the only bucket it changes: reverted, as before
    only = weigh.verdict(summary, "candidate-0", "head", RULES.decision,
                       dispatch_value={"small": {"tile": 16}}, incumbent_knobs={})
    assert only.status == "revert" and not only.dropped_buckets
    # a bucket where no held-back shape was timed is left out the same way
    del summary["held:guard"]
    v = weigh.verdict(summary, "candidate-0", "head", RULES.decision, dispatch_value=TABLE,
                    incumbent_knobs={})
    assert (v.status, v.dropped_buckets) == ("keep", ("small",)), v
    # and a win in neither is no keep
    summary = _pass({"head": ("big", 1.3, False), "held:head": ("big", 0.9, True),
                     "guard": ("small", 1.3, False), "held:guard": ("small", 1.0, True)})
    v = weigh.verdict(summary, "candidate-0", "head", RULES.decision, dispatch_value=TABLE,
                    incumbent_knobs={})
    assert v.status == "revert"


def test_a_dispatch_kept_in_some_buckets_commits_and_names_those_only():
    from types import SimpleNamespace

    from perfloop.core import naming
    from perfloop.run import experiment

    incumbent = {"tile": 32, "dispatch": {"small": {"tile": 8}, "odd": {"tile": 4}}}
    chosen = {"tile": 32, "dispatch": {"big": {"tile": 64}, "small": {"tile": 16},
                                       "odd": {"tile": 4}}}
    variant = {"label": "candidate-0", "knobs": chosen}
    t = SimpleNamespace(incumbent_knobs=incumbent, best="candidate-0", candidates=[variant],
                        proposed=[variant], variants=[variant])
    kept = decide.Verdict("keep", "PASS", "kept at big", 0.3, dropped_buckets=("small",))
    assert experiment.committed_knobs(t, kept) == {
        "tile": 32, "dispatch": {"big": {"tile": 64}, "odd": {"tile": 4}, "small": {"tile": 8}}}
    whole = decide.Verdict("keep", "PASS", "all", 0.3)
    assert experiment.committed_knobs(t, whole) == chosen
    said = naming.dispatch_kept("tile=64 at big; tile=16 at small", ("small",))
    assert said == "tile=64 at big (not at small)"
    # its record's gains count in the buckets it was kept in only
    kept_at_big = step(1, {"head": 0.7, "guard": 0.7},
                       decision={"reason": "kept at big", "dropped_buckets": ["small"]})
    assert set(bucket_stops._gains(kept_at_big, {"big": "head", "small": "guard"},
                                   RULES.decision)) == {"big"}
