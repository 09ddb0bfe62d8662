"""Search beyond one-knob steps: per-shape dispatch, joint search, cliffs, the roofline stop,
as pure functions and in-process (runs of the scripted kernel: tests/e2e/test_search.py)."""

import json
import os
import time

import pytest
from conftest import ROOT, git
from support.catalog import TOGETHER_ENTRY
from support.records import experiment, experiments
from support.records import summary as typed

from perfloop.referee import clock as measure
from perfloop.contract import dispatch, knobspace
from perfloop.core import vocab
from perfloop.core.errors import UserError
from perfloop.contract.playbook import SHIPPED, DecisionRules, Measure, StopRules, load
from perfloop.core.stats import Comparison
from perfloop.core.vocab import Status, StopReason
from perfloop.measure import judge as judge_mod
from perfloop.measure import phases
from perfloop.plan import budget, decide, search, weigh

RULES = DecisionRules(keep_gain=0.05, minor_gain=0.02, regression_tolerance=0.01, family_penalty=10,
                 floor_tolerance=0.1, min_gain=0.005)


# ---- the dispatch helper -------------------------------------------------------------------
def test_dispatch_build_launches_each_bucket_with_its_own_values():
    built = []

    def build_one(knobs):
        built.append(knobs)
        return lambda inputs, out: knobs["tile"]

    knobs = {"tile": (1, 1024), "fast": False, "dispatch": {
        "bfloat16/n<=4096": {"tile": [4, 0]}, "bfloat16/n<=512": {}, "float32/n<=8192": {}}}
    launch = dispatch.build(knobs, build_one, lambda inputs: inputs[0])
    assert launch(("bfloat16/n<=4096",), None) == (4, 0)   # the table's lists arrive as tuples
    assert launch(("bfloat16/n<=512",), None) == (1, 1024)  # measured, plain knobs
    assert all("dispatch" not in k for k in built)   # build_one never sees the table
    # a bucket the table does not list runs as the nearest listed one: same dtype, then size
    assert launch(("bfloat16/n<=2048",), None) == (4, 0)
    assert launch(("bfloat16/n<=128",), None) == (1, 1024)
    assert launch(("float32/n<=32768",), None) == (1, 1024)
    assert launch(("float16/n<=4096",), None) == (4, 0)    # no fp16: the nearest size
    assert launch.routes["bfloat16/n<=2048"][0] == "bfloat16/n<=4096"
    assert "bfloat16/n<=4096" not in launch.routes
    plain = dispatch.build({"tile": (1, 1024)}, build_one, lambda inputs: 1 / 0)
    assert plain(("big",), None) == (1, 1024)        # no table: bucket() is never called


def test_merged_tables_keep_other_buckets_and_have_one_text():
    a = dispatch.merged({"x": {"tile": [1, 2]}}, {"y": {"tile": [4, 0]}, "x": {"occ": 2}})
    assert a == {"x": {"occ": 2, "tile": [1, 2]}, "y": {"tile": [4, 0]}}
    assert json.dumps(a) == json.dumps(dispatch.merged({}, {"y": {"tile": [4, 0]},
                                                            "x": {"tile": [1, 2], "occ": 2}}))
    assert dispatch.changed_buckets({"x": {"t": 1}}, a) == ["x", "y"]


# ---- which buckets a measured value wins ---------------------------------------------------
def _shape(bucket, rounds: dict, noise=0.002, held=False):
    return {"bucket": bucket, "held_back": held, "noise": noise,
            "variants": {label: {"round_medians_ms": r} for label, r in rounds.items()}}


def _rounds(ms: float, n: int = 10, spread: float = 0.001):
    return [ms * (1 + spread * ((i % 3) - 1)) for i in range(n)]


def test_bucket_winners_need_a_real_gain_at_every_shape_of_the_bucket():
    first = {
        "head": _shape("big", {"incumbent": _rounds(1.0), "c0": _rounds(0.8), "c1": _rounds(0.9)}),
        "tail": _shape("big", {"incumbent": _rounds(0.8), "c0": _rounds(0.7), "c1": _rounds(0.7)}),
        "guard": _shape("small", {"incumbent": _rounds(0.5), "c0": _rounds(0.6), "c1": _rounds(0.499)}),
        "held:head": _shape("big", {"incumbent": _rounds(1.0), "c0": _rounds(2.0)}, held=True),
    }
    won = search.bucket_winners(typed(first), {"c0": [1, 2048], "c1": [1, 512]}, "incumbent",
                                RULES)
    # c0 gains 12.5% at worst in "big" (c1 only 10%); nothing wins "small" (c1's 0.2% is
    # under min_gain); held-back shapes do not choose
    assert set(won) == {"big"} and won["big"][0] == "c0"
    assert won["big"][1] == pytest.approx(0.125, abs=0.01)


def test_a_dispatch_is_decided_where_it_changed_and_only_if_a_held_back_shape_was_timed():
    summary = typed({
        "head": {"bucket": "big", "vs_incumbent": {"c": {"ratio": 1.0}}},
        "guard": {"bucket": "small", "vs_incumbent": {"c": {"ratio": 0.8}}},
        "held:head": {"bucket": "big", "held_back": True, "vs_incumbent": {"c": {"ratio": 1}}}})
    assert weigh.dispatch_focus(summary, ["small"], "head", "c") == "guard"
    assert weigh.dispatch_focus(summary, ["big", "small"], "head", "c") == "head"
    assert weigh.dispatch_focus(summary, ["nowhere"], "head", "c") is None
    assert weigh.ungeneralized(summary, ["big", "small"]) == ("small",)
    outcome = decide.Evidence(correct=True, headline="guard", ungeneralized=("small",),
                             comparisons={"guard": Comparison(0.8, 0.79, 0.81)})
    verdict = decide.decide(outcome, RULES)
    assert verdict.status is Status.REVERT and "held-back" in verdict.reason
    # without a gain the timer leaves the held-back shapes out: the row says why it reverted
    flat = decide.Evidence(correct=True, headline="guard", ungeneralized=("small",),
                           comparisons={"guard": Comparison(1.001, 0.999, 1.003)})
    verdict = decide.decide(flat, RULES)
    assert verdict.status is Status.REVERT and "no improvement" in verdict.reason


def _joint_kept(first: dict, status: str = "keep", sampler: str = "tpe") -> list:
    """A baseline (commit c0) and a joint search kept at commit c1 with candidate-0's patch."""
    base = {"iteration": 0, "kind": "baseline", "status": "keep", "commit": "c0",
            "knobs": {"rows": 1, "occupancy": None, "dispatch": {"small": {"rows": 2}}}}
    labels = {"candidate-0": {"rows": 4, "occupancy": 2},
              "candidate-1": {"rows": 8, "occupancy": 4}}
    joint = {"iteration": 1, "kind": "playbook", "knob": "*", "optimization": "joint",
             "correctness": "PASS", "status": status, "commit": "c1", "incumbent_before": "c0",
             "knobs": {"rows": 4, "occupancy": 2, "dispatch": {"small": {"rows": 2}}},
             "sampler": {"name": sampler},
             "timing": {"chosen": "candidate-0", "labels": labels, "shapes": first}}
    return experiments([base, joint])


