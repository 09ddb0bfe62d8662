"""An experiment's verdict from what its judge and timer found: pure functions over the
outcomes of its candidates and the timing summary of its final pass (perfloop.measure.phases
summarize_pass, typed as the record holds it: perfloop.store.records.ShapeSummary), decided by
the playbook's rules (perfloop.plan.decide)."""

from __future__ import annotations

from dataclasses import replace

from perfloop.core import dispatch_table as dispatch
from perfloop.contract.playbook import DecisionRules, thaw
from perfloop.core.vocab import CONTROL, INCUMBENT, Correctness, Kind, Outcome, Status
from perfloop.plan import decide
from perfloop.store.records import ShapeSummary

Summary = dict[str, ShapeSummary]   # a timing pass: shape name -> its summary


def below_floor(summary: Summary, label: str, tolerance: float) -> tuple[str, ...]:
    """The shapes where `label` ran faster than the physical floor allows."""
    return tuple(name for name, shape in summary.items()
                 if shape.floor_ms and shape.variants[label].median_ms
                 < shape.floor_ms * (1 - tolerance))


def untimed(kind: Kind, outcome: dict, timing_crashed: str, judged_ok: bool) -> decide.Verdict:
    """The verdict when nothing was timed to the end: the timing crashed, or every candidate
    failed, fell off a cliff or crashed. `outcome`: label -> (Outcome, why)."""
    if timing_crashed:
        return decide.Verdict(Status.CRASH, Correctness.PASS, timing_crashed)
    failed = [(label, why) for label, (o, why) in outcome.items() if o == Outcome.FAIL]
    if failed:
        reason = "; ".join(f"{label}: {why}" for label, why in failed[:3])
        if kind == Kind.BASELINE or len(outcome) == 1:
            reason = failed[0][1]
        return decide.Verdict(Status.REVERT, Correctness.FAIL, f"{reason}: reverted at once"
                              if kind != Kind.BASELINE else reason)
    slow = [why for o, why in outcome.values() if o == Outcome.SLOW]
    if slow and all(o in (Outcome.SLOW, Outcome.CRASH) for o, _ in outcome.values()):
        return decide.Verdict(Status.REVERT, Correctness.PASS, "every candidate fell off a "
                              f"cliff or crashed ({slow[0]})" if len(outcome) > 1 else slow[0])
    # every candidate crashed: in the judge (correctness unknown: FAIL) or while timed (PASS)
    crashed = [why for o, why in outcome.values() if o == Outcome.CRASH]
    return decide.Verdict(Status.CRASH, Correctness.PASS if judged_ok else Correctness.FAIL,
                          crashed[0] if crashed else "nothing was timed")


def baseline(summary: Summary, headline: str, rules: DecisionRules,
             max_control_gap: float = 0.05) -> decide.Verdict:
    """The baseline is kept unless it measured faster than the physical floor, or its A/A
    control (the same code timed twice) differs by more than `max_control_gap` at the
    headline: then no gain of the run could be told from the noise."""
    below = below_floor(summary, INCUMBENT, rules.floor_tolerance)
    if below:
        return decide.Verdict(Status.REVERT, Correctness.PASS, "baseline measured faster than "
                              f"the physical floor on {', '.join(below)}: the measurement is "
                              "broken")
    aa = summary[headline].vs_incumbent[CONTROL]
    if abs(aa.ratio - 1) > max_control_gap:
        return decide.Verdict(Status.REVERT, Correctness.PASS, (
            f"the same code timed twice differs by {100 * abs(aa.ratio - 1):.1f}% at the "
            f"headline shape (allowed: {100 * max_control_gap:g}%, the run's max_control_gap): "
            "this machine is too busy to time on, or the kernel's time is not its own (other "
            "programs running, a clock that measures nothing); close them and start again, "
            "or allow a larger gap for this kernel (kernel.toml's [rules] max_control_gap, or "
            "--max-control-gap when a run starts)"))
    return decide.Verdict(Status.KEEP, Correctness.PASS, "baseline; the same code timed twice "
                          f"differs by {100 * abs(aa.ratio - 1):.2f}% (noise "
                          f"{100 * summary[headline].noise:.2f}%) at the headline shape")


