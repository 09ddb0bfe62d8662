"""The playbook's decision rules as pure functions over what an experiment found (Evidence) and
the verdicts before it: which shapes of a timing pass count is asked where the pass is read
(perfloop.plan.weigh for a verdict, perfloop.plan.search for a dispatch).

Nothing here touches git, processes or the GPU, so every rule is tested in microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from perfloop.core import dispatch_table, vocab
from perfloop.contract.playbook import Classes, DecisionRules, Optimization, StopRules
from perfloop.core.stats import Comparison, real_gain  # (the keep rule, the timer's too)
from perfloop.core.vocab import Correctness, Status, StopReason


@dataclass(frozen=True)
class Evidence:
    """What one experiment measured, as the decision needs it."""

    crashed: bool = False
    correct: bool | None = None          # None when the judge never ran
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    headline: str = ""                    # the shape whose gain decides
    below_floor: tuple[str, ...] = ()     # shapes measured faster than physically possible
    ungeneralized: tuple[str, ...] = ()   # dispatch: changed buckets no held-back shape checked
    per_bucket: bool = False              # the benchmark spans buckets, each with its own stops


@dataclass(frozen=True)
class Verdict:
    status: Status
    correctness: Correctness
    reason: str
    gain: float | None = None
    lower_family: bool = False
    stop: bool = False      # the rule itself says stop (an accepted gain under minor_gain)
    improved: bool = False  # counts as an improvement for the no-improvement streak
    # a dispatch change kept in some of the buckets it changes: those it is not kept in
    dropped_buckets: tuple[str, ...] = ()

    def __post_init__(self):  # a verdict read back from a record holds plain strings
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "correctness", Correctness(self.correctness))
        object.__setattr__(self, "dropped_buckets", tuple(self.dropped_buckets))


def regression(c: Comparison, tolerance: float) -> bool:
    return c.ci_low > 1.0 and (c.ratio - 1.0) > max(tolerance, c.noise)


def decide(outcome: Evidence, rules: DecisionRules) -> Verdict:
    if outcome.crashed:
        return Verdict(Status.CRASH, Correctness.NOT_JUDGED,
                       "the experiment crashed or ran past its time limit")
    if not outcome.correct:
        return Verdict(Status.REVERT, Correctness.FAIL, "correctness failed: reverted at once")
    if outcome.below_floor:
        return Verdict(Status.REVERT, Correctness.PASS, "faster than the physical floor on "
                       f"{', '.join(outcome.below_floor)}: a broken measurement, not kept")
    if outcome.headline not in outcome.comparisons:
        return Verdict(Status.REVERT, Correctness.PASS,
                       "the change reaches none of the benchmark's shapes")
    slower = [name for name, c in outcome.comparisons.items()
              if regression(c, rules.regression_tolerance)]
    head = outcome.comparisons[outcome.headline]
    if slower:
        worst = max(outcome.comparisons[s].ratio for s in slower)
        return Verdict(Status.REVERT, Correctness.PASS, f"regression on {', '.join(slower)} "
                       f"(up to {100 * (worst - 1):.1f}% slower)", gain=head.gain)
    if not real_gain(head, rules.min_gain):
        return Verdict(Status.REVERT, Correctness.PASS, "no improvement that the measurement "
                       f"can tell from noise ({100 * head.gain:+.2f}%, 95% CI of ratio "
                       f"[{head.ci_low:.4f}, {head.ci_high:.4f}], noise "
                       f"{100 * head.noise:.2f}%, smallest gain counted "
                       f"{100 * rules.min_gain:.2f}%)", gain=head.gain)
    if outcome.ungeneralized:  # (after the gain: the timer times them only for a gain)
        return Verdict(Status.REVERT, Correctness.PASS, "no held-back shape was timed in bucket "
                       f"{', '.join(outcome.ungeneralized)}: the choice there may fit only "
                       "the benchmark's shape", gain=head.gain)
    pct = f"{100 * head.gain:.2f}% faster"
    if head.gain >= rules.keep_gain:
        return Verdict(Status.KEEP, Correctness.PASS, f"{pct}: new incumbent", head.gain,
                       improved=True)
    if head.gain >= rules.minor_gain:
        return Verdict(Status.KEEP, Correctness.PASS, f"{pct}: kept, family priority lowered",
                       head.gain, lower_family=True, improved=True)
    minor = f"{pct}: kept, gain under {100 * rules.minor_gain:g}%"
    return Verdict(Status.KEEP, Correctness.PASS,
                   f"{minor} at {outcome.headline}: its bucket stops" if outcome.per_bucket
                   else f"{minor}: stop", head.gain, stop=True, improved=True)


def stop_reason(iteration: int, verdicts: list[Verdict], rules: StopRules, remaining: int,
                searched: list[bool] | None = None, searches: int = 0,
                floor_shares: dict[str, float] | None = None,
                spent_s: tuple[float, ...] = (), next_s: float | None = None,
                per_bucket: bool = False, buckets_stopped: vocab.Stop | None = None
                ) -> vocab.Stop | None:
    """Why the loop stops after `iteration` (None: go on). `verdicts` excludes the baseline;
    `searched` flags the verdicts of search experiments (dispatch, joint), which close a run:
    while `searches` of them are on offer, only the iteration limit and the roofline stop it.
    `floor_shares`: the incumbent's share of the physical floor per shape. `spent_s`: the
    wall time of each experiment so far, baseline included; `next_s`: the next one's estimate
    (perfloop.plan.budget; None: as long as the slowest so far; 0: there is none), where the
    experiments that fit the budget go first (suggest.suggestions). `per_bucket`: the benchmark
    spans several buckets, and "no improvement" and "gain under 2%" end the run only when every
    bucket has stopped: then `buckets_stopped` says so (perfloop.plan.bucket_stops)."""
    if iteration >= rules.max_iterations:
        return vocab.Stop(StopReason.MAX_ITERATIONS,
                          f"reached the iteration limit ({rules.max_iterations})")
    budget = rules.time_budget_s
    if budget and spent_s:
        ahead = max(spent_s) if next_s is None else next_s
        if ahead and sum(spent_s) + ahead > budget:  # (0: nothing next; other rules say so)
            return vocab.Stop(StopReason.TIME_BUDGET,
                              f"time budget: {sum(spent_s):.0f} s of experiments spent, and the "
                              f"next, estimated at {ahead:.0f} s, would pass the {budget:g} s "
                              "budget" + ("" if next_s is None else " (none on offer fits)"))
    share = rules.roofline_share
    if share and floor_shares and min(floor_shares.values()) >= share:
        worst = min(floor_shares, key=floor_shares.__getitem__)
        return vocab.Stop(StopReason.ROOFLINE, (
            f"at the roofline: every shape runs at {100 * share:g}% of its physical floor "
            f"or more (least: {worst} at {100 * floor_shares[worst]:.1f}%); nothing "
            "measurable is left"))
    if per_bucket:
        found = buckets_stopped
    else:
        found = _run_stop(verdicts, searched or [False] * len(verdicts), rules)
    if found is None and remaining == 0:
        found = NOTHING_LEFT
    return None if found and searches else found


def _run_stop(verdicts: list[Verdict], searched: list[bool], rules: StopRules) -> vocab.Stop | None:
    """The minor-gain and no-improvement rules over the whole run (one bucket)."""
    found = None
    stops = [i for i, v in enumerate(verdicts) if v.stop]
    if stops and all(searched[stops[-1] + 1:]):
        found = vocab.Stop(StopReason.MINOR_GAIN, verdicts[stops[-1]].reason)
    # A search experiment re-measures values already tried, so its revert says nothing about
    # the untried ideas: only catalog experiments count towards the streak (else a run stops
    # before the ideas that hold its gain are tried: kernels/rmsnorm/NOTES.md)
    streak = 0
    for verdict, search_ in reversed(list(zip(verdicts, searched))):
        if verdict.improved:
            break
        streak += not search_
    if found is None and streak >= rules.no_improvement_streak:
        found = vocab.Stop(StopReason.NO_IMPROVEMENT,
                           f"no improvement in {streak} consecutive iterations of the catalog")
    return found


NOTHING_LEFT = vocab.Stop(StopReason.NOTHING_LEFT, "nothing left to try")


@dataclass(frozen=True)
class Suggestion:
    optimization: Optimization
    candidates: tuple
    rank: int
    reason: str
    describe: str = ""   # what the experiment's row will say (search experiments)
    sampler: dict | None = None   # what chose a joint search's configs (search.JointPlan)


def step_knobs(opt: Optimization, knobs: dict, value) -> dict:
    """What a catalog step of `opt` at `value` runs: the value in the plain knobs and in every
    dispatch entry that sets its knob (for an entry of several knobs, each of them so). The
    planner, `step --value` and the experiment all read it here, so that what is offered is
    what runs."""
    if opt.knobs:
        return dispatch_table.patch_everywhere(knobs, value)
    return dispatch_table.set_everywhere(knobs, opt.knob, value)


def candidates_for(opt: Optimization, knobs: dict, overrides: dict, space=None) -> tuple:
    """The values an iteration of `opt` would measure: every candidate but those that build
    the incumbent's kernel in every bucket (a one-knob step runs its value in the dispatch
    entries that set its knob too: dispatch_table.set_everywhere; an entry of several knobs
    each of its knobs so: patch_everywhere), and, by the kernel's knob
    space (perfloop.contract.knobspace.Space), but those that build the same kernel or that its
    restrict() rules out in some bucket."""
    values = overrides.get(opt.key, opt.values)
    out = []
    for v in values:
        changed = step_knobs(opt, knobs, v)
        if space is None:
            fits = dispatch_table.moves_anywhere(knobs, changed)
        else:
            fits = space.moves_anywhere(knobs, changed) and space.why_not(changed) is None
        if fits:
            out.append(v)
    return tuple(out)


def rank(optimizations: tuple[Optimization, ...], kernel_class: str, knobs: dict,
         overrides: dict, tried: set[str], penalties: dict[str, int],
         tags: tuple = (), space=None) -> list[Suggestion]:
    """Untried optimizations that apply to this kernel, best first: by the rank for one of
    the kernel's tags where the entry gives one, else by the rank for its class."""
    out = []
    for order, opt in enumerate(optimizations):
        if opt.id in tried or not all(k in knobs for k in opt.moves) or not opt.offered_to(
                tags, kernel_class):
            continue
        values = candidates_for(opt, knobs, overrides, space)
        if not values:
            continue
        base, source = opt.rank_for(kernel_class, tags)
        penalty = penalties.get(opt.family, 0)
        reason = f"priority {base} for {source}"
        if penalty:
            reason += f", +{penalty} because family '{opt.family}' gained only a little"
        out.append((base + penalty, order, Suggestion(opt, values, base + penalty,
                                                       f"{reason}. {opt.why}")))
    out.sort(key=lambda item: item[:2])
    return [s for _, _, s in out]


