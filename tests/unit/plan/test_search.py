"""Search beyond one-knob steps: per-shape dispatch, joint search, cliffs, the roofline stop.

Pure functions first, then runs of the scripted kernel (which buckets its inputs: "big" for
600 values or more, so the shapes head and tail are big and guard is small).
"""

import json
import os
import time
from pathlib import Path

import pytest
from conftest import ROOT, git

from perfloop.referee import clock as measure
from perfloop.contract import dispatch, knobspace
from perfloop.core import vocab
from perfloop.core.errors import UserError
from perfloop.contract.playbook import SHIPPED, DecisionRules, Measure, StopRules, load
from perfloop.core.stats import Comparison
from perfloop.core.vocab import Status, StopReason
from perfloop.measure import judge as judge_mod
from perfloop.measure import phases
from perfloop.plan import budget, decide, search

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
    won = decide.bucket_winners(first, {"c0": [1, 2048], "c1": [1, 512]}, "incumbent", RULES)
    # c0 gains 12.5% at worst in "big" (c1 only 10%); nothing wins "small" (c1's 0.2% is
    # under min_gain); held-back shapes do not choose
    assert set(won) == {"big"} and won["big"][0] == "c0"
    assert won["big"][1] == pytest.approx(0.125, abs=0.01)


def test_a_dispatch_is_decided_where_it_changed_and_only_if_a_held_back_shape_was_timed():
    summary = {"head": {"bucket": "big", "vs_incumbent": {"c": {"ratio": 1.0}}},
               "guard": {"bucket": "small", "vs_incumbent": {"c": {"ratio": 0.8}}},
               "held:head": {"bucket": "big", "held_back": True, "vs_incumbent": {"c": {"ratio": 1}}}}
    assert decide.dispatch_focus(summary, ["small"], "head", "c") == "guard"
    assert decide.dispatch_focus(summary, ["big", "small"], "head", "c") == "head"
    assert decide.dispatch_focus(summary, ["nowhere"], "head", "c") is None
    assert decide.ungeneralized(summary, ["big", "small"]) == ("small",)
    outcome = decide.Evidence(correct=True, headline="guard", ungeneralized=("small",),
                             comparisons={"guard": Comparison(0.8, 0.79, 0.81)})
    verdict = decide.decide(outcome, RULES)
    assert verdict.status is Status.REVERT and "held-back" in verdict.reason
    # without a gain the timer leaves the held-back shapes out: the row says why it reverted
    flat = decide.Evidence(correct=True, headline="guard", ungeneralized=("small",),
                           comparisons={"guard": Comparison(1.001, 0.999, 1.003)})
    verdict = decide.decide(flat, RULES)
    assert verdict.status is Status.REVERT and "no improvement" in verdict.reason


def _joint_kept(first: dict) -> list[dict]:
    """A baseline (commit c0) and a joint search kept at commit c1 with candidate-0's patch."""
    base = {"iteration": 0, "kind": "baseline", "status": "keep", "commit": "c0",
            "knobs": {"rows": 1, "occupancy": None, "dispatch": {"small": {"rows": 2}}}}
    labels = {"candidate-0": {"rows": 4, "occupancy": 2},
              "candidate-1": {"rows": 8, "occupancy": 4}}
    joint = {"iteration": 1, "kind": "playbook", "knob": "*", "optimization": "joint",
             "correctness": "PASS", "status": "keep", "commit": "c1", "incumbent_before": "c0",
             "knobs": {"rows": 4, "occupancy": 2, "dispatch": {"small": {"rows": 2}}},
             "sampler": {"name": "tpe"},
             "timing": {"chosen": "candidate-0", "labels": labels, "shapes": first}}
    return [base, joint]


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
    assert search.dispatch_changes(recs, "c1", knobs, RULES, "head") is None


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


def test_a_restricted_value_is_neither_offered_nor_taken_by_hand(scratch):
    with open(scratch.kernel / "kernel.py", "a") as f:
        f.write("\n\ndef restrict(knobs):\n"
                "    if knobs['persistent'] and knobs['occupancy'] is None:\n"
                "        return 'a persistent grid needs an occupancy'\n")
    scratch.commit_all("restrict")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, _ = scratch.cli("next", "--kernel", "scripted")
    offered = [sg["id"] for sg in out["suggestions"]]
    assert code == 0 and "occupancy" in offered and "persistent" not in offered
    code, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "persistent")
    assert code == 2 and "restrict()" in out["error"] and "\n" not in out["error"]
    code, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "persistent",
                               "--value", "true")
    assert code == 2 and out["error"].endswith("a persistent grid needs an occupancy")
    assert len(scratch.records()) == 1   # nothing was run


TOGETHER_ENTRY = """
[[optimization]]
id = "tile_occupancy"
title = "a wider tile with more blocks per SM"
family = "tile"
knobs = ["tile", "occupancy"]
values = [{tile = [1, 2048], occupancy = 2}, {tile = [1, 4096], occupancy = 4},
          {tile = [1, 1024], occupancy = 4}]
applies_to = ["memory-bound"]
priority = { memory-bound = 0 }
"""