def verdict(summary: Summary, best: str, headline: str, rules: DecisionRules,
          dispatch_value=None, incumbent_knobs: dict | None = None) -> decide.Verdict:
    """The playbook's verdict on the fastest candidate `best` (its timings from the final
    pass). A change of the dispatch table (`dispatch_value`: the chosen table) is decided at
    the headline if its bucket changed, else where it gained most, and only where a held-back
    shape was timed. Its buckets are independent (each shape runs its own bucket's knobs), so
    one that regresses, or had no held-back shape timed, is left out and the change is
    decided again in the others: a loss in one bucket never throws away a win in another."""
    several = len(_benchmark_buckets(summary)) > 1
    if dispatch_value is None:
        return _decide(summary, best, headline, rules, None, several)
    changed = dispatch.changed_buckets(dispatch.table(incumbent_knobs or {}),
                                       thaw(dispatch_value))
    whole = _decide(summary, best, headline, rules, changed, several)
    if whole.status != Status.REVERT or whole.correctness != Correctness.PASS:
        return whole
    if any(sh.tuned and decide.regression(sh.vs_incumbent[best].comparison,
                                          rules.regression_tolerance)
           for sh in summary.values()):
        return whole   # (a tuned shape may run any bucket's knobs: no one bucket to drop)
    dropped = losing_buckets(summary, best, changed, rules)
    kept = [b for b in changed if b not in dropped]
    if not dropped or not kept or below_floor(summary, best, rules.floor_tolerance):
        return whole
    rest = {n: sh for n, sh in summary.items() if sh.bucket not in dropped}
    part = _decide(rest, best, headline, rules, kept, several)
    if part.status != Status.KEEP:
        return whole
    return replace(part, dropped_buckets=tuple(dropped), reason=(
        f"kept at {', '.join(kept)}, not at {', '.join(dropped)} ({whole.reason}): "
        f"{part.reason}"))


def losing_buckets(summary: Summary, best: str, changed: list[str],
                   rules: DecisionRules) -> list[str]:
    """The changed buckets where `best` regressed at some shape, or no held-back shape was
    timed."""
    unchecked = set(ungeneralized(summary, changed))
    slower = {sh.bucket for sh in summary.values()
              if decide.regression(sh.vs_incumbent[best].comparison, rules.regression_tolerance)}
    return [b for b in changed if b in unchecked or b in slower]


def _decide(summary: Summary, best: str, headline: str, rules: DecisionRules,
            changed: list[str] | None, several: bool) -> decide.Verdict:
    unchecked: tuple = ()
    if changed is not None:
        headline = dispatch_focus(summary, changed, headline, best) or ""
        unchecked = ungeneralized(summary, changed)
    comparisons = {name: shape.vs_incumbent[best].comparison for name, shape in summary.items()}
    return decide.decide(decide.Evidence(
        correct=True, comparisons=comparisons, headline=headline,
        below_floor=below_floor(summary, best, rules.floor_tolerance),
        ungeneralized=unchecked, per_bucket=several), rules)


def dispatch_focus(summary: Summary, changed: list[str], headline: str,
                   label: str) -> str | None:
    """The shape whose gain decides a dispatch: the headline when its bucket changed, else the
    benchmark shape of a changed bucket that gained most."""
    hit = [n for n, sh in summary.items() if sh.bucket in changed and not sh.held_back]
    if headline in hit:
        return headline
    if not hit:
        return None
    return min(hit, key=lambda n: summary[n].vs_incumbent[label].ratio)


def ungeneralized(summary: Summary, changed: list[str]) -> tuple[str, ...]:
    """Changed buckets in which no held-back shape was timed (a tuned one, which may run any
    bucket's knobs, checks none)."""
    held = {sh.bucket for sh in summary.values() if sh.held_back and not sh.tuned}
    return tuple(b for b in changed if b not in held)


def _benchmark_buckets(summary: Summary) -> set:
    """The buckets of the benchmark's own shapes in a timing pass (held-back ones left out; the
    record's, over experiments, are perfloop.plan.search.benchmark_buckets)."""
    return {shape.bucket for shape in summary.values()
            if shape.bucket is not None and not shape.held_back}