def _candidate_1_wins_small():
    """candidate-0 (kept) best at "big", candidate-1 best at "small": (first pass, records,
    the kept knobs)."""
    first = {"head": _shape("big", {"incumbent": _rounds(1.0), "candidate-0": _rounds(0.8),
                                    "candidate-1": _rounds(0.9)}),
             "guard": _shape("small", {"incumbent": _rounds(0.5), "candidate-0": _rounds(0.5),
                                       "candidate-1": _rounds(0.4)})}
    knobs = {"rows": 4, "occupancy": 2, "dispatch": {"small": {"rows": 2}}}
    return first, _joint_kept(first), knobs


def test_a_joint_config_that_wins_only_in_another_bucket_is_dispatched_there_whole():
    first, recs, knobs = _candidate_1_wins_small()
    table, said, why = search.dispatch_changes(recs, "c1", knobs, RULES, "head")
    # candidate-1 ran at "small" with occupancy 4 and its bucket's own rows (2): the entry is
    # what differs there from the kept config, measured against the kept config
    assert table == {"small": {"occupancy": 4, "rows": 2}}
    assert said == "occupancy=4 at small" and "small" in why
    # nothing to dispatch where the kept config is best everywhere
    first["guard"]["variants"]["candidate-1"]["round_medians_ms"] = _rounds(0.6)
    assert search.dispatch_changes(_joint_kept(first), "c1", knobs, RULES, "head") is None


def test_a_dispatch_that_builds_what_runs_there_now_is_not_proposed():
    # candidate-1 differs at "small" only by occupancy; for a kernel whose canonical() says
    # occupancy changes nothing, its win there is noise
    _, recs, knobs = _candidate_1_wins_small()
    same = knobspace._by(lambda k: {**k, "occupancy": None})   # occupancy never matters
    assert search.dispatch_changes(recs, "c1", knobs, RULES, "head", same=same) is None
    assert search.dispatch_changes(recs, "c1", knobs, RULES, "head") is not None


def test_candidates_that_build_the_incumbents_kernel_are_never_proposed(tmp_path):
    (tmp_path / "kernel.py").write_text(
        "def canonical(knobs):\n"
        "    return {**knobs, 'tile': (1, knobs['tile'][1])} if knobs['block_elems'] else knobs\n")
    space = knobspace.space_for(tmp_path)
    opt = load(SHIPPED).optimizations
    tile = next(o for o in opt if o.id == "tile_shape")
    knobs = {"tile": (1, 0), "block_elems": 32768}
    overrides = {"tile": ((1, 0), (2, 0), (8, 0), (1, 1024), (4, 1024))}
    assert decide.candidates_for(tile, knobs, overrides, space) == ((1, 1024), (4, 1024))
    assert decide.candidates_for(tile, {**knobs, "block_elems": None}, overrides, space) == (
        (2, 0), (8, 0), (1, 1024), (4, 1024))
    # without canonical(): plain equality; a canonical() that raises: one line
    (tmp_path / "kernel.py").write_text("X = 1\n")
    assert knobspace.same_for(tmp_path)({"a": 1}, {"a": (1,)}) is False
    (tmp_path / "kernel.py").write_text("def canonical(knobs):\n    return knobs['nope']\n")
    with pytest.raises(UserError, match="canonical\\(\\) failed: KeyError"):
        knobspace.same_for(tmp_path)({"a": 1}, {"a": 2})


RESTRICT = (
    "def restrict(knobs):\n"
    "    if knobs['tile'][0] * knobs['tile'][1] > 4096 and knobs['num_ctas'] == 1:\n"
    "        return 'a tile over 4096 elements needs 2 CTAs'\n")


def test_a_one_knob_step_proposes_by_what_runs_in_every_bucket(tmp_path):
    # the step writes its value in the entries that set its knob too (set_everywhere): the
    # plain value is a candidate where an entry differs, and restrict() is asked per bucket
    (tmp_path / "kernel.py").write_text(RESTRICT)
    space = knobspace.space_for(tmp_path)
    tile = next(o for o in load(SHIPPED).optimizations if o.id == "tile_shape")
    overrides = {"tile": ((1, 1024), (2, 4096), (8, 512))}
    knobs = {"tile": (1, 1024), "num_ctas": 1,
             "dispatch": {"small": {"tile": [2, 4096], "num_ctas": 2}, "big": {}}}
    # 1x1024 moves the small bucket back; 2x4096 needs 2 CTAs, which the plain knobs lack
    assert decide.candidates_for(tile, knobs, overrides, space) == ((1, 1024), (8, 512))
    assert decide.candidates_for(tile, knobs, overrides) == ((1, 1024), (2, 4096), (8, 512))
    plain = {"tile": (1, 1024), "num_ctas": 1}
    assert decide.candidates_for(tile, plain, overrides) == ((2, 4096), (8, 512))
    # an entry's tile is replaced, its num_ctas kept: 2x4096 runs with 1 CTA in the big one
    knobs = {"tile": (1, 1024), "num_ctas": 2,
             "dispatch": {"small": {}, "big": {"tile": [1, 512], "num_ctas": 1}}}
    assert decide.candidates_for(tile, knobs, overrides, space) == ((1, 1024), (8, 512))


def test_combinations_the_kernel_restricts_are_never_proposed(tmp_path):
    (tmp_path / "kernel.py").write_text(RESTRICT)
    space = knobspace.space_for(tmp_path)
    opt = load(SHIPPED).optimizations
    tile = next(o for o in opt if o.id == "tile_shape")
    knobs = {"tile": (1, 1024), "num_ctas": 1}
    overrides = {"tile": ((1, 1024), (1, 4096), (2, 4096), (8, 512))}
    assert decide.candidates_for(tile, knobs, overrides, space) == ((1, 4096), (8, 512))
    assert decide.candidates_for(tile, {**knobs, "num_ctas": 2}, overrides, space) == (
        (1, 4096), (2, 4096), (8, 512))
    # a bucket's values count as well as the plain ones
    table = {"dispatch": {"big": {"tile": [4, 2048]}}}
    assert space.why_not({**knobs, **table}) == (
        "a tile over 4096 elements needs 2 CTAs (at big)")
    assert space.why_not({**knobs, "num_ctas": 2, **table}) is None
    assert not space.worth(knobs, {**knobs, **table}, "big")
    assert space.worth(knobs, {**knobs, "num_ctas": 2, **table}, "big")
    # a joint search never counts, samples nor proposes what it rules out
    recs = [_step("tile", [1, 1024], {(2, 4096): 0.98, (1, 4096): 0.99}),
            _step("num_ctas", 1, {2: 0.99})]
    both = [{"num_ctas": 2, "tile": [2, 4096]}, {"num_ctas": 2, "tile": [1, 4096]}]
    assert search.joint_plan(recs, knobs, "head", 0.03, 30, []).patches == both
    assert search.joint_plan(recs, knobs, "head", 0.03, 30, [], worth=lambda p: space.worth(
        knobs, search.apply_joint(knobs, p, None))).patches == both   # (2 CTAs: they run)
    (tmp_path / "kernel.py").write_text(RESTRICT.replace("== 1", "== 2"))
    flipped = knobspace.space_for(tmp_path)
    plan = search.joint_plan(recs, knobs, "head", 0.03, 30, [], worth=lambda p: flipped.worth(
        knobs, search.apply_joint(knobs, p, None)))
    assert plan.patches == both[1:] and plan.space == 1
    # a restrict() that raises or answers other than None or a string: one line
    (tmp_path / "kernel.py").write_text("def restrict(knobs):\n    return knobs['nope']\n")
    with pytest.raises(UserError, match="restrict\\(\\) failed: KeyError"):
        knobspace.space_for(tmp_path).why_not(knobs)
    (tmp_path / "kernel.py").write_text("def restrict(knobs):\n    return False\n")
    with pytest.raises(UserError, match="must return None or a reason"):
        knobspace.space_for(tmp_path).why_not(knobs)