def test_a_catalog_entry_moves_several_knobs_together(scratch):
    # neither knob gains alone; together they run 20% faster
    scratch.script([{"when": {"tile": [1, 2048], "occupancy": 2}, "factor": {"*": 0.8}}])
    with open(scratch.path / "playbook" / "catalog.toml", "a") as f:
        f.write(TOGETHER_ENTRY)
    manifest = scratch.kernel / "kernel.toml"
    plain = manifest.read_text()
    for bad, said in (('ocupancy = [1]', "knobs.json has no knob 'ocupancy'"),
                      ('"tile+num_ctas" = [{tile = [1, 2048], num_ctas = 2}]',
                       "knobs.json has no knob 'num_ctas'"),
                      ('"occupancy+tile" = [{tile = [1, 2048]}]', "each value must be a table")):
        manifest.write_text(f"{plain}\n[candidates]\n{bad}\n")
        scratch.commit_all("bad candidates")
        code, out, _ = scratch.cli("init", "--kernel", "scripted")
        assert code == 2 and said in out["error"] and "\n" not in out["error"], out
    # the kernel narrows the entry (its knobs named in any order)
    manifest.write_text(f"{plain}\n[candidates]\n"
                        '"occupancy+tile" = [{tile = [1, 2048], occupancy = 2}, '
                        '{tile = [1, 4096], occupancy = 4}]\n')
    scratch.commit_all("an entry of two knobs")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, _ = scratch.cli("next", "--kernel", "scripted")
    first = out["suggestions"][0]
    assert first["id"] == "tile_occupancy" and first["knob"] == search.MULTI
    assert first["knobs"] == ["tile", "occupancy"]
    assert first["candidates"] == [{"tile": [1, 2048], "occupancy": 2},
                                   {"tile": [1, 4096], "occupancy": 4}]
    code, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_occupancy",
                               "--value", '{"tile": [1, 1024], "occupancy": 4}')
    assert code == 2 and "is not a candidate" in out["error"]   # (the kernel's list holds)
    code, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_occupancy",
                               "--value", '{"tile": [1, 2048]}')
    assert code == 2 and "is a JSON object of tile, occupancy" in out["error"]
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_occupancy")
    assert code == 0, err
    rec = scratch.records()[-1]
    assert rec["status"] == "keep" and rec["decision"]["gain"] == pytest.approx(0.2, abs=0.01)
    knobs = json.loads((scratch.kernel / "knobs.json").read_text())
    assert knobs["tile"] == [1, 2048] and knobs["occupancy"] == 2
    assert "tile_occupancy: occupancy=2, tile=1x2048" in scratch.table()
    code, status, _ = scratch.cli("status", "--kernel", "scripted")
    assert status["experiments"][-1]["what"] == "tile_occupancy: occupancy=2, tile=1x2048"
    code, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_occupancy",
                               "--value", '{"tile": [1, 2048], "occupancy": 2}')
    assert code == 2 and "already has tile+occupancy=" in out["error"]


def test_an_entry_of_several_knobs_that_wins_on_one_bucket_is_dispatched_there(scratch):
    slower = {"head": 1.05, "tail": 1.05, "held:head": 1.05, "held:tail": 1.05}
    scratch.script([{"when": {"tile": [1, 2048], "occupancy": 2},
                     "factor": {**slower, "guard": 0.8, "held:guard": 0.8}}])
    with open(scratch.path / "playbook" / "catalog.toml", "a") as f:
        f.write(TOGETHER_ENTRY)
    scratch.commit_all("an entry of two knobs")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_occupancy")
    assert code == 0 and out["experiment"]["status"] == "revert", err
    assert out["next"][0] == "dispatch"
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "dispatch")
    assert code == 0 and out["experiment"]["status"] == "keep", err
    knobs = json.loads((scratch.kernel / "knobs.json").read_text())
    assert knobs["dispatch"] == {"big": {}, "small": {"occupancy": 2, "tile": [1, 2048]}}
    assert knobs["tile"] == [1, 1024] and knobs["occupancy"] is None


def test_an_entry_of_several_knobs_runs_in_every_bucket_like_a_one_knob_step(scratch):
    # The headline's bucket already runs the patch (an earlier run's dispatch): the entry
    # still runs in the plain knobs, so the other bucket is measured with it. Applied at the
    # headline's bucket only (as a joint search's patch is), the candidate was the incumbent
    # itself, and committing it ended the run in a git error (H100 matmul, persistent_tiles).
    scratch.script([{"when": {"tile": [1, 2048], "occupancy": 2},
                     "factor": {"guard": 0.8, "held:guard": 0.8}}])
    with open(scratch.path / "playbook" / "catalog.toml", "a") as f:
        f.write(TOGETHER_ENTRY)
    manifest = scratch.kernel / "kernel.toml"
    manifest.write_text(manifest.read_text() + '\n[candidates]\n'
                        '"occupancy+tile" = [{tile = [1, 2048], occupancy = 2}]\n')
    knobs_file = scratch.kernel / "knobs.json"
    knobs = json.loads(knobs_file.read_text())
    knobs["dispatch"] = {"big": {"occupancy": 2, "tile": [1, 2048]}, "small": {}}
    knobs_file.write_text(json.dumps(knobs))
    scratch.commit_all("the headline's bucket already runs the patch")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, _ = scratch.cli("next", "--kernel", "scripted")
    assert "tile_occupancy" in [sg["id"] for sg in out["suggestions"]]
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_occupancy")
    assert code == 0, err   # (no gain at the headline, which ran it already: reverted)
    rec = scratch.records()[-1]
    assert rec["every_bucket"] is True and rec["status"] == "revert", rec["reason"]
    assert rec["knobs"]["tile"] == [1, 2048] and rec["knobs"]["occupancy"] == 2
    assert rec["knobs"]["dispatch"]["big"] == {"occupancy": 2, "tile": [1, 2048]}
    assert git(scratch.path, "show", "--stat", "--format=", rec["commit"]) != ""
    # the win at the other bucket reaches it by the dispatch that follows
    assert out["next"][0] == "dispatch"
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "dispatch")
    assert code == 0 and out["experiment"]["status"] == "keep", err
    knobs = json.loads(knobs_file.read_text())
    assert knobs["dispatch"] == {"big": {"occupancy": 2, "tile": [1, 2048]},
                                 "small": {"occupancy": 2, "tile": [1, 2048]}}


