"""Each candidate's outcome in an experiment (label -> (Outcome, why)), from what its judge
and its timer reported, and voided where a process imported files the run did not pin."""

from __future__ import annotations

from perfloop.core.vocab import CONTROL, INCUMBENT, Kind, Outcome
from perfloop.measure import judge, phases
from perfloop.store import gitops, pins
from perfloop.store.session import Session


def void_if_foreign(s: Session, outcome: dict, imported: set, allowed: list, why: str) -> None:
    """A verdict reached by a process that imported repository files the run did not pin
    (besides the candidate's folder and perfloop's exports) counts for nothing: all fail."""
    foreign = pins.unpinned_imports(s.repo, s.root, sorted(imported), s.state.base_commit,
                                     allowed)
    if foreign:
        for label in outcome:
            outcome[label] = (Outcome.FAIL, why.format(gitops.listing(foreign)))


def judged_outcome(label: str, judged: judge.JudgeResult) -> tuple[str, str]:
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


def apply_timing(outcome: dict, timing: phases.Timing, kind: Kind) -> None:
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