def test_an_entry_of_several_knobs_is_refused_in_one_line_when_malformed(tmp_path):
    import shutil

    shutil.copytree(SHIPPED, tmp_path / "pb")
    catalog = tmp_path / "pb" / "catalog.toml"
    shipped = catalog.read_text()
    catalog.write_text(shipped + TOGETHER_ENTRY.replace(
        "{tile = [1, 4096], occupancy = 4}", "{tile = [1, 4096]}"))
    with pytest.raises(UserError, match="each value must be a table of tile, occupancy"):
        load(tmp_path / "pb")
    for knobs in ('["tile"]', '"tile"', '["tile", "tile"]'):
        catalog.write_text(shipped + TOGETHER_ENTRY.replace('["tile", "occupancy"]', knobs))
        with pytest.raises(UserError, match="is a list of two different knobs or more"):
            load(tmp_path / "pb")
    together = next(o for o in load(SHIPPED).optimizations if o.id == "tile_shape")
    assert together.moves == ("tile",) and together.key == "tile"


@pytest.mark.parametrize("kernel", ["rmsnorm", "softmax"])
def test_a_reductions_tile_rows_beside_block_elems_build_the_same_kernel(kernel):
    # the catalog must not offer, nor a dispatch keep, a tile whose rows the kernel ignores
    pytest.importorskip("cuda.tile")
    folder = ROOT / "kernels" / kernel
    same = knobspace.same_for(folder)
    knobs = {k: tuple(v) if isinstance(v, list) else v
             for k, v in json.loads((folder / "knobs.json").read_text()).items()}
    packed = {**knobs, "block_elems": 32768}
    assert same(packed, {**packed, "tile": (4, 0)})
    assert not same(packed, {**packed, "tile": (4, 1024)})
    rows = {**knobs, "block_elems": None}   # without block_elems the tile's rows count
    assert not same(rows, {**rows, "tile": (4, 0)})


def test_a_kept_tpe_joint_search_is_followed_by_another_one():
    recs = _joint_kept({})
    assert not search.joint_tried_since_keep(recs)           # sampling paid: sample again
    assert search.joint_tried_since_keep(recs + [experiment({"optimization": "fast_math",
                                                             "status": "revert"})]) is False
    assert search.joint_tried_since_keep(_joint_kept({}, status="revert"))
    # the whole space was measured
    assert search.joint_tried_since_keep(_joint_kept({}, sampler="all"))


def test_planned_from_a_4df2488_record_the_searches_are_those_that_run_ran():
    """The planner reads the typed record (perfloop.store.records): from a run written at
    4df2488 it plans, experiment by experiment, the dispatch, joint and bucket joint searches
    that run planned and recorded (their candidates and sampler), Optuna's TPE included."""
    from perfloop.store import records

    legacy = ROOT / "tests" / "legacy" / "experiments-4df2488.jsonl"
    recs = [r for r in records.load(legacy) if isinstance(r, records.Experiment)]
    rules = load(SHIPPED).rules
    joint = rules.search

    def before(i: int) -> tuple[list, dict, str]:
        """The record before iteration i, the incumbent's knobs and commit then."""
        kept = [r for r in recs[:i] if r.status == Status.KEEP][-1]
        return recs[:i], kept.knobs, kept.commit

    ran = {r.optimization: r for r in recs}
    past, knobs, incumbent = before(ran["dispatch"].iteration)
    table, said, _ = search.dispatch_changes(past, incumbent, knobs, rules.decision, "head")
    assert [table] == ran["dispatch"].extra["candidates"] and said == ran["dispatch"].describe
    pytest.importorskip("optuna")
    args = (joint.joint_margin, joint.joint_max_configs, list(joint.interactions))
    past, knobs, _ = before(ran["joint"].iteration)
    plan = search.joint_plan(past, knobs, "head", *args, pair_share=joint.pair_share)
    assert plan.sampler == search.TPE
    assert plan.patches == ran["joint"].extra["candidates"]
    assert plan.as_record() == ran["joint"].sampler
    past, knobs, _ = before(ran["bucket-joint"].iteration)
    [(tables, plan)] = search.bucket_joint_plans(past, knobs, "head", *args,
                                                 pair_share=joint.pair_share)
    assert tables == ran["bucket-joint"].extra["candidates"]
    assert plan.as_record() == ran["bucket-joint"].sampler


# ---- the joint search's space -------------------------------------------------------------
def _step(knob, before, ratios: dict, iteration=1, bucket=None, **more):
    labels = {f"c{i}": v for i, v in enumerate(ratios)}
    return experiment({
        "iteration": iteration, "kind": "playbook", "knob": knob, "correctness": "PASS",
        "status": "revert", "optimization": knob, "incumbent_value": before,
        "timing": {"labels": labels, "shapes": {"head": {"bucket": bucket, "vs_incumbent": {
            f"c{i}": {"ratio": r} for i, r in enumerate(ratios.values())}}}}, **more})


def test_joint_space_holds_the_near_best_values_of_two_knobs_or_more_and_no_single_moves():
    recs = [_step("tile", [1, 1024], {(1, 2048): 0.99, (1, 512): 1.2, (4, 0): 0.98}),
            _step("occupancy", None, {2: 1.01, 4: 1.3}),
            _step("fast_math", False, {True: 1.1})]
    knobs = {"tile": (1, 1024), "occupancy": None, "fast_math": False}
    patches = search.joint_space(recs, knobs, "head", margin=0.03, max_configs=30,
                                 interactions=[])
    # tile: 1x1024 (current), 1x2048, 4x0 within 3% of 0.98; occupancy: None, 2; fast math: no
    assert {json.dumps(p, sort_keys=True) for p in patches} == {
        json.dumps({"occupancy": 2, "tile": t}, sort_keys=True) for t in ([1, 2048], [4, 0])}
    assert patches[0]["tile"] == [4, 0]   # the most promising first (0.98 * 1.01)
    # an interaction brings in every measured value of the other knob; the cap holds
    wide = search.joint_space(recs, knobs, "head", 0.03, 30, [("occupancy", "fast_math")])
    assert {p.get("fast_math") for p in wide} == {True, None}
    assert len(search.joint_space(recs, knobs, "head", 0.03, 3, [("tile", "fast_math")])) == 3
    # one knob with alternatives is no joint search
    assert search.joint_space(recs[:1], knobs, "head", 0.03, 30, []) == []