def test_a_dispatch_that_regresses_in_one_bucket_is_kept_in_the_other(scratch):
    # 1x2048 wins the big bucket, 1x4096 the small one at its benchmark shape but loses at
    # the small bucket's held-back shape: the dispatch of both keeps big's entry only
    big = {"head": 0.7, "tail": 0.7, "held:head": 0.7, "held:tail": 0.7}
    scratch.script([
        {"when": {"tile": [1, 2048]}, "factor": {**big, "guard": 1.2, "held:guard": 1.2}},
        {"when": {"tile": [1, 4096]}, "factor": {**{k: 1.2 for k in big}, "guard": 0.8,
                                                 "held:guard": 1.3}}])
    manifest = scratch.kernel / "kernel.toml"
    manifest.write_text(manifest.read_text() + "\n[candidates]\ntile = [[1, 2048], [1, 4096]]\n")
    scratch.commit_all("two tiles")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape")
    assert code == 0 and out["experiment"]["status"] == "revert", err
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "dispatch")
    assert code == 0, err
    e = out["experiment"]
    assert e["status"] == "keep", e
    assert e["reason"].startswith("kept at big, not at small (regression on held:guard"), e
    knobs = json.loads((scratch.kernel / "knobs.json").read_text())
    assert knobs["dispatch"] == {"big": {"tile": [1, 2048]}, "small": {}}
    assert knobs["tile"] == [1, 1024]
    rec = scratch.records()[-1]
    assert rec["knobs"] == knobs and rec["value"] == knobs["dispatch"]
    assert rec["latency_ms"] == pytest.approx(0.7, rel=0.01)
    assert "dispatch: tile=1x2048 at big (not at small)" in scratch.table()
    assert git(scratch.path, "log", "-1", "--format=%s") == (
        "perfloop: iteration 2: dispatch: tile=1x2048 at big (not at small)")


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


def test_a_restrict_that_fails_is_refused_before_a_run_and_leaves_a_step_consistent(scratch):
    kernel_py = scratch.kernel / "kernel.py"
    plain = kernel_py.read_text()
    kernel_py.write_text(plain + "\n\ndef restrict(knobs):\n"
                         "    if knobs['occupancy'] == 8:\n        raise KeyError('boom')\n")
    scratch.commit_all("a restrict that fails for one candidate")
    code, out, _ = scratch.cli("init", "--kernel", "scripted")
    assert code == 2 and "restrict() failed: KeyError" in out["error"]
    assert scratch.branch() == "main" and not (scratch.path / "sandbox" / "scripted").exists()
    # one that fails only once a kept change is in force: after that experiment's record
    scratch.script([{"when": {"fast_math": True}, "factor": {"*": 0.9}}])
    kernel_py.write_text(plain + "\n\ndef restrict(knobs):\n"
                         "    if knobs['fast_math'] and knobs['occupancy'] == 2:\n"
                         "        raise KeyError('boom')\n")
    scratch.commit_all("a restrict that fails later")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 1 and out["error"].startswith("iteration 1 was recorded (keep)")
    assert "restrict() failed: KeyError" in out["error"]
    code, status, _ = scratch.cli("status", "--kernel", "scripted")
    assert status["in_flight"] is None and status["iterations"] == 2
    assert status["incumbent"]["iteration"] == 1 and status["incumbent"]["commit"] == scratch.head()
    assert scratch.table().count("\n| ") == 2   # the baseline's row and fast math's
    code, out, _ = scratch.cli("next", "--kernel", "scripted")
    assert code == 2 and "restrict() failed" in out["error"]
    # fixed where the run started, and started over
    from conftest import git

    git(scratch.path, "switch", "-q", "main")
    kernel_py.write_text(plain)
    scratch.commit_all("restrict fixed")
    code, out, err = scratch.cli("init", "--kernel", "scripted", "--new")
    assert code == 0 and out["experiment"]["status"] == "keep", err
    assert scratch.cli("next", "--kernel", "scripted")[0] == 0


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
    assert search.joint_tried_since_keep(recs + [{"optimization": "fast_math",
                                                  "status": "revert"}]) is False
    recs[-1]["status"] = "revert"
    assert search.joint_tried_since_keep(recs)
    recs[-1].update(status="keep", sampler={"name": "all"})   # the whole space was measured
    assert search.joint_tried_since_keep(recs)