class Classification(NamedTuple):
    name: str          # memory-bound | balanced | compute-bound
    intensity: float   # operations per byte: of the unit that decided, or of all units
    basis: str         # how the class was read, for the record


def classify(bytes_moved: float, flops, peaks: Mapping | None = None,
             bandwidth: float | None = None, bounds: Classes = Classes()) -> Classification:
    """Seed 002's classes by arithmetic intensity. `flops` maps execution units to operations
    (perfloop.contract.traffic; a number: bf16 tensor-core FLOPs). With the device's `peaks` ({unit:
    operations/s}) and `bandwidth` (bytes/s), the unit whose operations take longest decides:
    its intensity is compared with its ridge point, peak / bandwidth, at the multiples
    `bounds` gives. Without them (a CPU clock), all units' FLOPs per byte against seed 002's
    fixed bounds (10 and 50)."""
    by_unit = flops if isinstance(flops, Mapping) else {"tensor.bf16": flops}
    known = {u: n for u, n in by_unit.items() if n and (peaks or {}).get(u)}
    if known and bandwidth and bytes_moved:
        unit = max(known, key=lambda u: known[u] / peaks[u])
        intensity, ridge = known[unit] / bytes_moved, peaks[unit] / bandwidth
        ratio = intensity / ridge
        name = ("memory-bound" if ratio < bounds.memory_below else
                "balanced" if ratio <= bounds.compute_above else "compute-bound")
        return Classification(name, intensity, (
            f"{intensity:.4g} {unit} operations per byte, {ratio:.3g}x the device's ridge point "
            f"of {ridge:.4g} ({unit} peak / measured bandwidth); memory-bound under "
            f"{bounds.memory_below:g}x, compute-bound over {bounds.compute_above:g}x"))
    intensity = sum(by_unit.values()) / bytes_moved if bytes_moved else float("inf")
    low, high = bounds.fallback_memory_below, bounds.fallback_compute_above
    name = "memory-bound" if intensity < low else "balanced" if intensity <= high else "compute-bound"
    return Classification(name, intensity, (
        f"{intensity:.4g} FLOP per byte (all units) against the fixed bounds {low:g} and "
        f"{high:g}: no peak is known for this device's units (e.g. a kernel timed on the CPU)"))
