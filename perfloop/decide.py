"""The playbook's decision rules as pure functions over plain records.

Nothing here touches git, processes or the GPU, so every rule is tested in microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfloop.playbook import Decision as DecisionRules
from perfloop.playbook import Optimization, Stop
from perfloop.stats import Comparison

KEEP, REVERT, CRASH = "keep", "revert", "crash"


@dataclass(frozen=True)
class Outcome:
    """What one experiment measured, as the decision needs it."""

    crashed: bool = False
    correct: bool | None = None          # None when the judge never ran
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    headline: str = ""
    below_floor: tuple[str, ...] = ()     # shapes measured faster than physically possible


@dataclass(frozen=True)
class Verdict:
    status: str             # keep | revert | crash
    correctness: str        # PASS | FAIL | "" when never judged
    reason: str
    gain: float | None = None
    lower_family: bool = False
    stop: bool = False      # the rule itself says stop (an accepted gain under minor_gain)
    improved: bool = False  # counts as an improvement for the no-improvement streak


def _real_gain(c: Comparison, min_gain: float = 0.0) -> bool:
    """A gain whose interval excludes zero and which exceeds the incumbent's own noise and the
    smallest gain the rules count."""
    return c.ci_high < 1.0 and c.gain > max(c.noise, min_gain)


def _regression(c: Comparison, tolerance: float) -> bool:
    return c.ci_low > 1.0 and (c.ratio - 1.0) > max(tolerance, c.noise)


def decide(outcome: Outcome, rules: DecisionRules) -> Verdict:
    if outcome.crashed:
        return Verdict(CRASH, "", "the experiment crashed or ran past its time limit")
    if not outcome.correct:
        return Verdict(REVERT, "FAIL", "correctness failed: reverted at once")
    if outcome.below_floor:
        return Verdict(REVERT, "PASS", "faster than the physical floor on "
                       f"{', '.join(outcome.below_floor)}: a broken measurement, not kept")
    slower = [name for name, c in outcome.comparisons.items()
              if _regression(c, rules.regression_tolerance)]
    head = outcome.comparisons[outcome.headline]
    if slower:
        worst = max(outcome.comparisons[s].ratio for s in slower)
        return Verdict(REVERT, "PASS", f"regression on {', '.join(slower)} "
                       f"(up to {100 * (worst - 1):.1f}% slower)", gain=head.gain)
    if not _real_gain(head, rules.min_gain):
        return Verdict(REVERT, "PASS", f"no improvement that the measurement can tell from "
                       f"noise ({100 * head.gain:+.2f}%, 95% CI of ratio "
                       f"[{head.ci_low:.4f}, {head.ci_high:.4f}], noise "
                       f"{100 * head.noise:.2f}%, smallest gain counted "
                       f"{100 * rules.min_gain:.2f}%)", gain=head.gain)
    pct = f"{100 * head.gain:.2f}% faster"
    if head.gain >= rules.keep_gain:
        return Verdict(KEEP, "PASS", f"{pct}: new incumbent", head.gain, improved=True)
    if head.gain >= rules.minor_gain:
        return Verdict(KEEP, "PASS", f"{pct}: kept, family priority lowered", head.gain,
                       lower_family=True, improved=True)
    return Verdict(KEEP, "PASS", f"{pct}: kept, gain under {100 * rules.minor_gain:g}%: stop",
                   head.gain, stop=True, improved=True)


def stop_reason(iteration: int, verdicts: list[Verdict], rules: Stop,
                remaining: int) -> str | None:
    """Why the loop stops after `iteration` (None: go on). `verdicts` excludes the baseline."""
    if verdicts and verdicts[-1].stop:
        return verdicts[-1].reason
    streak = 0
    for verdict in reversed(verdicts):
        if verdict.improved:
            break
        streak += 1
    if streak >= rules.no_improvement_streak:
        return f"no improvement in {streak} consecutive iterations"
    if iteration >= rules.max_iterations:
        return f"reached the iteration limit ({rules.max_iterations})"
    if remaining == 0:
        return "nothing left to try"
    return None


@dataclass(frozen=True)
class Suggestion:
    optimization: Optimization
    candidates: tuple
    rank: int
    reason: str


def candidates_for(opt: Optimization, knobs: dict, overrides: dict) -> tuple:
    """The values an iteration of `opt` would measure: every candidate but the current one."""
    values = overrides.get(opt.knob, opt.values)
    current = knobs.get(opt.knob)
    return tuple(v for v in values if v != current)


def rank(optimizations: tuple[Optimization, ...], kernel_class: str, knobs: dict,
         overrides: dict, tried: set[str], penalties: dict[str, int],
         tags: tuple = ()) -> list[Suggestion]:
    """Untried optimizations that apply to this kernel, best first: by the rank for one of
    the kernel's tags where the entry gives one, else by the rank for its class."""
    out = []
    for order, opt in enumerate(optimizations):
        tagged = any(t in opt.by_tag for t in tags)
        if opt.id in tried or opt.knob not in knobs or not (
                tagged or kernel_class in opt.applies_to):
            continue
        values = candidates_for(opt, knobs, overrides)
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


def classify(bytes_moved: float, flops: float) -> tuple[str, float]:
    """Seed 002's classes by arithmetic intensity (FLOP per byte)."""
    intensity = flops / bytes_moved if bytes_moved else float("inf")
    if intensity < 10:
        return "memory-bound", intensity
    if intensity <= 50:
        return "balanced", intensity
    return "compute-bound", intensity