# ---- the joint search's space -------------------------------------------------------------
def _step(knob, before, ratios: dict, iteration=1):
    labels = {f"c{i}": v for i, v in enumerate(ratios)}
    return {"iteration": iteration, "kind": "playbook", "knob": knob, "correctness": "PASS",
            "status": "revert", "optimization": knob, "incumbent_value": before,
            "timing": {"labels": labels, "shapes": {"head": {"vs_incumbent": {
                f"c{i}": {"ratio": r} for i, r in enumerate(ratios.values())}}}}}


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
    tiles = _step("tile", [64, 64, 32], {(128, 128, 64): 0.34})
    tiles["outcomes"] = {"c0": {"outcome": "ok", "value": [128, 128, 64]},
                         "c1": {"outcome": "slow", "value": [128, 256, 64]}}
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
    group = _step("group", None, {8: 0.92, 4: 0.93})
    persistent = _step("persistent", False, {True: 0.91}, iteration=2)
    occupancy = _step("occupancy", None, {1: 0.999, 2: 1.001}, iteration=3)
    for r in (group, persistent, occupancy):
        r["timing"]["shapes"]["head"]["bucket"] = "bf16/large"
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
    return {"iteration": iteration, "kind": "playbook", "knob": "*", "correctness": "PASS",
            "status": "revert", "optimization": "joint", "incumbent_value": None,
            "outcomes": {label: {"value": p, "outcome": "ok" if label in first else "screened",
                                 "reason": ""} for label, p in labels.items()},
            "screening": {"shape": "head", "ratios": ratios},
            "timing": {"labels": {k: labels[k] for k in first},
                       "shapes": {"head": {"vs_incumbent": first}}}}


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
    baseline = {"iteration": 0, "kind": "baseline", "status": "keep", "optimization": "baseline",
                "knobs": {k: 1 for k in "abcd"}}
    kept = dict(_step("a", 1, {2: 0.9}, iteration=1), status="keep",
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


def test_a_run_stops_when_its_next_suggestion_would_pass_the_time_budget(scratch):
    scratch.rules(time_budget_s="1")
    scratch.commit_all("a budget of 1 s")
    code, init, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0, err
    stopped = init["status"]
    assert stopped["stopped_by"] == "time-budget", stopped
    assert "s of experiments spent, and the next, estimated at" in stopped["stopped"]


def test_an_experiment_over_what_is_left_of_the_budget_waits_behind_one_that_fits(
        scratch, monkeypatch):
    # on the H100 RMSNorm stopped with 72 s of its budget left before a 91 s joint search,
    # while a one-candidate step (persistent, about as long as the slowest step) was on offer
    scratch.rules(time_budget_s="300")
    scratch.commit_all("a budget of 300 s")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    monkeypatch.chdir(scratch.path)
    from perfloop.plan import planner
    from perfloop.run import planning
    from perfloop.store.session import Session

    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 0, err
    session = Session("scripted")
    ranked = [sg.optimization.id for sg in planner.plan(planning.view(session))[1]]
    # 200 s spent in 4 experiments of 50 s: a step of 5 candidates is estimated at 50 x 7/3 s,
    # one of a single candidate at 50 s; 100 s are left
    monkeypatch.setattr(planner, "spent", lambda recs: [budget.Spent(budget.STEP, 50.0)] * 4)
    fit = planner.plan(planning.view(session))[1]
    fits = {sg.optimization.id: planner.estimate(planning.view(session), sg) <= 100 for sg in fit}
    assert not fits[ranked[0]] and any(fits.values()), fits  # the first by rank does not fit
    assert sorted(sg.optimization.id for sg in fit) == sorted(ranked)
    fitting = [i for i in ranked if fits[i]]
    assert [sg.optimization.id for sg in fit] == fitting + [i for i in ranked if i not in fitting]
    assert all("left of the time budget" in sg.reason for sg in fit[len(fitting):])
    assert not any("left of the time budget" in sg.reason for sg in fit[:len(fitting)])
    # ... so the one that fits runs, and the run goes on
    assert planner.plan(planning.view(session))[0] is None
    # with 20 s left, none fits: the run stops, and says so
    monkeypatch.setattr(planner, "spent", lambda recs: [budget.Spent(budget.STEP, 70.0)] * 4)
    assert [sg.optimization.id for sg in planner.plan(planning.view(session))[1]] == ranked
    stop = planner.plan(planning.view(session))[0]
    assert stop.reason is StopReason.TIME_BUDGET and "(none on offer fits); never tried: " in \
        stop.detail and stop.never_tried == tuple(ranked)


def test_a_stop_held_off_by_the_searches_lets_no_catalog_step_in_ahead_of_them(
        scratch, monkeypatch):
    scratch.script(TOGETHER_SMALL)
    scratch.rules(time_budget_s="300")
    scratch.commit_all("script, a budget of 300 s")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    for opt in ("fast_math", "occupancy", "persistent"):
        code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", opt)
        assert code == 0 and out["experiment"]["status"] == "revert", err
    monkeypatch.chdir(scratch.path)
    from perfloop.plan import planner
    from perfloop.run import planning
    from perfloop.store.session import Session

    session = Session("scripted")
    # 3 reverts in a row: the streak stops the run once the joint searches are done. 240 s
    # spent, 60 left: the catalog's tile step (30 s by the steps before) would fit, the joint
    # searches (150 s and more, by the one before) would not
    steps = [budget.Spent(budget.STEP, 30.0, timed=6)] * 3
    monkeypatch.setattr(planner, "spent",
                        lambda recs: steps + [budget.Spent(budget.JOINT, 150.0, timed=5)])
    offered = planner.plan(planning.view(session))[1]
    ids = [sg.optimization.id for sg in offered]
    assert ids == ["joint", "bucket-joint", "tile_shape"], ids
    assert "left of the time budget" in offered[0].reason
    assert "left of the time budget" not in offered[-1].reason   # it would fit
    # the streak the searches held off ends the run, and says why now
    stop = planner.plan(planning.view(session))[0]
    assert stop.reason is StopReason.NO_IMPROVEMENT, stop
    assert "every bucket has stopped" in stop.detail and "no improvement in 3" in stop.detail
    assert "estimated at 150 s" in stop.detail


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
        extra = {"screening": {"shape": "guard", "ratios": {}}}

    got = budget.spent(Rec())   # (the screening's compiles are a part of its 40 s)
    assert got == budget.Spent(budget.JOINT, 100.0, timed=4, screened=30, screen_s=40.0)
    assert got.rest_s == 60.0
    # cliffs dropped while screening: the finalists were still timed to the end
    Rec.outcomes = {**Rec.outcomes, "c4": {"outcome": "slow"}, "c5": {"outcome": "slow"}}
    assert budget.spent(Rec()) == got and got.reference
    Rec.extra = {}   # screening that failed measured no rate
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
    return {"iteration": iteration, "kind": "playbook", "knob": knob, "status": status,
            "optimization": optimization or knob, "correctness": "PASS",
            "incumbent_value": None, "knobs": knobs or {}, "sampler": sampler,
            "timing": {"labels": {"candidate-0": value}, "shapes": shapes}}


def test_a_bucket_reads_its_own_one_knob_ratios_and_skips_knobs_it_dispatched():
    base = {"iteration": 0, "kind": "baseline", "status": "keep", "optimization": "baseline",
            "knobs": {"occupancy": None, "rows": 1, "dispatch": {"small": {"rows": 4}}}}
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
    from perfloop.referee.timer import cliff_bound

    assert cliff_bound(4.0, 0.5, 0.01) == 2.0               # a launch longer than the bracket
    assert cliff_bound(4.0, 0.003, 0.012) == 4.0 * 0.012    # shorter: 4x the bracket's time
    assert cliff_bound(4.0, 0.0, 0.012) is None             # nothing to be 4x slower than
    assert cliff_bound(None, 0.5, 0.01) is None


def test_a_short_pad_grows_to_what_the_batch_needed_at_most_fourfold():
    from perfloop.referee.timer import longer_pad

    assert longer_pad(200.0, 300.0) == 400.0        # doubled at least
    assert longer_pad(200.0, 480.0) == 600.0        # what it needed, with a quarter to spare
    assert longer_pad(200.0, 50_000.0) == 800.0     # one slow batch cannot set it alone


# ---- runs of the scripted kernel -------------------------------------------------------------
SPLIT = [{"when": {"tile": [1, 2048]},
          "factor": {"head": 0.8, "tail": 0.8, "held:head": 0.8, "held:tail": 0.8,
                     "guard": 1.3, "held:guard": 1.3}}]


def test_a_value_that_wins_only_on_some_buckets_is_kept_there_by_a_dispatch(scratch):
    scratch.script(SPLIT)
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape")
    assert code == 0, err
    # 1x2048 is 20% faster at head and tail but 30% slower at guard: the candidate carried
    # into the decision is one slower nowhere, which gains nothing
    assert out["experiment"]["status"] == "revert"
    assert out["next"][0] == "dispatch"
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "dispatch")
    assert code == 0, err
    rec = scratch.records()[-1]
    assert rec["status"] == "keep" and rec["decision"]["gain"] == pytest.approx(0.2, abs=0.01)
    assert "tile=1x2048 at big" in rec["describe"]
    assert rec["knobs"]["dispatch"] == {"big": {"tile": [1, 2048]}, "small": {}}
    knobs = json.loads((scratch.kernel / "knobs.json").read_text())
    assert knobs["dispatch"] == {"big": {"tile": [1, 2048]}, "small": {}}
    assert knobs["tile"] == [1, 1024]
    # the held-back shapes of the changed bucket were timed (and their outputs checked); the
    # small bucket runs the incumbent's code in every variant: not timed, nor its held-back
    shapes = rec["timing"]["shapes"]
    assert set(shapes) == {"head", "tail", "held:head", "held:tail"}
    assert all(sh["bucket"] == "big" for sh in shapes.values())
    assert rec["correctness"] == "PASS" and rec["correctness_detail"]["passed"]
    assert "dispatch: tile=1x2048 at big" in scratch.table()
    # nothing more to dispatch: the same split is not proposed twice
    code, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "dispatch")
    assert code == 2 and "no dispatch experiment" in out["error"]


