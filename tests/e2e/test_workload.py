"""A workload through the loop: a kernel without a bucket() hook keeps a knob where it wins
by a dispatch, and a declared workload's held-out shapes time only the chosen candidate (the
workload alone, in-process: tests/unit/contract/test_workload.py)."""


def _without_bucket_hook(scratch) -> None:
    """The scripted kernel as the README writes one: no bucket(), no dispatch code of its own
    (perfloop routes its launches by the buckets it derives from the benchmark's shapes)."""
    path = scratch.kernel / "kernel.py"
    text = path.read_text()
    text = text.replace('def bucket(inputs) -> str:\n    return "big" if len(inputs[1]) >= 600 '
                        'else "small"\n', "")
    text = text.replace("dispatch.build(knobs, _build_one, bucket)",
                        "dispatch.build(knobs, _build_one)")
    assert "def bucket" not in text and "_build_one, bucket" not in text
    path.write_text(text)


def test_a_knob_that_wins_on_one_bucket_and_loses_on_another_is_kept_where_it_wins(scratch):
    # fast math: 20% faster at the head (1024) and tail (1000) rows, 30% slower at the guard's
    # 256 (buckets d0<=1024 and d0<=256, derived from what varies among the shapes)
    _without_bucket_hook(scratch)
    scratch.script([{"when": {"fast_math": True},
                     "factor": {"*": 0.8, "guard": 1.3, "held:guard": 1.3}}])
    scratch.rules(max_iterations="2")
    scratch.commit_all("no bucket hook")
    code, out, err = scratch.cli("run", "--kernel", "scripted")
    assert code == 0, err
    recs = scratch.records()
    step, routed = recs[1], recs[2]
    assert step["optimization"] == "fast_math" and step["status"] == "revert"
    assert "regression on guard" in step["decision"]["reason"]
    assert {n: sh["bucket"] for n, sh in step["timing"]["shapes"].items()} == {
        "head": "d0<=1024", "guard": "d0<=256", "tail": "d0<=1024"}
    # the win is not thrown away with the loss: fast math is kept in the head's bucket only,
    # checked there at the held-back shapes that run as it
    assert routed["optimization"] == "dispatch" and routed["status"] == "keep", routed["decision"]
    assert routed["knobs"]["dispatch"] == {"d0<=1024": {"fast_math": True}, "d0<=256": {}}
    assert {"held:head", "held:tail"} <= set(routed["timing"]["shapes"])
    assert "guard" not in routed["timing"]["shapes"]
    code, report, _ = scratch.cli("report", "--kernel", "scripted")
    assert code == 0
    speedups = {sh["shape"]: sh["speedup"] for sh in report["shapes"]}
    assert speedups["head"] > 1.15 and speedups["tail"] > 1.15
    assert 0.97 < speedups["guard"] < 1.03


def _init_with_workload(scratch, tile_factor: float) -> None:
    """A declared workload of 200-1100 values, tile 1x2048 scripted at `tile_factor` of the
    time at every shape, and `perfloop init`."""
    with open(scratch.kernel / "kernel.toml", "a") as f:
        f.write('\n[workload]\ndims = ["n"]\nn = { min = 200, max = 1100 }\n'
                'dtypes = ["float32"]\nheld_out = 2\n')
    scratch.script([{"when": {"tile": [1, 2048]}, "factor": {"*": tile_factor}}])
    scratch.commit_all("a workload")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0


def test_candidates_are_chosen_at_the_benchmark_and_the_chosen_one_timed_held_out(scratch):
    # a declared workload: every step times held-out shapes, but only the chosen candidate's
    _init_with_workload(scratch, 0.9)
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape")
    assert code == 0 and out["experiment"]["status"] == "keep", (out, err)
    timing = scratch.records()[-1]["timing"]
    selection, final = timing["selection"], timing["shapes"]
    assert len(selection["head"]["variants"]) > 3    # several candidates, at benchmark shapes
    assert set(selection) == {"head", "guard", "tail"}
    held = {n for n, sh in final.items() if sh["held_back"]}
    assert held and set(final) == {"head", "guard", "tail"} | held
    assert all(set(final[n]["variants"]) == {"incumbent", "incumbent-again", timing["chosen"]}
               for n in held)


def test_a_candidate_faster_nowhere_is_not_timed_at_the_held_out_shapes(scratch):
    # the held-out shapes only guard a keep: a candidate slower at every benchmark shape is
    # reverted without them (a run's reverts cost the benchmark's shapes only)
    _init_with_workload(scratch, 1.3)
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape",
                                 "--value", "[1, 2048]")
    assert code == 0 and out["experiment"]["status"] == "revert", (out, err)
    timing = scratch.records()[-1]["timing"]
    assert set(timing["shapes"]) == {"head", "guard", "tail"}
    assert "no candidate was faster" in timing["method"]["held_back"]


def test_a_cliff_at_one_bucket_leaves_the_win_at_another_to_a_dispatch(scratch):
    # occupancy 8: 10x slower at the guard (dropped there as a cliff), 15% faster elsewhere
    _without_bucket_hook(scratch)
    scratch.script([{"when": {"occupancy": 8},
                     "factor": {"*": 0.85, "guard": 10, "held:guard": 10}}])
    scratch.commit_all("no bucket hook")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "occupancy")
    assert code == 0, err
    step = scratch.records()[-1]
    cliff = [o for o in step["outcomes"].values() if o["value"] == 8]
    assert cliff[0]["outcome"] == "slow" and "at guard" in cliff[0]["reason"]
    assert "head" in step["timing"]["shapes"]  # timed at the others, for the dispatch
    code, out, _ = scratch.cli("next", "--kernel", "scripted")
    assert code == 0 and out["suggestions"][0]["id"] == "dispatch", out
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "dispatch")
    assert code == 0, (out, err)
    routed = scratch.records()[-1]
    assert routed["optimization"] == "dispatch" and routed["status"] == "keep", routed["decision"]
    assert routed["knobs"]["dispatch"] == {"d0<=1024": {"occupancy": 8}, "d0<=256": {}}
