"""The seed's stop rules per bucket (issue: fast at the user's workload): a run whose benchmark
spans several buckets stops on "no improvement" or "gain under 2%" only when every bucket has
stopped by one of them, so a bucket still gaining keeps the run going though the headline's
has settled. Pure, over the record (perfloop.store.records.Experiment)."""

from __future__ import annotations

from dataclasses import dataclass

from perfloop.core.naming import SEARCH_IDS
from perfloop.contract.playbook import DecisionRules
from perfloop.core.vocab import Kind, Status, Stop, StopReason
from perfloop.plan import decide
from perfloop.store.records import Experiment


@dataclass(frozen=True)
class BucketStop:
    reason: StopReason     # MINOR_GAIN or NO_IMPROVEMENT
    detail: str


def focus_shapes(recs: list[Experiment], headline: str) -> dict[str, str]:
    """{bucket: the benchmark shape whose gain decides there}: the headline in its bucket, else
    the bucket's first benchmark shape in the baseline's order. (search.benchmark_buckets and
    headline_bucket say as much, a layer above this one: planner imports it.)"""
    base = next((r for r in recs if r.kind == Kind.BASELINE), None)
    shapes = base.timing.shapes if base and base.timing else {}
    out: dict[str, str] = {}
    for name, shape in shapes.items():
        bucket = shape.bucket
        if bucket is None or shape.held_back:
            continue
        if name == headline:
            out[bucket] = name
        else:
            out.setdefault(bucket, name)
    return out


def _gains(record: Experiment, focus: dict[str, str], rules: DecisionRules) -> dict[str, float]:
    """{bucket: gain} where this kept experiment's chosen candidate beat the incumbent at the
    bucket's focus shape by a gain the rules count, in the final pass its verdict weighed."""
    timing = record.timing
    chosen = timing.chosen if timing else None
    if record.status != Status.KEEP or timing is None or chosen is None:
        return {}
    out = {}
    dropped = record.decision.get("dropped_buckets") or ()
    for bucket, name in focus.items():
        if bucket in dropped:  # not kept there: what runs there is the incumbent's
            continue
        shape = timing.shapes.get(name)
        if shape is None or chosen not in shape.vs_incumbent:
            continue
        c = shape.vs_incumbent[chosen].comparison
        if decide.real_gain(c, rules.min_gain):
            out[bucket] = c.gain
    return out


def bucket_stops(recs: list[Experiment], headline: str, rules: DecisionRules,
                 streak_limit: int) -> dict[str, BucketStop | None]:
    """{bucket: why it has stopped, None while it goes on}, for every bucket of the benchmark.
    A catalog experiment that gains nothing in a bucket adds to its streak (searches re-measure
    values already tried, as in decide.stop_reason); a gain under the minor gain stops it, a
    larger one sets it going again."""
    return _stops(recs, focus_shapes(recs, headline), rules, streak_limit)


def _stops(recs: list[Experiment], focus: dict[str, str], rules: DecisionRules,
           streak_limit: int) -> dict[str, BucketStop | None]:
    streak = dict.fromkeys(focus, 0)
    minor: dict[str, str | None] = dict.fromkeys(focus)
    for record in recs:
        if record.kind == Kind.BASELINE:
            continue
        won = _gains(record, focus, rules)
        for bucket in focus:
            if bucket in won:
                streak[bucket] = 0
                small = won[bucket] < rules.minor_gain
                minor[bucket] = (f"{100 * won[bucket]:.2f}% faster in iteration "
                                 f"{record.iteration}, under {100 * rules.minor_gain:g}%"
                                 if small else None)
            elif record.optimization not in SEARCH_IDS:
                streak[bucket] += 1
    out: dict[str, BucketStop | None] = {}
    for bucket in focus:
        if minor[bucket]:
            out[bucket] = BucketStop(StopReason.MINOR_GAIN, minor[bucket])
        elif streak[bucket] >= streak_limit:
            out[bucket] = BucketStop(StopReason.NO_IMPROVEMENT,
                                     f"no improvement in {streak[bucket]} catalog iterations")
        else:
            out[bucket] = None
    return out


def stop_args(recs: list[Experiment], headline: str, rules: DecisionRules,
              streak_limit: int) -> dict:
    """decide.stop_reason's per-bucket arguments: whether the benchmark spans several buckets,
    and, when every one of them has stopped, the run's Stop (with the headline bucket's
    reason, naming each bucket's)."""
    focus = focus_shapes(recs, headline)
    stops = _stops(recs, focus, rules, streak_limit)
    if len(stops) < 2:
        return {}
    if any(s is None for s in stops.values()):
        return {"per_bucket": True}
    lead = next((stops[b] for b, name in focus.items() if name == headline),
                next(iter(stops.values())))
    said = "; ".join(f"{b}: {s.detail}" for b, s in stops.items())
    return {"per_bucket": True,
            "buckets_stopped": Stop(lead.reason, f"every bucket has stopped ({said})")}