def test_a_step_reaches_a_bucket_whose_entry_sets_its_knob(scratch):
    """An earlier run left occupancy 2 in the small bucket's entry. A one-knob occupancy step
    runs its value there too (in the old way the entry kept it from the small bucket for
    ever): 8 is 30% slower at the big bucket, 20% faster at the small one, so the step is
    reverted and the dispatch that follows it keeps 8 in the small bucket's entry."""
    knobs_path = scratch.kernel / "knobs.json"
    knobs = json.loads(knobs_path.read_text())
    knobs_path.write_text(json.dumps({**knobs, "dispatch": {"big": {}, "small": {"occupancy": 2}}}))
    slow_big = {n: 1.3 for n in ("head", "tail", "held:head", "held:tail")}
    scratch.script([{"when": {"occupancy": 8},
                     "factor": {**slow_big, "guard": 0.8, "held:guard": 0.8}}])
    scratch.commit_all("script, an entry from an earlier run")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "occupancy",
                                 "--value", "8")
    assert code == 0, err
    step = scratch.records()[-1]
    assert step["status"] == "revert" and step["every_bucket"] is True
    guard = step["timing"]["shapes"]["guard"]["vs_incumbent"]
    assert guard[step["timing"]["chosen"]]["ratio"] == pytest.approx(0.8, abs=0.02)
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "dispatch")
    assert code == 0, (out, err)
    rec = scratch.records()[-1]
    assert rec["status"] == "keep", rec["decision"]
    assert rec["knobs"]["dispatch"] == {"big": {}, "small": {"occupancy": 8}}
    assert json.loads(knobs_path.read_text())["occupancy"] is None


def test_set_everywhere_moves_the_plain_value_and_every_entry_that_sets_the_knob():
    knobs = {"tile": (1, 1024), "occupancy": None,
             "dispatch": {"a": {"tile": [4, 0], "occupancy": 2}, "b": {"occupancy": 4}, "c": {}}}
    out = dispatch.set_everywhere(knobs, "tile", (2, 0))
    assert out["tile"] == (2, 0)
    assert out["dispatch"] == {"a": {"tile": [2, 0], "occupancy": 2}, "b": {"occupancy": 4},
                               "c": {}}
    assert knobs["dispatch"]["a"]["tile"] == [4, 0]                   # (a copy)
    assert dispatch.set_everywhere({"tile": (1, 1)}, "tile", (2, 0)) == {"tile": (2, 0)}


def test_rules_can_turn_dispatch_off(scratch):
    scratch.script(SPLIT)
    scratch.rules(dispatch="false")
    scratch.commit_all("script, no dispatch")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    assert scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape")[0] == 0
    code, out, _ = scratch.cli("next", "--kernel", "scripted")
    assert code == 0 and "dispatch" not in [sg["id"] for sg in out["suggestions"]]
    code, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "dispatch")
    assert code == 2 and "no dispatch experiment" in out["error"]


