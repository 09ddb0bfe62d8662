"""The closed vocabularies of the record and of a run's state, each defined once.

Every value is the exact string perfloop has always written (StrEnum members compare equal to
it), so records and state files written before these types existed load unchanged. Code that
branches on one of them names the member, never the words.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# The labels of the two variants every timing holds beside the candidates: the incumbent, and
# the incumbent again in its own build (the A/A control, whose difference is the noise).
INCUMBENT, CONTROL = "incumbent", "incumbent-again"
# The knob of an optimization whose values are {knob: value} patches (several knobs at once).
MULTI = "*"


class Kind(StrEnum):
    """What made an experiment (a confirmation is a record line, but no experiment)."""

    BASELINE = "baseline"
    PLAYBOOK = "playbook"
    AGENT = "agent"
    CONFIRMATION = "confirmation"


class Status(StrEnum):
    """An experiment's fate: the table's status column."""

    KEEP = "keep"
    REVERT = "revert"
    CRASH = "crash"


class Correctness(StrEnum):
    """The table's correctness column."""

    PASS = "PASS"
    FAIL = "FAIL"
    NOT_JUDGED = ""   # the judge never ran (decide's verdict on a crash before it)


class Outcome(StrEnum):
    """One candidate's outcome inside an experiment (the record's `outcomes`); the timing
    child reports a dropped candidate's `kind` in the same words."""

    OK = "ok"
    FAIL = "fail"
    CRASH = "crash"
    SLOW = "slow"           # dropped at a cliff: its warm-up far slower than the incumbent's
    SCREENED = "screened"   # correct as far as it was timed, but not among the fastest few


class StopReason(StrEnum):
    """Why a run stopped: one member per rule, plus the two pauses a run goes on from."""

    NO_IMPROVEMENT = "no-improvement"     # rules.stop.no_improvement_streak
    MINOR_GAIN = "minor-gain"             # a kept gain under rules.decision.minor_gain
    MAX_ITERATIONS = "max-iterations"     # rules.stop.max_iterations
    TIME_BUDGET = "time-budget"           # rules.stop.time_budget_s
    ROOFLINE = "roofline"                 # the incumbent at the physical floor everywhere
    NOTHING_LEFT = "nothing-left"         # no suggestion left to try
    BASELINE_FAILED = "baseline-failed"   # iteration 0 did not pass
    ITERATIONS_ASKED = "iterations-asked"  # `run --max-iterations N` ran its N: --resume goes on
    INTERRUPTED = "interrupted"           # Ctrl-C: --resume goes on
    UNRECOGNISED = "unrecognised"         # an older state file's stop in words not known here

    @property
    def final(self) -> bool:
        """Whether the run is over; after the others, `run --resume` goes on."""
        return self not in (StopReason.ITERATIONS_ASKED, StopReason.INTERRUPTED)


@dataclass(frozen=True)
class Stop:
    """Why a run stopped, and the line that says so to a person (numbers included)."""

    reason: StopReason
    detail: str
    never_tried: tuple[str, ...] = ()   # a time-budget stop: the catalog entries left untried

    def __str__(self) -> str:
        return self.detail