def test_a_cliff_joins_the_joint_space_beside_the_knob_it_interacts_with():
    # a large tile spilled alone (dropped as a cliff); num_ctas 2 lost alone: measured together
    tiles = _step("tile", [64, 64, 32], {(128, 128, 64): 0.34},
                  outcomes={"c0": {"outcome": "ok", "value": [128, 128, 64]},
                            "c1": {"outcome": "slow", "value": [128, 256, 64]}})
    recs = [tiles, _step("num_ctas", None, {2: 1.8, 4: 2.5}, iteration=2)]
    knobs = {"tile": (128, 128, 64), "num_ctas": None}
    patches = search.joint_space(recs, knobs, "head", 0.03, 30, [("tile", "num_ctas")])
    # the cliff comes only with num_ctas moved, and those pairs rank first: num_ctas's poor
    # one-knob ratios say nothing about it beside a tile it interacts with
    assert patches[:2] == [{"num_ctas": 2, "tile": [128, 256, 64]},
                           {"num_ctas": 4, "tile": [128, 256, 64]}]
    assert all(p.get("tile") != [128, 256, 64] or "num_ctas" in p for p in patches)
    # without the interaction, neither knob has a second value worth measuring together
    assert search.joint_space(recs, knobs, "head", 0.03, 30, []) == []


def test_the_joint_search_starts_from_what_is_in_force_at_the_headline():
    # group 8 and persistent are already dispatched to the headline's bucket: proposing them
    # again over the plain knobs would change only the other buckets
    group = _step("group", None, {8: 0.92, 4: 0.93}, bucket="bf16/large")
    persistent = _step("persistent", False, {True: 0.91}, iteration=2, bucket="bf16/large")
    occupancy = _step("occupancy", None, {1: 0.999, 2: 1.001}, iteration=3, bucket="bf16/large")
    knobs = {"group": None, "persistent": False, "occupancy": None,
             "dispatch": {"bf16/large": {"group": 8, "persistent": True}}}
    patches = search.joint_space([group, persistent, occupancy], knobs, "head", 0.03, 30, [])
    assert {"group": 8, "persistent": True} not in patches
    assert all(sum(p.get(k) != v for k, v in (("group", 8), ("persistent", True),
                                             ("occupancy", None))) >= 2 for p in patches)
    assert {"group": 4, "occupancy": 1} in patches
    # applied where the headline runs: a dispatched knob in its bucket's entry
    applied = search.apply_joint(knobs, {"group": 4, "occupancy": 1}, "bf16/large")
    assert applied["occupancy"] == 1 and applied["group"] is None
    assert applied["dispatch"] == {"bf16/large": {"group": 4, "persistent": True}}
    assert search.apply_joint({"group": None, "occupancy": None}, {"group": 4, "occupancy": 1},
                              None) == {"group": 4, "occupancy": 1}


# ---- the joint search's sampler for a space larger than joint_max_configs ------------------
def _wide():
    """Four knobs, each with four values worth measuring together (the one in force
    included): 4**4 - 1 - 12 = 243 configs move two knobs or more."""
    recs = [_step(k, 1, {2: 0.99 - i / 1000, 3: 1.0, 4: 1.005}, iteration=i + 1)
            for i, k in enumerate("abcd")]
    return recs, {k: 1 for k in "abcd"}


def _texts(patches):
    return [json.dumps(p, sort_keys=True) for p in patches]


def _joint(patches, ratios: dict, iteration):
    """A recorded joint experiment: its candidates (patches), the finalists' ratios at the
    headline in the first pass, the others screened out with theirs."""
    labels = {f"candidate-{i}": p for i, p in enumerate(patches)}
    first = {label: {"ratio": ratios[label]} for label in list(labels)[:2]}
    return experiment({
        "iteration": iteration, "kind": "playbook", "knob": "*", "correctness": "PASS",
        "status": "revert", "optimization": "joint", "incumbent_value": None,
        "outcomes": {label: {"value": p, "outcome": "ok" if label in first else "screened",
                             "reason": ""} for label, p in labels.items()},
        "screening": {"shape": "head", "ratios": ratios},
        "timing": {"labels": {k: labels[k] for k in first},
                   "shapes": {"head": {"vs_incumbent": first}}}})


def test_a_joint_space_within_the_cap_is_measured_whole_by_the_product_ranking():
    recs = [_step("tile", [1, 1024], {(1, 2048): 0.99, (4, 0): 0.98}),
            _step("occupancy", None, {2: 1.01, 4: 1.02})]
    knobs = {"tile": (1, 1024), "occupancy": None}
    plan = search.joint_plan(recs, knobs, "head", 0.03, 30, [])
    # 3 x 3 values: 9 configs, minus the one in force and the 4 that move one knob
    assert plan.sampler == search.ALL and plan.space == 4 and len(plan.patches) == 4
    assert plan.patches[0] == {"occupancy": 2, "tile": [4, 0]}     # 0.98 * 1.01 first
    assert plan.patches == search.joint_space(recs, knobs, "head", 0.03, 30, [])
    assert plan.as_record() == {"name": "all", "space": 4, "chosen": 4}


def test_a_larger_joint_space_is_sampled_by_tpe_rebuilt_from_the_record():
    pytest.importorskip("optuna")
    recs, knobs = _wide()
    plan = search.joint_plan(recs, knobs, "head", 0.03, 30, [])
    assert plan.sampler == search.TPE and plan.space == 243 and plan.filled == 0
    assert plan.seed == len(recs) and plan.told == 1 + 4 * 3   # the incumbent, 12 candidates
    texts = _texts(plan.patches)
    assert len(texts) == 30 and len(set(texts)) == 30
    assert all(len(p) >= 2 and all(v in (2, 3, 4) for v in p.values()) for p in plan.patches)
    # the same 30 again: nothing is kept between calls but the record
    assert _texts(search.joint_plan(recs, knobs, "head", 0.03, 30, []).patches) == texts
    # not the product ranking's 30
    ranked = search.joint_plan(recs, knobs, "head", 0.03, 10**6, []).patches
    assert len(ranked) == 243 and set(texts) != set(_texts(ranked[:30]))
    # a config measured before is never proposed, however well it ranks
    assert ranked[0] == {"a": 2, "b": 2, "c": 2, "d": 2}
    done = _joint(ranked[:30], {f"candidate-{i}": 0.9 + i / 1000 for i in range(30)},
                  iteration=5)
    again = search.joint_plan(recs + [done], knobs, "head", 0.03, 30, [])
    assert again.sampler == search.TPE and again.told == 13 + 30 and again.seed == 5
    assert len(set(_texts(again.patches))) == 30
    assert not set(_texts(again.patches)) & set(_texts(ranked[:30]))
    assert set(_texts(again.patches)) != set(texts)