@pytest.mark.parametrize("processes", [1, 3])
def test_candidates_are_judged_in_processes_side_by_side(scratch, processes):
    scratch.script([{"when": {"tile": [1, 2048]}, "factor": {"*": 0.9}}])
    scratch.rules(judge_processes=str(processes))
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape")
    assert code == 0 and out["experiment"]["value"] == [1, 2048], err
    rec = scratch.records()[-1]
    processes = judge_mod.processes_for(processes)  # (at most one per CPU: 2 in CI)
    assert rec["compile_ahead"]["judge_processes"] == processes
    assert all(o["outcome"] == "ok" for o in rec["outcomes"].values())
    requests = [json.loads(p.read_text()) for p in
                (scratch.path / "sandbox").rglob("iter-01*/k-*/request.json")]
    judged = sorted(v["label"] for r in requests for v in r["variants"])
    assert len(requests) == processes and judged == sorted(rec["outcomes"])


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


def _judge_in_shards(scratch, work: Path, processes: int = 4, **modes):
    knobs = json.loads((scratch.kernel / "knobs.json").read_text())
    variants = [{"label": label, "folder": str(scratch.kernel), "knobs": {**knobs, "mode": mode}}
                for label, mode in modes.items()]
    return judge_mod.judge(scratch.tree(), variants,
                        root=scratch.path, work=work, deadline=time.monotonic() + 300,
                        stall_s=120, env=phases.child_env(scratch.path / "playbook"),
                        processes=processes, share_cases=True)


def test_one_candidates_cases_are_judged_once_each_in_shards_side_by_side(scratch, tmp_path):
    """One candidate, four judge processes, three cases: each case is judged in exactly one
    of them, and the process whose shard holds none of the cases is no failure."""
    res = _judge_in_shards(scratch, tmp_path, c0="ok")
    assert res.processes == 4 and res.passed == {"c0": True} and not res.crashed
    assert sorted(c["case"] for c in res.cases["c0"]) == ["n=1", "n=1000", "n=5"]
    shards = [json.loads(p.read_text())["shard"] for p in tmp_path.glob("k-*/request.json")]
    assert sorted(map(tuple, shards)) == [(k, 4) for k in range(4)]


def test_a_case_failed_or_cut_short_in_one_shard_fails_or_rejudges_the_whole_candidate(
        scratch, tmp_path):
    """Three candidates, six processes (two shards each): one is wrong only at
    n = 1000, one ends its process at n = 5 (os._exit(0)), one ends pytest's session there
    (pytest.exit(returncode=0)); the first fails on that case, the others are judged again
    whole, where they end early again: crashes, not passes on the cases they reached."""
    res = _judge_in_shards(scratch, tmp_path, 6, wrong="wrong-above-100", quits="exit-at-5",
                           stops="stop-at-5")
    assert res.passed.get("wrong") is False
    assert [c["case"] for c in res.cases["wrong"] if not c["passed"]] == ["n=1000"]
    assert "quits" not in res.passed and "without finishing" in res.crashed["quits"]
    assert "stops" not in res.passed and "ended after 1 of 3 cases" in res.crashed["stops"]
    requests = [json.loads(p.read_text()) for p in tmp_path.glob("k-*/request.json")]
    whole = sorted(v["label"] for r in requests if "shard" not in r for v in r["variants"])
    assert len(requests) == 8 and whole == ["quits", "stops"]


def test_a_dispatch_that_loses_on_a_held_back_shape_is_reverted(scratch):
    overfit = [{**SPLIT[0], "factor": {**SPLIT[0]["factor"], "held:tail": 1.3}}]
    scratch.script(overfit)
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    assert scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "dispatch")
    assert code == 0, err
    assert out["experiment"]["status"] == "revert" and "held:tail" in out["experiment"]["reason"]
    assert "dispatch" not in json.loads((scratch.kernel / "knobs.json").read_text())


WORKLOAD = ('\n[workload]\ndims = ["n"]\nn = [1500, 3000]\ndtypes = ["float32"]\n'
            'held_out = 2\nseed = 5\n')


def test_a_dispatch_times_the_shapes_drawn_from_a_declared_workload(scratch):
    """With [workload] and no [[held_back]], a dispatch is checked at the shapes drawn from the
    workload with the run's seed, and at one held-back shape derived in each changed bucket
    (drawn shapes may all fall in another bucket)."""
    toml = scratch.kernel / "kernel.toml"
    toml.write_text(toml.read_text() + WORKLOAD)
    scratch.script([{**SPLIT[0], "factor": {**SPLIT[0]["factor"], "*": 0.8}}])
    scratch.commit_all("script, workload")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    assert json.loads((scratch.path / "sandbox" / "scripted" / "state.json").read_text())[
        "workload_seed"] == 5
    assert scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "dispatch")
    assert code == 0, err
    rec = scratch.records()[-1]
    assert rec["status"] == "keep", out["experiment"]["reason"]
    assert set(rec["timing"]["shapes"]) == {"head", "tail", "held:head", "held:tail",
                                            "held:fp32:1500", "held:fp32:3000"}
    # the hook runs 1500 and 3000 in its measured "big" bucket: routed from nowhere (the
    # workload's buckets of them, which no benchmark shape falls in, are not the hook's)
    assert rec["timing"]["shapes"]["held:fp32:1500"]["bucket"] == "big"
    assert not any("routed_from" in sh for sh in rec["timing"]["shapes"].values())


@pytest.mark.parametrize("held_3000, status", [(0.8, "keep"), (1.3, "revert")])
def test_with_a_workload_every_step_is_checked_at_its_held_out_shapes(scratch, held_3000,
                                                                     status):
    """A change 20% faster at every benchmark shape is kept only if no held-out shape of the
    workload got slower; the row's reason names the one that did."""
    toml = scratch.kernel / "kernel.toml"
    toml.write_text(toml.read_text() + WORKLOAD)
    scratch.script([{"when": {"tile": [1, 2048]},
                     "factor": {"*": 0.8, "held:fp32:3000": held_3000}}])
    scratch.commit_all("script, workload")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    assert set(scratch.records()[0]["timing"]["shapes"]) == {"head", "guard", "tail"}
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape",
                                 "--value", "[1, 2048]")
    assert code == 0, err
    rec = scratch.records()[-1]
    assert set(rec["timing"]["shapes"]) == {"head", "guard", "tail", "held:head", "held:guard",
                                            "held:tail", "held:fp32:1500", "held:fp32:3000"}
    assert rec["status"] == status, out["experiment"]["reason"]
    if status == "revert":
        assert "regression on held:fp32:3000" in out["experiment"]["reason"]


