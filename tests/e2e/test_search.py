"""Search beyond one-knob steps through runs of the scripted kernel (which buckets its inputs:
"big" for 600 values or more, so the shapes head and tail are big and guard is small): entries
of several knobs, per-shape dispatch, held-out shapes, the time budget, judging in processes
side by side, cliffs and screening. The pure functions: tests/unit/plan/test_search.py."""

import json
import os
import time
from pathlib import Path

import pytest
from conftest import git
from support.catalog import TOGETHER_ENTRY

from perfloop.core.vocab import StopReason
from perfloop.measure import judge as judge_mod
from perfloop.measure import phases
from perfloop.plan import budget, search


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