def test_a_sampled_space_measures_every_config_of_an_interacting_pair_first():
    pytest.importorskip("optuna")
    # the H100 RMSNorm run's wide-row bucket: occupancy 2 ran 1.7x slower beside 2 rows per
    # block (block_elems 32768, in force) and was the best value beside 1 row; TPE, told the
    # one-knob ratios, left out every config with occupancy 2
    recs = [_step("block_elems", 32768, {8192: 0.99, 16384: 0.995, 65536: 1.3, None: 1.3}),
            _step("occupancy", None, {1: 0.999, 2: 1.68, 4: 1.0, 8: 3.0, 16: 1.01}, iteration=2),
            _step("split_row", False, {True: 1.0}, iteration=3),
            _step("latency", None, {2: 0.99, 4: 0.995, 8: 1.0}, iteration=4)]
    knobs = {"block_elems": 32768, "occupancy": None, "split_row": False, "latency": None}
    pair = [("block_elems", "occupancy")]
    plan = search.joint_plan(recs, knobs, "head", 0.03, 30, pair)
    # 5 x 6 x 2 x 4 configs, less the one in force and 13 that move one knob
    assert plan.sampler == search.TPE and plan.space == 226 and len(plan.patches) == 30
    paired = [p for p in plan.patches if set(p) == {"block_elems", "occupancy"}]
    assert plan.paired == len(paired) == 4 * 5 and plan.patches[:20] == paired
    assert all({"block_elems": b, "occupancy": 2} in plan.patches
               for b in (8192, 16384, 65536, None))
    assert len(set(_texts(plan.patches))) == 30 and all(len(p) >= 2 for p in plan.patches)
    assert plan.as_record()["interacting_pairs"] == 20
    assert "one pair of interacting knobs" in plan.said()
    # the pair's configs are not measured again: the next search samples the rest
    done = _joint(plan.patches, {f"candidate-{i}": 1.0 + i / 1000 for i in range(30)}, 5)
    again = search.joint_plan(recs + [done], knobs, "head", 0.03, 30, pair)
    assert again.paired == 0 and len(again.patches) == 30
    assert not set(_texts(again.patches)) & set(_texts(plan.patches))
    # a smaller cap: the pairs take 2/3 of it, spread so that no value is left out whole
    small = search.joint_plan(recs, knobs, "head", 0.03, 12, pair)
    assert len(small.patches) == 12 and small.paired == 8
    heads = small.patches[:8]
    assert {p["occupancy"] for p in heads} == {1, 2, 4, 8, 16}
    assert {p["block_elems"] for p in heads} == {8192, 16384, 65536, None}
    # more pairs than their share (20 + 15 with latency x occupancy): 20, every value of the
    # three knobs among them, and TPE chooses the other 10
    two = [*pair, ("latency", "occupancy")]
    both = search.joint_plan(recs, knobs, "head", 0.03, 30, two)
    assert both.paired == 20 and both.sampler == search.TPE and len(both.patches) == 30
    heads = both.patches[:20]
    assert {p["occupancy"] for p in heads} == {1, 2, 4, 8, 16}
    assert {p.get("latency") for p in heads} >= {2, 4, 8}
    assert {p.get("block_elems", 32768) for p in heads} >= {8192, 16384, 65536, None}
    # pairs that fill the whole cap leave nothing to TPE, and the plan does not say it chose
    full = search.joint_plan(recs, knobs, "head", 0.03, 30, two, pair_share=1.0)
    assert full.paired == 30 and full.sampler == search.RANKING
    assert "TPE" not in full.said() and "fill the cap" in full.said()


def test_more_pair_configs_than_the_cap_measure_the_most_promising_pair_whole():
    """H100 RMSNorm's headline, run n9: 2 rows per block (block_elems 8192) took 1.78x the
    time of 8 rows alone, 1.1x with occupancy 2, 3.9x with 8 and 0.97x with 4. Spread so that
    each value came once, 30 of the 45 configs of three pairs held 8192 with 2, 8 and 16 only.
    Now the pair whose best config ranks first is measured whole, then as much of the next."""
    recs = [_step("block_elems", 32768, {8192: 1.78, 16384: 1.21, 65536: 1.41, None: 2.42}),
            _step("occupancy", None, {1: 1.003, 2: 1.013, 4: 1.003, 8: 1.002, 16: 1.003},
                  iteration=2),
            _step("cols", 0, {2048: 1.45, 1024: 3.0, 512: 2.26, 256: 3.0}, iteration=3)]
    knobs = {"block_elems": 32768, "occupancy": None, "cols": 0}
    pairs = [("cols", "occupancy"), ("block_elems", "occupancy")]
    plan = search.joint_plan(recs, knobs, "head", 0.03, 30, pairs, pair_share=1.0)
    assert len(plan.patches) == 30 and plan.paired == 30 and plan.sampler == search.RANKING
    rows = [p for p in plan.patches if set(p) == {"block_elems", "occupancy"}]
    assert plan.patches[:20] == rows and {"block_elems": 8192, "occupancy": 4} in rows
    assert {(p["block_elems"], p["occupancy"]) for p in rows} == {
        (b, o) for b in (8192, 16384, 65536, None) for o in (1, 2, 4, 8, 16)}
    # the pair cut short: each of its values still comes once
    cut = plan.patches[20:]
    assert {p["cols"] for p in cut} == {2048, 1024, 512, 256}
    assert {p["occupancy"] for p in cut} == {1, 2, 4, 8, 16}


def test_the_measured_configs_follow_the_incumbent_through_the_record():
    baseline = experiment({"iteration": 0, "kind": "baseline", "status": "keep",
                           "optimization": "baseline", "knobs": {k: 1 for k in "abcd"}})
    kept = _step("a", 1, {2: 0.9}, iteration=1, status="keep",
                 knobs={"a": 2, "b": 1, "c": 1, "d": 1})
    later = _step("b", 1, {3: 0.95}, iteration=2)
    # the knobs passed in count only before the record's first incumbent (none here)
    told = search.measured_configs([baseline, kept, later], {k: 4 for k in "abcd"}, "head")
    assert [(c["a"], c["b"], r) for c, r in told] == [(1, 1, 1.0), (2, 1, 0.9),
                                                      (2, 1, 1.0), (2, 3, 0.95)]


