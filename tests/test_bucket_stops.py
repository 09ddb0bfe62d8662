"""The stop rules per bucket (perfloop.plan.bucket_stops): a run whose benchmark spans several
buckets stops on "no improvement" or "gain under 2%" only when every bucket has stopped."""

from __future__ import annotations

from perfloop.core.playbook import SHIPPED, load
from perfloop.core.vocab import StopReason
from perfloop.plan import bucket_stops, decide

RULES = load(SHIPPED).rules
SHAPES = {"head": "big", "tail": "big", "guard": "small"}


def _versus(ratio: float) -> dict:
    """The final pass's comparison of the chosen candidate, as the verdict weighed it."""
    return {"candidate-0": {"ratio": ratio, "ci_low": ratio - 0.002, "ci_high": ratio + 0.002,
                            "noise": 0.001}}


def baseline() -> dict:
    shapes = {n: {"bucket": b} for n, b in SHAPES.items()}
    shapes["held:head"] = {"bucket": "big", "held_back": True}
    return {"kind": "baseline", "iteration": 0, "status": "keep", "timing": {"shapes": shapes}}


def step(i: int, ratios: dict[str, float], status: str = "keep",
         optimization: str = "tile_shape") -> dict:
    """An experiment whose candidate ran at `ratios` of the incumbent's time per shape."""
    shapes = {n: {"bucket": b, "vs_incumbent": _versus(ratios.get(n, 1.0))}
              for n, b in SHAPES.items()}
    return {"kind": "playbook", "iteration": i, "optimization": optimization, "status": status,
            "timing": {"chosen": "candidate-0" if status == "keep" else None, "shapes": shapes}}


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
    recs = [{**baseline(), "timing": {"shapes": {"head": {"bucket": "all"}}}}]
    assert bucket_stops.stop_args(recs, "head", RULES.decision, 2) == {}


def test_a_bucket_counts_the_final_pass_its_verdict_weighed_not_the_selection():
    # (the README kernel's tile step was kept at a real gain in its final pass while its noisy
    # selection pass could not tell: the bucket must see what the verdict saw)
    record = step(1, {"head": 0.9, "guard": 0.9})
    record["timing"]["selection"] = {n: {"bucket": b, "vs_incumbent": _versus(1.0)}
                                     for n, b in SHAPES.items()}
    assert stops([baseline(), record]) == {"big": None, "small": None}


def test_a_verdicts_minor_gain_names_its_bucket_when_the_benchmark_spans_several():
    from perfloop.plan import weigh

    def summary(buckets: dict[str, str]) -> dict:
        return {n: {"bucket": b, "held_back": False, "floor_ms": None,
                    "variants": {"candidate-0": {"median_ms": 0.99}},
                    "vs_incumbent": _versus(0.99)} for n, b in buckets.items()}

    several = weigh.timed(summary(SHAPES), "candidate-0", "head", RULES.decision)
    one = weigh.timed(summary({"head": "big", "tail": "big"}), "candidate-0", "head",
                      RULES.decision)
    assert several.stop and several.reason.endswith("at head: its bucket stops")
    assert one.stop and one.reason.endswith("gain under 2%: stop")