POW2_HOOK = 'return f"float32/n<={1 << (len(inputs[1]) - 1).bit_length()}"'


@pytest.mark.parametrize("held_3000, status", [(0.8, "keep"), (1.3, "revert")])
def test_a_held_out_shape_in_an_unmeasured_bucket_counts_where_it_runs(scratch, held_3000,
                                                                       status):
    """A kernel with its own bucket() hook: held-out shapes of 1500 and 3000 fall in buckets
    no benchmark shape falls in, so their launches run as the nearest measured bucket
    (n<=1024, head's); a dispatch change there is timed at them and reverted when one got
    slower. The committed table lists every measured bucket, so a launch routes as timed."""
    kernel_py = scratch.kernel / "kernel.py"
    kernel_py.write_text(kernel_py.read_text().replace(
        'return "big" if len(inputs[1]) >= 600 else "small"', POW2_HOOK))
    toml = scratch.kernel / "kernel.toml"
    toml.write_text(toml.read_text() + WORKLOAD)
    scratch.script([{**SPLIT[0], "factor": {**SPLIT[0]["factor"], "held:fp32:1500": 0.8,
                                            "held:fp32:3000": held_3000}}])
    scratch.commit_all("a power-of-two bucket hook, a workload")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    assert scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "dispatch")
    assert code == 0, err
    rec = scratch.records()[-1]
    shapes = rec["timing"]["shapes"]
    assert shapes["held:fp32:3000"]["bucket"] == "float32/n<=1024"
    assert shapes["held:fp32:1500"]["bucket"] == "float32/n<=1024"
    assert shapes["held:fp32:3000"]["routed_from"] == "float32/n<=4096"   # its own, kept
    assert shapes["held:fp32:1500"]["routed_from"] == "float32/n<=2048"
    # (the workload's own buckets, which the parent names, are not the hook's)
    assert [n for n, sh in shapes.items() if "routed_from" in sh] == [
        n for n in shapes if n.startswith("held:fp32:")]
    assert rec["status"] == status, out["experiment"]["reason"]
    knobs = json.loads((scratch.kernel / "knobs.json").read_text())
    if status == "revert":
        assert "regression on held:fp32:3000" in out["experiment"]["reason"]
        assert "dispatch" not in knobs
    else:
        assert knobs["dispatch"] == {"float32/n<=1024": {"tile": [1, 2048]},
                                     "float32/n<=256": {}}


def test_a_cliff_candidate_is_dropped_early_and_the_others_are_decided(scratch):
    running = set(os.listdir("/proc"))   # (another process's shared memory is not ours)
    scratch.script([{"when": {"occupancy": 2}, "factor": {"*": 15}},
                    {"when": {"occupancy": 8}, "factor": {"*": 0.9}}])
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "occupancy")
    assert code == 0, err
    rec = scratch.records()[-1]
    slow = [o for o in rec["outcomes"].values() if o["value"] == 2]
    assert slow[0]["outcome"] == "slow" and "cliff" in slow[0]["reason"]
    assert rec["status"] == "keep" and rec["value"] == 8
    assert all(o["outcome"] == "ok" for o in rec["outcomes"].values() if o["value"] != 2)
    # the timer's CPU slots (files in /dev/shm) went with it, the dropped launcher's too
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("torch_")
                and n.split("_")[1] not in running], "shared memory left behind"


def test_a_candidate_that_fails_to_compile_is_recorded_and_the_others_go_on(scratch):
    scratch.add_optimization("modes", "mode", ["compile-error", "fine"])
    scratch.script([{"when": {"mode": "fine"}, "factor": {"*": 0.9}}])
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "modes")
    assert code == 0, err
    rec = scratch.records()[-1]
    failed = [o for o in rec["outcomes"].values() if o["value"] == "compile-error"]
    assert failed[0]["outcome"] in ("fail", "crash")
    assert rec["status"] == "keep" and rec["value"] == "fine"


def test_many_candidates_are_screened_at_the_headline_and_the_fastest_few_go_on(scratch):
    scratch.add_optimization("many", "occupancy", list(range(1, 13)))
    scratch.script([{"when": {"occupancy": 7}, "factor": {"*": 0.8}},
                    {"when": {"occupancy": 5}, "factor": {"*": 0.9}},
                    {"when": {"occupancy": 3}, "factor": {"*": 15}}])
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "many")
    assert code == 0, err
    rec = scratch.records()[-1]
    by_value = {o["value"]: o for o in rec["outcomes"].values()}
    assert len(by_value) == 12 and rec["phases_s"]["screen"] > 0
    assert by_value[3]["outcome"] == "slow"
    judged = sorted(v for v, o in by_value.items() if o["outcome"] == "ok")
    screened = [v for v, o in by_value.items() if o["outcome"] == "screened"]
    assert 7 in judged and 5 in judged and len(judged) == 4 and len(screened) == 7
    assert all("screened out" in by_value[v]["reason"] for v in screened)
    assert rec["status"] == "keep" and rec["value"] == 7
    # only the finalists were judged and timed in full
    assert set(rec["correctness_detail"]["cases"]) == {
        label for label, o in rec["outcomes"].items() if o["outcome"] == "ok"}


# fast_math and occupancy 2 gain nothing alone anywhere (fast_math costs 10% in "big"), but
# together run the small bucket 28% faster; persistent costs 2% there (10% in "big")
BIG_10 = {"head": 1.1, "tail": 1.1, "held:head": 1.1, "held:tail": 1.1}
TOGETHER_SMALL = [
    {"when": {"fast_math": True}, "factor": BIG_10},
    {"when": {"fast_math": True, "occupancy": 2}, "factor": {"guard": 0.72, "held:guard": 0.72}},
    {"when": {"persistent": True}, "factor": {**BIG_10, "guard": 1.02, "held:guard": 1.02}}]


