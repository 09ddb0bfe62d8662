"""The decision table, the stop rules and the ranking, as pure functions."""

from dataclasses import replace

import pytest
from conftest import ROOT

from perfloop.contract.playbook import SHIPPED, load
from perfloop.core.stats import Comparison
from perfloop.core.vocab import StopReason
from perfloop.plan import decide, planner
from perfloop.plan.decide import Evidence

RULES = load(SHIPPED).rules


def faster(gain: float, halfwidth: float = 0.002, noise: float = 0.001) -> Comparison:
    ratio = 1 - gain
    return Comparison(ratio, ratio - halfwidth, ratio + halfwidth, noise)


def outcome(head: Comparison, **others: Comparison) -> Evidence:
    return Evidence(correct=True, comparisons={"head": head, **others}, headline="head")


def verdict(o: Evidence, rules=RULES.decision) -> decide.Verdict:
    return decide.decide(o, rules)


def test_correctness_failure_reverts_at_once():
    v = verdict(Evidence(correct=False))
    assert (v.status, v.correctness, v.improved) == ("revert", "FAIL", False)


def test_crash_is_recorded_as_crash():
    v = verdict(Evidence(crashed=True))
    assert v.status == "crash" and not v.improved


def test_gain_of_five_percent_or_more_keeps_as_new_incumbent():
    v = verdict(outcome(faster(0.05)))
    assert (v.status, v.lower_family, v.stop, v.improved) == ("keep", False, False, True)


def test_gain_between_two_and_five_percent_keeps_and_lowers_the_family():
    v = verdict(outcome(faster(0.03)))
    assert (v.status, v.lower_family, v.stop) == ("keep", True, False)


def test_real_gain_under_two_percent_keeps_then_stops():
    v = verdict(outcome(faster(0.01)))
    assert (v.status, v.lower_family, v.stop) == ("keep", False, True)
    assert v.reason.endswith("gain under 2%: stop")


def test_a_minor_gain_with_several_buckets_stops_its_bucket_not_the_run():
    o = replace(outcome(faster(0.01)), per_bucket=True)
    v = verdict(o)
    assert v.stop and v.reason.endswith("under 2% at head: its bucket stops")


def test_regression_on_any_shape_reverts_even_with_a_headline_gain():
    v = verdict(outcome(faster(0.10), guard=faster(-0.05)))
    assert v.status == "revert" and "regression on guard" in v.reason


def test_slowdown_within_tolerance_is_not_a_regression():
    v = verdict(outcome(faster(0.10), guard=faster(-0.005)))
    assert v.status == "keep"


def test_gain_the_measurement_cannot_tell_from_noise_is_no_improvement():
    wide = Comparison(0.97, 0.94, 1.002, 0.001)      # the interval includes 1
    assert verdict(outcome(wide)).status == "revert"
    noisy = faster(0.03, noise=0.04)                  # smaller than the A/A control's noise
    v = verdict(outcome(noisy))
    assert v.status == "revert" and "noise" in v.reason and not v.improved


def test_a_gain_below_the_smallest_counted_is_no_improvement_however_tight():
    # as measured on an H100: identical code from another import, 0.42% "faster"
    tight = Comparison(0.9958, 0.9937, 0.9997, 0.001)
    v = verdict(outcome(tight))
    assert v.status == "revert" and not v.improved and "smallest gain counted 0.50%" in v.reason
    assert verdict(outcome(tight), replace(RULES.decision, min_gain=0.0)).status == "keep"


def test_faster_than_the_physical_floor_is_not_kept():
    o = Evidence(correct=True, comparisons={"head": faster(0.3)}, headline="head",
                below_floor=("head",))
    v = verdict(o)
    assert v.status == "revert" and "floor" in v.reason


def test_no_improvement_two_iterations_in_a_row_stops():
    kept = verdict(outcome(faster(0.06)))
    none = verdict(Evidence(correct=False))
    stop = RULES.stop
    assert decide.stop_reason(2, [kept, none], stop, remaining=5) is None
    streak = decide.stop_reason(3, [kept, none, none], stop, remaining=5)
    assert streak.reason is StopReason.NO_IMPROVEMENT and "2 consecutive" in streak.detail
    assert decide.stop_reason(4, [none, none, kept], stop, remaining=5) is None


