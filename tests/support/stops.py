"""The stops a run can end on, and the words each rule wrote for them before StopReason."""

from perfloop.core.vocab import StopReason

FINAL = [r for r in StopReason if r.final]
# the words each rule wrote into a schema-2 state file
OLD_WORDS = {
    StopReason.MAX_ITERATIONS: "reached the iteration limit (25)",
    StopReason.ROOFLINE: "at the roofline: every shape runs at 97% of its physical floor or "
                         "more (least: head at 98.1%); nothing measurable is left",
    StopReason.NO_IMPROVEMENT: "no improvement in 2 consecutive iterations",
    StopReason.NOTHING_LEFT: "nothing left to try",
    StopReason.BASELINE_FAILED: "the baseline did not pass (correctness failed (a)); fix the "
                                "kernel first",
    StopReason.MINOR_GAIN: "1.20% faster: kept, gain under 2%: stop",
    StopReason.UNRECOGNISED: "stopped by words no rule ever wrote",
}
