"""Each candidate's outcome in an experiment (label -> (Outcome, why)), from what its judge
and its timer reported, and voided where a process imported files the run did not pin."""

from __future__ import annotations

from perfloop.core import dispatch_table
from perfloop.core.vocab import CONTROL, INCUMBENT, Kind, Outcome


def void(outcome: dict, foreign: list[str], why: str) -> None:
    """A verdict reached by a process that imported files the run did not pin (`foreign`,
    named in `why`'s {}) counts for nothing: all fail."""
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        for label in outcome:
            outcome[label] = (Outcome.FAIL, why.format(shown))


def judged_outcome(label: str, judged) -> tuple[str, str]:
    """From a perfloop.measure.judge.JudgeResult."""
    if label in judged.crashed:
        return Outcome.CRASH, judged.crashed[label]
    if label in judged.doubted:
        return Outcome.FAIL, f"correctness failed: {judged.doubted[label]}"
    if not judged.passed.get(label):
        failed = [c for c in judged.cases.get(label, []) if not c["passed"]]
        said = [c["case"] for c in failed[:3]]
        if failed and failed[0].get("error"):
            said[0] += f": {failed[0]['error']}"
        return Outcome.FAIL, ("correctness failed" + (
            f" ({', '.join(said)})" if failed else " (no case was reported as passed)"))
    return Outcome.OK, ""


def dropped(why: dict) -> Outcome:
    """A candidate the timing child dropped: failed, fell off a cliff, else crashed."""
    return Outcome(why["kind"]) if why["kind"] in (Outcome.FAIL, Outcome.SLOW) else Outcome.CRASH


def apply_timing(outcome: dict, timing, kind: Kind) -> None:
    """From a perfloop.measure.phases.Timing."""
    for label, why in timing.excluded.items():
        outcome[label] = (dropped(why), why["reason"])
    for label, why in (timing.raw.get("failed") or {}).items():
        if label in outcome:
            outcome[label] = (dropped(why), why["reason"])
        elif label in (INCUMBENT, CONTROL) and kind != Kind.BASELINE:
            timing.crashed = timing.crashed or f"the incumbent, timed again: {why['reason']}"
    if kind == Kind.BASELINE and INCUMBENT in (timing.raw.get("failed") or {}):
        why = timing.raw["failed"][INCUMBENT]
        outcome[INCUMBENT] = (Outcome.FAIL if why["kind"] == Outcome.FAIL else Outcome.CRASH,
                              why["reason"])


def finalist_variants(candidates: list[dict], finalists: dict,
                      judged_before: dict | None = None) -> dict[str, list[dict]]:
    """The judge's extra variants: per candidate whose launches tune in unmeasured buckets
    (all but a finalist's own, perfloop.contract.dispatch), each finalist kernel.toml declares as a
    variant of its own ({name: patch}, perfloop.core.dispatch_table.declared). A launch may
    run it wherever it is fastest, and the judge's cases only check each case's winner.
    Left out where it runs the knobs it ran under `judged_before` (the incumbent's, judged
    with the same kernel code when it was a candidate)."""
    def knobs(c, name):
        return dispatch_table.as_itself(dispatch_table.config(c["knobs"], name, finalists))

    before = judged_before if judged_before and dispatch_table.may_route(judged_before) else None
    out = {}
    for c in candidates:
        if not finalists or not dispatch_table.may_route(c["knobs"]):
            continue
        out[c["label"]] = [
            {**c, "label": f"{c['label']}-finalist{i}", "knobs": knobs(c, name),
             "finalist": name}
            for i, name in enumerate(finalists, 1)
            if before is None or knobs(c, name) != knobs({"knobs": before}, name)]
    return {label: vs for label, vs in out.items() if vs}


def with_finalists(outcome: dict, extras: dict[str, list[dict]], judged) -> dict:
    """Each candidate's outcome, failed or crashed where one of its declared finalists was."""
    out = dict(outcome)
    for label, variants in extras.items():
        if out.get(label, (Outcome.OK,))[0] != Outcome.OK:
            continue
        for v in variants:
            kind, why = judged_outcome(v["label"], judged)
            if kind != Outcome.OK:
                out[label] = (kind, f"declared {v['finalist']}: {why}")
                break
    return out