def test_other_stop_rules():
    kept = verdict(outcome(faster(0.06)))
    small = verdict(outcome(faster(0.01)))
    minor = decide.stop_reason(1, [small], RULES.stop, remaining=5)
    assert minor.reason is StopReason.MINOR_GAIN and "under 2%" in minor.detail
    limit = decide.stop_reason(25, [kept], RULES.stop, remaining=5)
    assert limit.reason is StopReason.MAX_ITERATIONS and "limit (25)" in limit.detail
    assert decide.stop_reason(24, [kept], RULES.stop, remaining=5) is None
    left = decide.stop_reason(3, [kept], RULES.stop, remaining=0)
    assert left.reason is StopReason.NOTHING_LEFT and left.detail == "nothing left to try"


def test_changed_thresholds_change_the_decision():

    gain = outcome(faster(0.04))
    assert verdict(gain).lower_family
    strict = replace(RULES.decision, keep_gain=0.03)
    assert not verdict(gain, strict).lower_family          # now a full keep
    lax = replace(RULES.decision, minor_gain=0.05, keep_gain=0.2)
    assert verdict(gain, lax).stop                          # now a gain "under minor": stop


def test_ranking_follows_class_priority_skips_tried_and_applies_penalties():
    pb = load(SHIPPED)
    knobs = {"fast_math": False, "tile": (1, 1024), "occupancy": None, "memory_path": "load_store"}
    ids = [s.optimization.id for s in decide.rank(pb.optimizations, "memory-bound", knobs, {}, set(), {})]
    assert ids[:4] == ["fast_math", "memory_path", "tile_shape", "occupancy"]
    ids = [s.optimization.id for s in decide.rank(pb.optimizations, "memory-bound", knobs, {},
                                                   {"fast_math"}, {"memory": 10})]
    assert ids == ["tile_shape", "occupancy", "memory_path"]
    compute = [s.optimization.id for s in decide.rank(pb.optimizations, "compute-bound", knobs, {}, set(), {})]
    assert compute[0] == "tile_shape" and "memory_path" not in compute  # not offered there


def test_a_kernel_tag_reorders_the_playbook_and_says_so():
    pb = load(SHIPPED)
    knobs = {"fast_math": False, "tile": (1, 0), "occupancy": None, "store_allow_tma": None,
             "memory_path": "load_store", "num_ctas": None}
    plain = decide.rank(pb.optimizations, "memory-bound", knobs, {}, set(), {})
    tagged = decide.rank(pb.optimizations, "memory-bound", knobs, {}, set(), {}, ("reduction",))
    assert plain[0].optimization.id == "fast_math"
    assert [s.optimization.id for s in tagged][:3] == ["store_tma", "occupancy", "tile_shape"]
    assert "for reduction kernels" in tagged[0].reason
    # entries without a rank for the tag keep their class's rank (num_ctas: 9 for memory-bound)
    assert next(s for s in tagged if s.optimization.id == "num_ctas").rank == 9
    # a tag the catalog does not know changes nothing
    other = decide.rank(pb.optimizations, "memory-bound", knobs, {}, set(), {}, ("stencil",))
    assert [s.optimization.id for s in other] == [s.optimization.id for s in plain]


def test_an_entry_for_a_tag_alone_reaches_no_other_kernel_with_its_knobs():
    """warpgroup_tiles moves tile, worker_warps, occupancy and num_ctas, which a matmul has
    too: offered to it, its 2-D tile broke every matmul variant that took it (CI's check)."""
    from perfloop.contract import variants
    from perfloop.contract.kernel import read_knobs
    from perfloop.contract.manifest import load_spec

    pb = load(SHIPPED)
    root = ROOT
    for name, offered in (("matmul", False), ("attention", True)):
        spec = load_spec(root / "kernels" / name, root)
        knobs = read_knobs(spec.folder / "knobs.json")
        ids = [s.optimization.id for s in decide.rank(pb.optimizations, "compute-bound", knobs,
                                                       spec.candidates, set(), {}, spec.tags)]
        assert ("warpgroup_tiles" in ids) == offered, (name, ids)
        tiles = variants.domains(pb, knobs, spec.candidates, spec.tags)["tile"]
        assert ((128, 128) in tiles) == offered and all(len(t) == len(knobs["tile"])
                                                         for t in tiles), (name, tiles)

        class Space:   # what a run's start reads restrict() over
            seen: list = []

            def moves_anywhere(self, knobs, changed):
                return True

            def why_not(self, changed):
                self.seen.append(changed["tile"])

        planner.check_space(pb.optimizations, knobs, spec.candidates, Space(), spec.tags)
        assert ((128, 128) in Space.seen) == offered, (name, Space.seen)


def test_candidates_exclude_the_current_value_and_honour_kernel_overrides():
    opt = load(SHIPPED).get("occupancy")
    assert decide.candidates_for(opt, {"occupancy": 4}, {}) == (1, 2, 8, 16)
    assert decide.candidates_for(opt, {"occupancy": 4}, {"occupancy": (4, 8)}) == (8,)