def test_without_optuna_the_product_ranking_cuts_a_larger_space_and_says_so(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_optuna(name, *args, **kwargs):
        if name == "optuna" or name.startswith("optuna."):
            raise ImportError("No module named 'optuna'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_optuna)
    recs, knobs = _wide()
    plan = search.joint_plan(recs, knobs, "head", 0.03, 30, [])
    ranked = search.joint_plan(recs, knobs, "head", 0.03, 10**6, []).patches
    assert plan.sampler == search.RANKING and plan.patches == ranked[:30]
    assert "optuna" in plan.note.lower() and plan.as_record()["note"] == plan.note
    assert "product of the one-knob ratios" in plan.said() and "optuna" in plan.said().lower()


# ---- stop rules -----------------------------------------------------------------------------
STOP = StopRules(no_improvement_streak=2, max_iterations=25, roofline_share=0.92)
KEEP = decide.Verdict("keep", "PASS", "10% faster", 0.1, improved=True)
MINOR = decide.Verdict("keep", "PASS", "1% faster: stop", 0.01, stop=True, improved=True)
REVERT = decide.Verdict("revert", "PASS", "no improvement")


def test_searches_on_offer_hold_off_every_stop_but_the_limit_and_the_roofline():
    assert decide.stop_reason(3, [KEEP, REVERT, REVERT], STOP, 5) is not None
    assert decide.stop_reason(3, [KEEP, REVERT, REVERT], STOP, 5, searches=1) is None
    assert decide.stop_reason(25, [KEEP], STOP, 5, searches=1).reason == "max-iterations"
    shares = {"head": 0.95, "guard": 0.93}
    roofline = decide.stop_reason(1, [KEEP], STOP, 5, searches=1, floor_shares=shares)
    assert roofline.reason == "roofline" and roofline.detail.startswith("at the roofline")
    assert decide.stop_reason(1, [KEEP], STOP, 5, floor_shares={**shares, "g": 0.9}) is None
    # a minor gain's stop stands after the search experiments that followed it
    assert decide.stop_reason(3, [KEEP, MINOR, REVERT], STOP, 5, searched=[False, False, True]
                              ) == vocab.Stop(vocab.StopReason.MINOR_GAIN, MINOR.reason)
    assert decide.stop_reason(3, [KEEP, MINOR, KEEP], STOP, 5,
                              searched=[False, False, False]) is None


def test_a_run_stops_before_an_experiment_that_would_pass_its_time_budget():
    timed = StopRules(no_improvement_streak=2, max_iterations=25, time_budget_s=600)
    # 400 s spent, the slowest 120 s: one more fits; at 500 s it would not, searches or not
    assert decide.stop_reason(3, [KEEP, KEEP], timed, 5, searches=1,
                              spent_s=(100, 180, 120)) is None
    reason = decide.stop_reason(3, [KEEP, KEEP], timed, 5, searches=1, spent_s=(100, 280, 120))
    assert reason.reason is StopReason.TIME_BUDGET and "600 s" in reason.detail
    assert decide.stop_reason(3, [KEEP, KEEP], STOP, 5, spent_s=(100, 280, 120)) is None
    # with the next experiment's estimate, that decides instead of the slowest so far
    assert decide.stop_reason(3, [KEEP, KEEP], timed, 5, spent_s=(100, 280, 120),
                              next_s=90) is None
    late = decide.stop_reason(3, [KEEP, KEEP], timed, 5, spent_s=(100, 180, 120), next_s=210)
    assert late.reason is StopReason.TIME_BUDGET and "estimated at 210 s" in late.detail


def _estimate(kind, candidates, spent):
    return budget.estimate_s(kind, candidates, spent, screen_above=8, screen_keep=4,
                             screen_s_per_config=1.5)


def test_the_next_experiment_is_estimated_from_the_slowest_of_its_kind_scaled_by_its_variants():
    base = budget.Spent(budget.STEP, 25.0, timed=1)
    four = budget.Spent(budget.STEP, 60.0, timed=4)
    assert _estimate(budget.STEP, 3, []) == 0.0
    # a step of 7 candidates times 9 variants where the 4-candidate step timed 6: 60 x 9/6
    assert _estimate(budget.STEP, 7, [base, four]) == pytest.approx(90.0)
    # one candidate times 3 variants: 60 x 3/6 and 25 x 3/3, the slower
    assert _estimate(budget.STEP, 1, [base, four]) == pytest.approx(30.0)
    # no dispatch run yet: the slowest of any kind; then dispatches by their own
    assert _estimate(budget.DISPATCH, 1, [base, four]) == pytest.approx(30.0)
    dispatched = [base, four, budget.Spent(budget.DISPATCH, 20.0, timed=1)]
    assert _estimate(budget.DISPATCH, 1, dispatched) == pytest.approx(20.0)
    # a joint search of 30 configs: screened at the default rate, then 4 judged and timed
    assert _estimate(budget.JOINT, 30, [base, four]) == pytest.approx(60.0 + 30 * 1.5)
    # once one was screened, at the run's own rate, its rest by the joint searches before
    joint = budget.Spent(budget.JOINT, 100.0, timed=4, screened=30, screen_s=60.0)
    assert _estimate(budget.JOINT, 20, [base, four, joint]) == pytest.approx(40.0 + 20 * 2.0)
    # a joint search whose finalists all failed fast is no reference for the next one, nor is
    # a baseline that measured the device's ceilings cold
    failed = budget.Spent(budget.JOINT, 12.0, timed=4, reference=False)
    assert _estimate(budget.JOINT, 8, [base, four, failed]) == pytest.approx(60.0 * 10 / 6)
    cold = budget.Spent(budget.STEP, 200.0, timed=1, reference=False)
    assert _estimate(budget.STEP, 7, [cold, four]) == pytest.approx(90.0)
    assert _estimate(budget.STEP, 7, [cold]) == pytest.approx(600.0)  # nothing better known
    assert budget.over([base, four], [90.0, 100.0], 600) is False
    assert budget.over([base, four], [90.0, 100.0, 330.0], 600) is True
    assert budget.over([base, four], [1e9], None) is False and not budget.over([], [1e9], 60)


def test_a_records_time_is_split_into_screening_and_the_rest():
    class Rec:
        kind, optimization, started_at, finished_at = "playbook", "bucket-joint", 10.0, 110.0
        phases_s = {"screen_compile": 15.0, "screen": 40.0, "correctness": 30.0}
        outcomes = {f"c{i}": {"outcome": "screened" if i >= 4 else "ok"} for i in range(30)}
        timing = {"shapes": {}}
        screening = {"shape": "guard", "ratios": {}}

    got = budget.spent(Rec())   # (the screening's compiles are a part of its 40 s)
    assert got == budget.Spent(budget.JOINT, 100.0, timed=4, screened=30, screen_s=40.0)
    assert got.rest_s == 60.0
    # cliffs dropped while screening: the finalists were still timed to the end
    Rec.outcomes = {**Rec.outcomes, "c4": {"outcome": "slow"}, "c5": {"outcome": "slow"}}
    assert budget.spent(Rec()) == got and got.reference
    Rec.screening = None   # screening that failed measured no rate
    assert not budget.spent(Rec()).reference   # a step with a cliff-dropped candidate
    Rec.outcomes = {f"c{i}": {"outcome": "screened" if i >= 4 else "ok"} for i in range(30)}
    assert budget.spent(Rec()).screened == 0 and budget.spent(Rec()).rest_s == 100.0
    Rec.optimization, Rec.phases_s, Rec.outcomes = "tile_shape", {"correctness": 30.0}, None
    assert budget.spent(Rec()) == budget.Spent(budget.STEP, 100.0, timed=1)
    # no reference: a baseline (its time may hold the device's ceilings measured cold), an
    # experiment that timed nothing, one with a crashed (hung) or cliff-dropped candidate
    Rec.kind = "baseline"
    assert not budget.spent(Rec()).reference
    Rec.kind, Rec.timing = "playbook", None
    assert not budget.spent(Rec()).reference
    Rec.timing, Rec.outcomes = {"shapes": {}}, {"c0": {"outcome": "crash"}, "c1": {"outcome": "ok"}}
    assert not budget.spent(Rec()).reference


def _timed(iteration, knob, status, shape_ratios, bucket="big", knobs=None, value=2,
           optimization=None, sampler=None):
    """A one-knob step (or a search experiment) timed at shapes {name: (bucket, ratio)}."""
    shapes = {name: {"bucket": b, "vs_incumbent": {"candidate-0": {"ratio": r}}}
              for name, (b, r) in shape_ratios.items()}
    return experiment({"iteration": iteration, "kind": "playbook", "knob": knob,
                       "status": status, "optimization": optimization or knob,
                       "correctness": "PASS", "incumbent_value": None, "knobs": knobs or {},
                       "sampler": sampler,
                       "timing": {"labels": {"candidate-0": value}, "shapes": shapes}})


def test_a_bucket_reads_its_own_one_knob_ratios_and_skips_knobs_it_dispatched():
    base = experiment({"iteration": 0, "kind": "baseline", "status": "keep",
                       "optimization": "baseline",
                       "knobs": {"occupancy": None, "rows": 1, "dispatch": {"small": {"rows": 4}}}})
    recs = [base,
            _timed(1, "occupancy", "revert", {"head": ("big", 1.05), "guard": ("small", 0.97)}),
            _timed(2, "rows", "revert", {"head": ("big", 0.99), "guard": ("small", 0.90)})]
    assert search._measured(recs, "guard") == {"occupancy": {None: 1.0, 2: 0.97}}
    assert search._measured(recs, "head") == {"occupancy": {None: 1.0, 2: 1.05},
                                                             "rows": {None: 1.0, 2: 0.99}}
    assert search.benchmark_buckets(recs, "head") == [("small", "guard")]


def test_the_headlines_joint_search_goes_first_then_the_bucket_furthest_from_its_floor():
    def joint(shape=None):
        return decide.Suggestion(search.optimization(search.JOINT, ()), (), 0, "",
                                 sampler={"shape": shape} if shape else {"name": "all"})

    offered = [joint("tail"), joint("wide"), joint()]
    shares = {"head": 0.97, "wide": 0.53, "tail": 0.58}
    assert [sg.sampler.get("shape") for sg in search.by_headroom(offered, shares, "head")] == [
        None, "wide", "tail"]
    assert [sg.sampler.get("shape") for sg in search.by_headroom(offered, None, "head")] == [
        None, "tail", "wide"]   # no floor known: the buckets as offered
    assert [sg.sampler.get("shape") for sg in search.by_headroom(offered[:2], shares, "head")
            ] == ["wide", "tail"]


def test_each_buckets_joint_search_runs_once_until_the_catalog_keeps_a_change():
    shapes = {"head": ("big", 1.0)}
    tried = [_timed(1, "dispatch", "keep", shapes, optimization="bucket-joint",
                   sampler={"bucket": "small"})]
    assert search.bucket_joint_tried(tried, "small")
    assert not search.bucket_joint_tried(tried, "wide")
    later = tried + [_timed(2, "dispatch", "keep", shapes, optimization="bucket-joint",
                           sampler={"bucket": "wide"})]
    assert search.bucket_joint_tried(later, "small")      # a bucket's keep resets no other
    moved_on = later + [_timed(3, "occupancy", "keep", shapes)]
    assert not search.bucket_joint_tried(moved_on, "small")
    # and a bucket's keep does not offer the headline's joint search again
    joint = _timed(1, "*", "revert", shapes, optimization="joint")
    assert search.joint_tried_since_keep([joint, *later[:1]])


def test_only_catalog_experiments_count_towards_the_no_improvement_streak():
    # a revert, then a dispatch and a joint search that found nothing: one idea failed, not three
    assert decide.stop_reason(4, [KEEP, REVERT, REVERT, REVERT], STOP, 5,
                              searched=[False, False, True, True]) is None
    assert decide.stop_reason(5, [KEEP, REVERT, REVERT, REVERT, REVERT], STOP, 5,
                              searched=[False, False, True, True, False]).detail.startswith(
        "no improvement in 2 consecutive")
    # an improvement found by a search still ends the streak
    assert decide.stop_reason(4, [REVERT, REVERT, KEEP, REVERT], STOP, 5,
                              searched=[False, False, True, False]) is None


# ---- cliffs -----------------------------------------------------------------------------------
class FakeClock:
    def time_batch(self, fn, reps, before=None):
        out = []
        for i in range(reps):
            if before:
                before(i)
            out.append(fn())
        return out


def test_a_candidate_far_slower_in_warm_up_is_dropped_after_two_runs():
    calls = {"slow": 0}

    def slow():
        calls["slow"] += 1
        return 15.0

    settings = Measure(rounds=3, round_ms=5, warmup_ms=20, min_reps=3, max_reps=5, cliff_ratio=4)
    rounds = measure.alternating(FakeClock(), {"incumbent": lambda: 1.0, "fast": lambda: 0.9,
                                               "slow": slow}, settings)
    assert set(rounds.rounds) == {"incumbent", "fast"} and rounds.cliffs == {"slow": 15.0}
    assert calls["slow"] <= 1 + 10 + 2 * 3   # first call, host timing, two warm-ups of two runs
    # a slow start is retried, not dropped: it ran 15x for its first runs, then 0.9x
    late = {"n": 0}

    def slow_start():
        late["n"] += 1
        return 15.0 if late["n"] <= 14 else 0.9

    started = measure.alternating(FakeClock(), {"incumbent": lambda: 1.0, "late": slow_start},
                                  settings)
    assert set(started.rounds) == {"incumbent", "late"} and started.cliffs == {}
    # labels whose output is not checked (the control, PyTorch's versions) are never dropped
    kept = measure.alternating(FakeClock(), {"incumbent": lambda: 1.0, "torch": slow}, settings,
                               unverified={"torch"})
    assert set(kept.rounds) == {"incumbent", "torch"} and kept.cliffs == {}
    # an incumbent that warms up at no time at all (a launch shorter than an empty batch, at
    # a one-row shape on an H100) sets no cliff: there is nothing to be 4x slower than
    tiny = measure.alternating(FakeClock(), {"incumbent": lambda: 0.0, "other": lambda: 0.001},
                               settings)
    assert set(tiny.rounds) == {"incumbent", "other"} and tiny.cliffs == {}


def test_a_launch_shorter_than_the_timers_bracket_sets_no_cliff_by_its_ratio():
    # a warm-up is one launch less an empty batch's time; at a few microseconds (SwiGLU's
    # fp16 8 x 4096 on an H200) that difference read an honest edit 4.0x, and it was dropped
    from perfloop.referee.shape_timing import cliff_bound

    assert cliff_bound(4.0, 0.5, 0.01) == 2.0               # a launch longer than the bracket
    assert cliff_bound(4.0, 0.003, 0.012) == 4.0 * 0.012    # shorter: 4x the bracket's time
    assert cliff_bound(4.0, 0.0, 0.012) is None             # nothing to be 4x slower than
    assert cliff_bound(None, 0.5, 0.01) is None


def test_a_short_pad_grows_to_what_the_batch_needed_at_most_fourfold():
    from perfloop.referee.shape_timing import longer_pad

    assert longer_pad(200.0, 300.0) == 400.0        # doubled at least
    assert longer_pad(200.0, 480.0) == 600.0        # what it needed, with a quarter to spare
    assert longer_pad(200.0, 50_000.0) == 800.0     # one slow batch cannot set it alone


# ---- dispatch everywhere, the judge's and the warmers' processes, row buckets ---------------
def test_set_everywhere_moves_the_plain_value_and_every_entry_that_sets_the_knob():
    knobs = {"tile": (1, 1024), "occupancy": None,
             "dispatch": {"a": {"tile": [4, 0], "occupancy": 2}, "b": {"occupancy": 4}, "c": {}}}
    out = dispatch.set_everywhere(knobs, "tile", (2, 0))
    assert out["tile"] == (2, 0)
    assert out["dispatch"] == {"a": {"tile": [2, 0], "occupancy": 2}, "b": {"occupancy": 4},
                               "c": {}}
    assert knobs["dispatch"]["a"]["tile"] == [4, 0]                   # (a copy)
    assert dispatch.set_everywhere({"tile": (1, 1)}, "tile", (2, 0)) == {"tile": (2, 0)}


def test_judge_processes_are_at_most_one_per_cpu(monkeypatch):
    monkeypatch.setattr(judge_mod.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert [judge_mod.processes_for(n) for n in (0, 1, 2, 8)] == [1, 1, 2, 2]
    monkeypatch.setattr(judge_mod.os, "sched_getaffinity", lambda pid: set(range(16)),
                        raising=False)
    assert judge_mod.processes_for(8) == 8


def test_processes_share_whole_variants_or_one_variants_cases():
    v = [{"label": f"c{i}"} for i in range(5)]
    assert judge_mod.split(v, 4) == [([v[0], v[4]], None), ([v[1]], None), ([v[2]], None),
                                  ([v[3]], None)]
    assert judge_mod.split(v[:1], 4) == [([v[0]], (k, 4)) for k in range(4)]
    assert judge_mod.split(v[:3], 4) == [([v[0]], (0, 2)), ([v[0]], (1, 2)), ([v[1]], None),
                                      ([v[2]], None)]
    assert judge_mod.split(v[:2], 1) == [([v[0], v[1]], None)]


def test_warmers_build_and_launch_each_variant_in_their_own_processes(tmp_path, monkeypatch):
    """perfloop.child.warm, as the iteration starts it for GPU kernels while the judge runs."""
    import os

    from conftest import HANG_S, ROOT, SCRIPTED, FakeTime, eventually, pythonpath

    from perfloop.measure import phases

    dump = tmp_path / "env"
    dump.mkdir()
    env = {**os.environ, "PYTHONPATH": pythonpath(), "SCRIPTED_ENV_DUMP": str(dump)}
    folder = SCRIPTED / "kernel"
    variants = [{"label": f"v{i}", "folder": folder, "knobs": {"mode": "env", "tile": [1, i]}}
                for i in range(3)] + [{"label": "hang", "folder": folder, "knobs": {"mode": "hang"}}]
    shapes = [{"name": "head", "dims": [8], "dtype": "float32"}]

    def start(some):
        return phases.start_warmers(some, shapes, processes=2, contract=folder, work=tmp_path,
                                    cwd=ROOT, env=env)

    def finished(running, n):   # (v0 and v2 in one warmer; v1 and the hang in the other)
        eventually(lambda: sum(r.proc.poll() is not None for r in running) >= n,
                   f"{n} warmer(s) finishing")

    running = start(variants)
    assert len(running) == 2
    eventually(lambda: len(list(dump.glob("*.json"))) == 2, "both warmers building variants")
    finished(running, 1)
    assert phases.stop_warmers(running) == 1           # the one with the hanging variant was
    assert all(r.proc.poll() is not None for r in running)   # still at it, and is stopped
    # before a screening, perfloop waits for them: for the ones that finish, and no longer
    # than it was told for one that hangs (on a clock of the test's own: a loaded machine
    # takes any time to start a warmer, and the wait is what is tested)
    running = start(variants)
    finished(running, 1)
    clock = FakeTime()
    monkeypatch.setattr(phases, "time", clock)
    started = clock.monotonic()
    assert phases.wait_warmers(running, started + 5) == 1
    assert 5 <= clock.monotonic() - started < 5.5
    assert all(r.proc.poll() is not None for r in running)
    monkeypatch.undo()
    running = start(variants[:3])                       # nothing hangs: it waits for both
    assert phases.wait_warmers(running, time.monotonic() + HANG_S) == 2


def test_row_bucket_is_the_dtype_and_the_row_widths_power_of_two():
    class T:
        def __init__(self, dtype, shape):
            self.dtype, self.shape = dtype, shape

    assert dispatch.row_bucket((T("torch.bfloat16", (16384, 4096)),)) == "bfloat16/n<=4096"
    assert dispatch.row_bucket((T("torch.float32", (2, 2048, 5000)),)) == "float32/n<=8192"
    assert dispatch.row_bucket((T("torch.float16", (7, 1)),)) == "float16/n<=1"


def test_the_chosen_candidate_is_re_timed_without_the_cliff_drop(monkeypatch):
    # On an H100 a softmax candidate ran 1.26x the incumbent's time at one shape in the first
    # pass, then showed a 9.7x warm-up there when re-timed; dropped as a cliff, it left the
    # experiment with nothing timed (recorded as a crash). The re-timing pass has no cliff drop.
    import random
    from types import SimpleNamespace

    from perfloop.referee import launchers, replay, selection

    labels = ["incumbent", "incumbent-again", "a", "b"]
    crew = launchers.Roster.__new__(launchers.Roster)
    crew.failed, crew.launchers = {}, {label: object() for label in labels}
    spec = {"shapes": [{"name": "head", "dims": [8], "dtype": "float32"},
                       {"name": "guard", "dims": [8], "dtype": "float32"}],
            "headline": "head", "variants": [{"label": x} for x in labels]}
    seen = []
    ms = {"incumbent": 1.0, "incumbent-again": 1.0, "a": 0.9, "b": 0.95}

    def time_shape(shape, labels, seed, index, settings):
        seen.append((shape.name, tuple(labels), settings.cliff_ratio))
        return {"rounds": {label: [[ms[label]] * 3] * 3 for label in labels}}

    clock = FakeClock()
    clock.describe = lambda: {"clock": "fake"}
    shapes = SimpleNamespace(time_shape=time_shape, cliffed={}, gpu=False, simulated=None,
                             clock=clock, ceilings=None)
    replays = replay.Replays(crew, launchers.WallClock(), random.Random(1), lambda *a, **k: None)
    settings = Measure(rounds=3, round_ms=5, warmup_ms=20, min_reps=3, max_reps=5, cliff_ratio=4)
    w = selection.Selection(spec, settings, launchers.Release(labels, True, None), crew, shapes,
                            replays)
    monkeypatch.setattr(selection.envinfo, "capture", lambda gpu: {})
    result = w.run()
    assert result["best"] == "a" and len(result["passes"]) == 2
    first = [s for s in seen if "b" in s[1]]
    again = [s for s in seen if "b" not in s[1]]
    assert {s[2] for s in first} == {4} and len(first) == 2       # candidates: cliffs dropped
    assert {s[2] for s in again} == {None} and len(again) == 2    # the chosen one, re-timed: not