def test_a_config_that_wins_only_in_another_bucket_is_found_by_its_own_joint_search(
        scratch, monkeypatch):
    scratch.script(TOGETHER_SMALL)
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    for opt in ("fast_math", "occupancy", "persistent"):
        code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", opt)
        assert code == 0 and out["experiment"]["status"] == "revert", err
    # no one-knob value won the small bucket; its own joint search is on offer (beside the
    # headline's, of occupancy and persistent, without fast_math, which lost 10% there)
    code, out, _ = scratch.cli("next", "--kernel", "scripted")
    offered = {sg["id"]: sg for sg in out["suggestions"]}
    assert "fast_math" not in offered["joint"]["reason"]
    assert offered["joint"]["knobs"] == ["occupancy", "persistent"]
    assert "fast_math" in offered["bucket-joint"]["reason"]
    assert out["suggestions"][0]["id"] in search.IDS  # (the streak of 2 would stop the run)
    # with no stop rule due, the joint searches go before the catalog once its next step and
    # two of them would not fit in the time budget (500 s) by the estimates: 4 experiments of
    # 50 s spent, the tile step's 6 candidates 50 x 8 / 3 s, the joint's 5 configs 50 x 7 / 3 s,
    # the bucket joint's 16 configs 16 x 1.7 s of screening and 50 x 6 / 3 s of the rest: 577 s
    # (at 30 s each: 357 s). The slowest-so-far rule saw 200 + 3 x 50 = 350 s: room enough
    monkeypatch.chdir(scratch.path)
    from perfloop.plan import planner
    from perfloop.run import planning
    from perfloop.store.session import Session

    session = Session("scripted")
    monkeypatch.setattr(planner.decide, "stop_reason", lambda *a, **k: None)
    for each, first in ((30.0, False), (50.0, True)):
        monkeypatch.setattr(planner, "spent", lambda recs: [budget.Spent(budget.STEP, each)] * 4)
        assert (planner.plan(planning.view(session))[1][0].optimization.id in search.IDS) is first, each
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "bucket-joint")
    assert code == 0, err
    rec = scratch.records()[-1]
    # every config of fast_math x occupancy x persistent moving two knobs or more (16), as
    # dispatch tables that change the small bucket only, screened at its shape
    assert rec["optimization"] == "bucket-joint" and len(rec["candidates"]) == 16
    assert all(set(t) == {"small"} for t in rec["candidates"])
    assert rec["sampler"]["shape"] == "guard" and rec["sampler"]["bucket"] == "small"
    assert rec["screening"]["shape"] == "guard" and len(rec["screening"]["ratios"]) == 16
    assert rec["status"] == "keep" and rec["decision"]["gain"] == pytest.approx(0.28, abs=0.01)
    assert rec["knobs"]["dispatch"] == {"big": {}, "small": {"fast_math": True, "occupancy": 2}}
    assert rec["knobs"]["fast_math"] is False        # the headline's knobs are untouched
    # timed where the tables differ (the small bucket: guard and its held-back shape) and at
    # the headline; tail runs the incumbent's code in every candidate
    assert set(rec["timing"]["shapes"]) == {"head", "guard", "held:guard"}
    # the report takes each shape's time from the latest experiment that timed it
    code, report, _ = scratch.cli("report", "--kernel", "scripted")
    by_shape = {sh["shape"]: sh for sh in report["shapes"]}
    assert by_shape["guard"]["incumbent_iteration"] == 4
    assert by_shape["tail"]["incumbent_iteration"] == 0 and by_shape["tail"]["incumbent_ms"]
    assert "joint at small: fast_math=true, occupancy=2" in scratch.table()
    # measured once: not offered again, and `step` says why in one line
    code, out, _ = scratch.cli("next", "--kernel", "scripted")
    assert "bucket-joint" not in [sg["id"] for sg in out["suggestions"]]
    code, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "bucket-joint")
    assert code == 2 and "no bucket-joint experiment" in out["error"]


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
    from perfloop.referee import timer as worker

    w = worker.Timer.__new__(worker.Timer)
    w.settings = Measure(rounds=3, round_ms=5, warmup_ms=20, min_reps=3, max_reps=5, cliff_ratio=4)
    w.failed, w.cliffed, w.select, w.gpu, w.simulated = {}, {}, True, False, None
    w.labels = ["incumbent", "incumbent-again", "a", "b"]
    w.launchers = {label: object() for label in w.labels}
    w.clock = FakeClock()
    w.clock.describe = lambda: {"clock": "fake"}
    w.spec = {"shapes": [{"name": "head", "dims": [8], "dtype": "float32"},
                         {"name": "guard", "dims": [8], "dtype": "float32"}],
              "headline": "head", "variants": [{"label": x} for x in
                                                ("incumbent", "incumbent-again", "a", "b")]}
    seen = []
    ms = {"incumbent": 1.0, "incumbent-again": 1.0, "a": 0.9, "b": 0.95}

    def time_shape(shape, labels, seed, index, settings):
        seen.append((shape.name, tuple(labels), settings.cliff_ratio))
        return {"rounds": {label: [[ms[label]] * 3] * 3 for label in labels}}

    monkeypatch.setattr(w, "_time_shape", time_shape)
    monkeypatch.setattr(worker.envinfo, "capture", lambda gpu: {})
    result = w.run()
    assert result["best"] == "a" and len(result["passes"]) == 2
    first = [s for s in seen if "b" in s[1]]
    again = [s for s in seen if "b" not in s[1]]
    assert {s[2] for s in first} == {4} and len(first) == 2       # candidates: cliffs dropped
    assert {s[2] for s in again} == {None} and len(again) == 2    # the chosen one, re-timed: not