@pytest.mark.parametrize("flops,cls", [(5.0, "memory-bound"), (20.0, "balanced"), (80.0, "compute-bound")])
def test_classification_by_arithmetic_intensity(flops, cls):
    assert decide.classify(1.0, flops)[0] == cls


def test_selection_carries_the_fastest_candidate_that_loses_nowhere():
    from perfloop.core.vocab import INCUMBENT
    from perfloop.referee.selection import _fastest

    def shape(**medians):  # three rounds of one sample each
        return {"rounds": {label: [[m], [m], [m]] for label, m in medians.items()}}

    first = {"shapes": {
        "head": shape(**{INCUMBENT: 100.0, "fast-but-breaks-guard": 60.0, "good": 80.0,
                         "slow": 120.0}),
        "guard": shape(**{INCUMBENT: 50.0, "fast-but-breaks-guard": 150.0, "good": 45.0,
                          "slow": 40.0})}}
    labels = ["fast-but-breaks-guard", "good", "slow"]
    assert _fastest(first, labels, "head", 0.01) == "good"
    # when every candidate loses somewhere, the fastest at the headline goes to the decision
    assert _fastest(first, ["fast-but-breaks-guard", "slow"], "head", 0.01) == \
        "fast-but-breaks-guard"


def test_the_control_and_each_candidate_run_in_launchers_of_their_own(tmp_path):
    """A separately imported and compiled copy of the same code is what a no-op candidate is:
    the A/A control must be one too, or build-to-build differences count as gains; and no
    variant's code shares a process with another's (or with the clock)."""
    import os

    from perfloop.core.vocab import CONTROL, INCUMBENT
    from perfloop.referee.timer import Timer

    (tmp_path / "kernel.py").write_text(
        "import os, torch\n"
        "DEVICE = 'cpu'\n"
        "def build(knobs):\n"
        "    def launch(inputs, out):\n"
        "        out.copy_(inputs[0])\n"
        "    return launch\n"
        "def make_inputs(shape, seed, device):\n"
        "    return (torch.zeros(shape.dims),)\n"
        "def empty_output(inputs):\n"
        "    return torch.empty_like(inputs[0])\n"
        "def reference(x):\n"
        "    return x\n"
        "def traffic(shape):\n"
        "    return {'bytes': 8, 'flops': {}}\n")
    spec = {"measure": {"rounds": 3, "round_ms": 5, "warmup_ms": 20, "min_reps": 3,
                        "max_reps": 5}, "progress": str(tmp_path / "progress.jsonl"),
            "variants": [{"label": label, "folder": str(tmp_path), "knobs": {}}
                         for label in (INCUMBENT, CONTROL, "candidate-0")],
            "contract_folder": str(tmp_path), "root": str(tmp_path),
            "out": str(tmp_path / "out.json"),
            "shapes": [{"name": "s", "dims": [8], "dtype": "float32"}]}
    timer = Timer(spec)
    try:
        pids = {label: launcher.proc.pid for label, launcher in timer.roster.launchers.items()}
        # one per variant, and the timer's own empty one (it calibrates the bracket)
        assert set(pids) == {INCUMBENT, CONTROL, "candidate-0", "bracket"}
        assert len(set(pids.values())) == 4 and os.getpid() not in pids.values()
    finally:
        timer.close()


def test_the_bracket_comes_off_every_variant_alike_or_off_none():
    """The empty batch's time is taken off every variant's batches where each ran at least
    twice as long, and off none where one did not: no time is ever 0 ms or less, and no
    variant's time is shortened alone."""
    from types import SimpleNamespace

    from perfloop.referee.shape_timing import CHECKS_PER_BATCH, ShapeTimer

    shape, n = SimpleNamespace(name="s"), 10
    timer = SimpleNamespace(simulated=None, unverified=set(),
                            overhead={("s", CHECKS_PER_BATCH): 1.0})   # 0.1 ms per launch
    clear = {"incumbent": [[0.5, 0.6]], "candidate-0": [[0.3, float("nan")]]}
    out, subtracted = ShapeTimer._bracketed(timer, clear, shape, n)
    assert subtracted and out["incumbent"] == [[0.4, 0.5]]
    assert abs(out["candidate-0"][0][0] - 0.2) < 1e-12
    close = {"incumbent": [[0.5]], "candidate-0": [[0.15]]}   # under twice the bracket
    out, subtracted = ShapeTimer._bracketed(timer, close, shape, n)
    assert not subtracted and out == close
