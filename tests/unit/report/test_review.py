"""The pure functions `perfloop report` is made of (perfloop.report.review): the knobs each
experiment changed, and the counts of changes."""

from perfloop.report import review
from perfloop.store import records


def test_knob_changes_name_each_knob_and_each_dispatched_bucket():
    before = {"tile": [1, 1024], "occupancy": None, "fast_math": False}
    assert review.knob_changes(before, {**before, "fast_math": True}) == [
        {"knob": "fast_math", "bucket": None, "old": False, "new": True}]
    joint = review.knob_changes(before, {**before, "tile": [2, 1024], "occupancy": 4})
    assert [(c["knob"], c["old"], c["new"]) for c in joint] == [("occupancy", None, 4),
                                                               ("tile", (1, 1024), (2, 1024))]
    # a bucket's change is against what ran there before: the plain value, then its entry
    one = {**before, "dispatch": {"big": {"tile": [1, 2048]}}}
    assert review.knob_changes(before, one) == [
        {"knob": "tile", "bucket": "big", "old": (1, 1024), "new": (1, 2048)}]
    two = {**before, "dispatch": {"big": {"tile": [4, 1024]}, "small": {"occupancy": 2}}}
    shown = [review.show_change(c) for c in review.knob_changes(one, two)]
    assert shown == ["[big] tile: 1x2048 -> 4x1024", "[small] occupancy: None -> 2"]
    assert review.knob_changes(two, two) == []


def _experiment(iteration: int, status: str, correctness: str) -> records.Experiment:
    return records.Experiment.from_dict(
        {"schema": 1, "iteration": iteration, "kind": "playbook", "optimization": "o",
         "status": status, "correctness": correctness, "commit": "c", "ref": "r",
         "decision": {"reason": "why"}, "knobs": {}, "phases_s": {}, "latency_ms": None,
         "started_at": 0.0, "finished_at": 1.0})


def test_counts_of_changes_leave_the_baseline_out():
    recs = [_experiment(i, status, correctness) for i, (status, correctness) in enumerate(
        [("keep", "PASS"), ("keep", "PASS"), ("revert", "FAIL"), ("crash", "PASS")])]
    assert review.change_counts(recs) == {"total": 3, "kept": 1, "reverted": 1, "crashed": 1,
                                          "correctness_failures": 1}
