"""kernel.toml's [workload]: reading it, the buckets it derives, the held-out shapes drawn from
it, and how a launch in a bucket no benchmark shape fell in is routed (perfloop.contract.workload,
perfloop.contract.dispatch, perfloop.contract.tuneonce). All pure or in-process: no GPU, no children."""

from __future__ import annotations

import types
import tomllib
import warnings

import pytest
import torch
from conftest import ROOT, FakeTime

from perfloop.contract import dispatch, tuneonce
from perfloop.contract import workload as W
from perfloop.contract.autotune import DiskCache
from perfloop.contract.shape import Shape

BENCH = (Shape("llama", (16384, 4096), "bfloat16", True), Shape("wide", (2048, 16384), "float16"),
         Shape("tail", (2, 2048, 5000), "float32"))
NORMS = """
[workload]
dims = ["rows", "hidden"]
rows = { min = 1, max = 16384 }
hidden = [2048, 4096, 5120, 8192, 16384]
dtypes = ["bfloat16", "float16", "float32"]
held_out = 4
"""


def parse(text: str, bench=BENCH) -> W.Workload:
    return W.parse(tomllib.loads(text).get("workload"), bench)


def test_buckets_are_the_dtype_and_each_varying_dimensions_power_of_two_class():
    wl = parse(NORMS)
    assert wl.bucket_keys == ("dtype", "rows", "hidden")
    # the tail's batch of 2 x 2048 rows counts as 4096 rows
    assert wl.measured() == ["bfloat16/rows<=16384/hidden<=4096",
                             "float16/rows<=2048/hidden<=16384",
                             "float32/rows<=4096/hidden<=8192"]


def test_a_dimension_that_never_varies_keys_no_bucket():
    wl = parse(NORMS.replace('dtypes = ["bfloat16", "float16", "float32"]',
                             'dtypes = ["bfloat16"]').replace("rows = { min = 1, max = 16384 }",
                                                              "rows = [4096]"))
    assert wl.bucket_keys == ("hidden",)


def test_the_parent_and_a_launch_read_the_same_bucket():
    wl = parse(NORMS)
    for dims, dtype in [((3, 1000), torch.float16), ((16384, 4096), torch.bfloat16),
                        ((2, 7, 5000), torch.float32)]:
        shape = Shape("s", dims, str(dtype).removeprefix("torch."))
        assert W.inputs_bucket(wl, [torch.empty(dims, dtype=dtype)]) == W.shape_bucket(wl, shape)


def test_inputs_say_where_a_launch_reads_each_dimension():
    wl = parse('[workload]\ndims = ["M", "N", "K"]\nM = { min = 1, max = 8192 }\n'
               'N = [4096]\nK = [4096, 8192]\ndtypes = ["bfloat16"]\n'
               "inputs = { M = [0, 0], K = [0, 1] }\nbuckets = [\"M\", \"K\"]\n",
               (Shape("sq", (4096, 4096, 4096), "bfloat16", True),))
    a, b = torch.empty(64, 8192, dtype=torch.bfloat16), torch.empty(8192, 4096)
    assert W.inputs_bucket(wl, [a, b]) == "M<=64/K<=8192"


def test_held_out_shapes_come_from_the_seed_and_are_never_a_benchmark_shape():
    wl = parse(NORMS)
    first = W.draw(wl, 7, BENCH)
    assert first == W.draw(wl, 7, BENCH) and first != W.draw(wl, 8, BENCH)
    assert len(first) == 4 and len({(s.dims, s.dtype) for s in first}) == 4
    assert all(s.held_back and not s.headline for s in first)
    assert all(s.dims[1] in (2048, 4096, 5120, 8192, 16384) and 1 <= s.dims[0] <= 16384
               for s in first)
    # a family of one listed shape, which is also the benchmark's, gives nothing to hold out
    only = parse('[workload]\n[[workload.shapes]]\ndims = [16384, 4096]\ndtype = "bfloat16"\n')
    assert W.draw(only, 1, BENCH) == ()


def test_a_range_with_multiple_of_stays_a_multiple_inside_the_range():
    wl = parse(NORMS.replace("rows = { min = 1, max = 16384 }",
                             "rows = { min = 64, max = 1000, multiple_of = 64 }")
               .replace("held_out = 4", "held_out = 32"))
    rows = {s.dims[0] for s in W.draw(wl, 3, BENCH)}
    assert rows and all(r % 64 == 0 and 64 <= r <= 1000 for r in rows)


def test_an_unmeasured_bucket_runs_as_the_nearest_of_its_element_size_before_any_other():
    measured = parse(NORMS).measured()
    assert W.nearest("bfloat16/rows<=8192/hidden<=8192", measured) == measured[0]
    assert W.nearest("float32/rows<=1/hidden<=2048", measured) == measured[2]
    assert W.nearest("float64/rows<=2048/hidden<=16384", measured) == measured[1]
    assert W.nearest(measured[1], measured) == measured[1]
    assert W.nearest("anything", []) is None
    # bf16 and fp16 are one element size: the same width in the other beats another width
    rows = ["bfloat16/n<=4096", "bfloat16/n<=512", "float16/n<=32768", "float32/n<=8192"]
    assert W.nearest("float16/n<=512", rows) == "bfloat16/n<=512"
    assert W.nearest("float16/n<=16384", rows) == "float16/n<=32768"
    assert W.nearest("bfloat16/n<=32768", rows) == "float16/n<=32768"
    assert W.nearest("bfloat16/n<=65536", rows) == "float16/n<=32768"
    assert W.nearest("float32/n<=512", rows) == "float32/n<=8192"    # 4 bytes, not 2
    assert W.nearest("bfloat16/n<=8192", ["bfloat16/n<=4096", "float16/n<=16384"]) == \
        "bfloat16/n<=4096"                                            # a tie: the same dtype
    matmul = ["bfloat16/large-m", "bfloat16/small-m", "float16/large-m"]
    assert W.nearest("float16/small-m", matmul) == "bfloat16/small-m"
    assert W.nearest("float8_e4m3fn/n<=512", rows) == "bfloat16/n<=512"   # 1 byte: no match


ONE = 'dims = ["r"]\nr = [4]\ndtypes = ["bfloat16"]\n'


@pytest.mark.parametrize("text, says", [
    ('dims = ["r", "h"]\nr = [1]', "no values for h"),
    ("held_out = 99", "held_out must be an integer from 0 to 32"),
    ('unseen = "guess"', "unseen must be one of nearest, tune"),
    ("colour = 1", "has no setting 'colour'"),
    ('dims = ["r"]\nr = { min = 5, max = 2 }\ndtypes = ["bfloat16"]', "min <= max"),
    ('dims = ["r"]\nr = [0]\ndtypes = ["bfloat16"]', "positive integers"),
    ('dims = ["r"]\nr = [4]\ndtypes = []', "non-empty list"),
    ('dims = ["r"]\nr = [4]\ndtypes = ["bfloat16"]\nbuckets = ["colour"]', "neither"),
    (ONE + "finalists = [{ tile = 2 }]", 'only where unseen = "tune"'),
    (ONE + 'unseen = "tune"\nfinalists = [{}]', "non-empty tables"),
    (ONE + 'unseen = "tune"\nfinalists = { tile = 2 }', "must be a list"),
    (ONE + 'unseen = "tune"\nfinalists = [' + "{ tile = 2 }, " * 5 + "]", "1 to 4"),
])
def test_a_wrong_workload_is_one_line_naming_what_is_wrong(text, says):
    with pytest.raises(W.WorkloadError) as caught:
        parse("[workload]\n" + text)
    assert says in str(caught.value) and "\n" not in str(caught.value)


# ---- routing a launch -------------------------------------------------------------------------
def _kernel(tmp_path, unseen: str, delays: dict[str, float], monkeypatch=None):
    """A kernel folder with NORMS as its workload, and a build_one whose launch records which
    knobs ran and takes `delays[tile]` seconds: of tune-once's clock, made the test's own (with
    `monkeypatch`), since on a loaded machine a real 2 ms sleep may outlast a 4 ms one."""
    clock = FakeTime()
    if monkeypatch is not None:
        monkeypatch.setattr(tuneonce, "time", clock)
    shapes = "".join(f'[[shapes]]\nname = "{s.name}"\ndims = {list(s.dims)}\n'
                     f'dtype = "{s.dtype}"\n' for s in BENCH)
    (tmp_path / "kernel.toml").write_text(NORMS + f'unseen = "{unseen}"\n' + shapes)
    ran = []

    def build_one(knobs):
        def launch(inputs, out):
            ran.append(knobs["tile"])
            clock.sleep(delays.get(knobs["tile"], 0))
            out.fill_(knobs["tile"])
        return launch
    return build_one, ran


KNOBS = {"tile": 1, "dispatch": {"float16/rows<=2048/hidden<=16384": {"tile": 2},
                                 "float32/rows<=4096/hidden<=8192": {"tile": 3}}}


def test_a_launch_in_an_unmeasured_bucket_runs_the_nearest_measured_buckets_knobs(tmp_path):
    build_one, ran = _kernel(tmp_path, "nearest", {})
    launch = dispatch.build(KNOBS, build_one, folder=tmp_path)
    out = torch.empty(1)
    launch([torch.empty(4096, 16384, dtype=torch.float16)], out)     # near the fp16 bucket
    launch([torch.empty(16384, 4096, dtype=torch.bfloat16)], out)    # a measured bucket
    launch([torch.empty(7, 3000, dtype=torch.float32)], out)         # near the fp32 one
    assert ran == [2, 1, 3]
    assert launch.routes == {
        "float16/rows<=4096/hidden<=16384": ("float16/rows<=2048/hidden<=16384",
                                             "nearest measured bucket"),
        "float32/rows<=8/hidden<=4096": ("float32/rows<=4096/hidden<=8192",
                                         "nearest measured bucket")}


def test_tune_once_times_the_finalists_keeps_the_fastest_and_caches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFLOOP_AUTOTUNE_CACHE", str(tmp_path / "cache"))
    build_one, ran = _kernel(tmp_path, "tune", {1: 0.004, 2: 0.0, 3: 0.002}, monkeypatch)
    out = torch.empty(1)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        launch = dispatch.build(KNOBS, build_one, folder=tmp_path)
        launch([torch.empty(64, 2048, dtype=torch.float32)], out)
    assert float(out) == 2.0              # the winner wrote the output: tile 2 is fastest
    assert launch.routes["float32/rows<=64/hidden<=2048"] == ("float16/rows<=2048/hidden<=16384",
                                                              "tuned once among 3 finalists")
    assert any(issubclass(w.category, tuneonce.UnseenBucket) for w in said)
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    ran.clear()  # a new process (a new launch) reads the winner from the disk cache
    again = dispatch.build(KNOBS, build_one, folder=tmp_path)
    again([torch.empty(64, 2048, dtype=torch.float32)], out)
    assert ran == [2] and again.routes["float32/rows<=64/hidden<=2048"][1] == \
        "tuned once before (disk cache)"


def test_declared_finalists_are_timed_beside_the_measured_buckets_knobs(tmp_path, monkeypatch):
    # few rows want other blocks than any benchmark shape's (H100, do_bench: 2197 x 2048 bf16
    # 12.5 us at 16 rows per block, 10.3 at 2 rows with occupancy 4): kernel.toml may name
    # configs the run never measured for tuning to time too
    monkeypatch.setenv("PERFLOOP_AUTOTUNE_CACHE", str(tmp_path / "cache"))
    build_one, ran = _kernel(tmp_path, "tune", {1: 0.004, 2: 0.003, 3: 0.002, 4: 0.0},
                             monkeypatch)
    toml = tmp_path / "kernel.toml"
    toml.write_text(toml.read_text().replace(
        'unseen = "tune"', 'unseen = "tune"\nfinalists = [{ tile = 4 }, { tile = 2 }]'))
    out = torch.empty(1)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        launch = dispatch.build(KNOBS, build_one, folder=tmp_path)
        launch([torch.empty(64, 2048, dtype=torch.float32)], out)
    # tile 2 is the fp16 bucket's already: timed once, not twice
    assert sorted(set(ran)) == [1, 2, 3, 4] and ran.count(2) == ran.count(3)
    assert float(out) == 4.0 and launch.routes["float32/rows<=64/hidden<=2048"] == (
        'finalist {"tile": 4}', "tuned once among 4 finalists")
    # a measured bucket runs its own knobs, never a declared finalist
    ran.clear()
    launch([torch.empty(16384, 4096, dtype=torch.bfloat16)], out)
    assert ran == [1]


def _tuning_kernel(tmp_path, monkeypatch):
    """_kernel with unseen = "tune" and one declared finalist, tile 4, the fastest."""
    monkeypatch.setenv("PERFLOOP_AUTOTUNE_CACHE", str(tmp_path / "cache"))
    build_one, ran = _kernel(tmp_path, "tune", {1: 0.004, 4: 0.0}, monkeypatch)
    toml = tmp_path / "kernel.toml"
    toml.write_text(toml.read_text().replace(
        'unseen = "tune"', 'unseen = "tune"\nfinalists = [{ tile = 4 }]'))
    return build_one, ran, toml


def test_declared_finalists_are_tuned_among_before_any_dispatch_table(tmp_path, monkeypatch):
    # a run that kept nothing writes no table; the finalists a kernel declares still serve
    # the buckets no benchmark shape measured (H100, a README-written row norm: fp32 3 x 4096
    # 13.74 us on the plain knobs, 4.93 on its 4096-element finalist)
    build_one, ran, toml = _tuning_kernel(tmp_path, monkeypatch)
    out = torch.empty(1)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        launch = dispatch.build({"tile": 1}, build_one, folder=tmp_path)
        launch([torch.empty(64, 2048, dtype=torch.float32)], out)
        assert float(out) == 4.0 and launch.routes["float32/rows<=64/hidden<=2048"] == (
            'finalist {"tile": 4}', "tuned once among 2 finalists")
        ran.clear()
        launch([torch.empty(16384, 4096, dtype=torch.bfloat16)], out)   # measured: plain
        assert ran == [1]
        # an explicitly empty table is a config run as itself: no routing, no tuning
        itself = dispatch.build(dispatch.as_itself({"tile": 1}), build_one, folder=tmp_path)
        ran.clear()
        itself([torch.empty(64, 2048, dtype=torch.float32)], out)
        assert ran == [1] and not hasattr(itself, "routes")
    # without declared finalists there is nothing to tune among: the plain launch, unrouted
    toml.write_text(toml.read_text().replace("finalists = [{ tile = 4 }]\n", ""))
    assert not hasattr(dispatch.build({"tile": 1}, build_one, folder=tmp_path), "routes")


def test_a_kernels_own_build_given_a_finalist_does_not_tune_again(tmp_path, monkeypatch):
    # the timer launches a hook-less kernel through dispatch.launcher, whose finalists are
    # built by the kernel's own build, itself routing: each must run as itself
    build_one, _, _ = _tuning_kernel(tmp_path, monkeypatch)
    module = types.ModuleType("k")
    module.__file__ = str(tmp_path / "kernel.py")
    built = []

    def build(knobs):
        built.append(dict(knobs))
        return dispatch.build(knobs, build_one, folder=tmp_path)
    module.build = build
    out = torch.empty(1)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        launch = dispatch.launcher(module, {"tile": 1}, folder=tmp_path)
        launch([torch.empty(64, 2048, dtype=torch.float32)], out)
    assert float(out) == 4.0
    assert all(k.get("dispatch") == {} for k in built) and len(built) == 2


def test_a_finalist_that_fails_is_no_winner(tmp_path):
    IDENT = {"kernel": "k", "key": "b", "space": ["bad", "good"]}
    cache = DiskCache(tmp_path)
    out = torch.zeros(1)

    def works(inputs, out):
        out.fill_(1.0)

    def breaks(inputs, out):
        raise RuntimeError("too many resources requested for launch")

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        best, how = tuneonce.choose("b", {"bad": breaks, "good": works}, [torch.empty(2)], out,
                                    (), IDENT, cache=cache)
    assert (best, how) == ("good", "tuned once among 1 finalists")
    assert "bad failed (RuntimeError: too many resources" in str(said[-1].message)
    assert cache.get(IDENT) == "good"    # the same failure next time: not timed again
    oom = {**IDENT, "key": "oom"}

    def full(inputs, out):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        tuneonce.choose("b", {"full": full, "good": works}, [torch.empty(2)], out, (), oom,
                        cache=cache)
    assert cache.get(oom) is None        # memory may be free next time: timed again
    with pytest.raises(RuntimeError, match="too many resources"):   # none runs: the error
        tuneonce.choose("b", {"bad": breaks, "worse": breaks}, [torch.empty(2)], out, (),
                        {**IDENT, "space": ["bad", "worse"]}, cache=cache)


def test_a_declared_finalist_must_name_the_kernels_knobs(tmp_path):
    from perfloop.core.errors import UserError
    from perfloop.contract.manifest import load_spec

    repo = ROOT
    folder = tmp_path / "rmsnorm"
    folder.mkdir()
    for name in ("kernel.py", "knobs.json"):
        (folder / name).write_bytes((repo / "kernels" / "rmsnorm" / name).read_bytes())
    (folder / "kernel.toml").write_text((repo / "kernels/rmsnorm/kernel.toml").read_text())
    assert load_spec(folder, repo).workload.finalists     # the shipped ones are knobs
    (folder / "kernel.toml").write_text((folder / "kernel.toml").read_text().replace(
        "finalists = [", "finalists = [{ warps = 8 }, "))
    with pytest.raises(UserError, match="finalists: knobs.json has no knob 'warps'"):
        load_spec(folder, repo)


def test_a_cached_winner_that_is_no_longer_a_finalist_is_timed_again(tmp_path):
    cache = DiskCache(tmp_path)
    ident = {"kernel": "k", "space": ["a", "b"], "key": "x"}
    cache.put(ident, "c", {})  # written when "c" was a finalist
    assert cache.get(ident) is None


def test_a_held_out_shape_is_timed_as_the_measured_bucket_a_launch_routes_it_to():
    wl = parse(NORMS)
    held = Shape("held", (300, 8192), "bfloat16")   # hidden 8192: no benchmark shape there
    timed = W.with_buckets(BENCH + (held,), wl)
    assert [t["bucket"] for t in timed[:3]] == wl.measured()
    assert timed[3]["routed_from"] == "bfloat16/rows<=512/hidden<=8192"
    assert timed[3]["bucket"] == W.nearest("bfloat16/rows<=512/hidden<=8192", wl.measured())
    # fp16's 2048 x 16384 is 3 powers of two away, bf16's 16384 x 4096 6: one element size
    assert timed[3]["bucket"] == "float16/rows<=2048/hidden<=16384"
    assert all("routed_from" not in t for t in timed[:3])


def test_a_derived_held_back_shape_stays_in_its_shapes_power_of_two_class():
    from perfloop.contract.kernel import derived_held_back

    for rows in (9, 64, 100, 256, 1000, 1024, 3000, 16384):
        held = derived_held_back(Shape("s", (rows, 512), "float32")).dims[0]
        assert held != rows and W.pow2(held) == W.pow2(rows), rows
    # a small batch of rows folds to batch x rows: RMSNorm's 2 x 2048 x 5000 became 4 x 2048
    # x 5000, 8192 rows, and left the fp32 bucket with no held-back shape of its own
    for batch, rows in ((2, 2048), (3, 1000), (8, 5), (1, 64), (2, 3)):
        held = derived_held_back(Shape("s", (batch, rows, 5000), "float32")).dims
        assert held[0] == batch and held[1] != rows and held[2] == 5000
        assert W.pow2(held[0] * held[1]) == W.pow2(batch * rows), (batch, rows, held)
    # a larger batch is changed, but batch x rows stays in its class (9 x 3000 became 14 x
    # 3000, 42000 rows: out of 27000's class)
    for dims in ((9, 3000, 5000), (12, 1500, 5000), (100, 7, 64)):
        held = derived_held_back(Shape("s", dims, "float32")).dims
        assert held != dims and W.pow2(held[0] * held[1]) == W.pow2(dims[0] * dims[1]), held
    # with a workload, its bucket is what must not change
    wl = parse(NORMS)
    for s in BENCH:
        assert W.shape_bucket(wl, derived_held_back(s, lambda h: W.shape_bucket(wl, h))) == \
            W.shape_bucket(wl, s)


@pytest.mark.parametrize("kernel", ["rmsnorm", "softmax", "matmul", "swiglu"])
def test_every_measured_bucket_has_a_held_back_shape_of_its_own(kernel):
    # with unseen = "tune" a held-back shape routed from an unmeasured bucket runs whichever
    # finalist wins: only one in the bucket is sure to run the bucket's entry
    from perfloop.contract.manifest import load_spec

    folder = ROOT / "kernels" / kernel
    spec = load_spec(folder, folder.parents[1])
    own = {t["bucket"] for t in W.with_buckets(spec.held_back, spec.workload)
           if "routed_from" not in t}
    assert set(spec.workload.measured()) <= own

@pytest.mark.parametrize("kernel", ["rmsnorm", "softmax", "matmul", "swiglu"])
@pytest.mark.parametrize("seed", [0, 11, 12345])
def test_every_measured_bucket_has_a_held_back_shape_whatever_the_workload_draws(kernel, seed):
    # on the H100 rmsnorm's 4 drawn shapes all ran as its bf16 bucket, and a dispatch of a 15%
    # win to the fp16 and fp32 buckets was reverted whole: "no held-back shape was timed"
    from perfloop.contract.manifest import load_spec

    folder = ROOT / "kernels" / kernel
    spec = load_spec(folder, folder.parents[1])
    checks = {t["bucket"] for t in W.with_buckets(W.held_out(spec, seed), spec.workload)
              if "routed_from" not in t}
    assert {t["bucket"] for t in W.timer_shapes(spec)} <= checks
    drawn = W.draw(spec.workload, seed, tuple(spec.shapes) + tuple(spec.held_back))
    assert W.held_out(spec, seed)[-len(drawn):] == drawn and len(drawn) == spec.workload.held_out


def test_a_derived_held_back_shape_is_left_out_where_a_drawn_shape_checks_its_bucket(tmp_path):
    # each costs an experiment about 2 s of timing on the H100; [[held_back]] is the user's
    import shutil

    from perfloop.contract.manifest import load_spec

    folder = ROOT / "kernels" / "softmax"
    spec = load_spec(folder, folder.parents[1])
    wl, seed = spec.workload, 7
    drawn = W.draw(wl, seed, tuple(spec.shapes) + tuple(spec.held_back))
    in_drawn = {W.shape_bucket(wl, s) for s in drawn}
    left_out = [h for h in spec.held_back if W.shape_bucket(wl, h) in in_drawn]
    assert left_out, "seed 7 draws a shape in a benchmark shape's bucket"
    held = W.held_out(spec, seed)
    assert held == tuple(h for h in spec.held_back if h not in left_out) + drawn
    mine = shutil.copytree(folder, tmp_path / "softmax")
    with open(mine / "kernel.toml", "a", encoding="utf-8") as toml:
        for h in spec.held_back:   # the same shapes, declared
            toml.write(f'\n[[held_back]]\nname = "{h.name}"\ndims = {list(h.dims)}\n'
                       f'dtype = "{h.dtype}"\n')
    declared = load_spec(mine, folder.parents[1])
    assert declared.held_back == spec.held_back and not declared.held_back_derived
    assert W.held_out(declared, seed) == tuple(spec.held_back) + drawn


def test_held_out_shapes_are_timed_when_a_candidate_may_gain_somewhere():
    from perfloop.referee.selection import may_gain

    def shape(inc, cand):
        return {"rounds": {"incumbent": [[t] for t in inc], "candidate-0": [[t] for t in cand]}}

    same = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01]
    slower = [t * 1.2 for t in same]
    faster = [t * 0.9 for t in same]
    assert not may_gain({"a": shape(same, slower)}, ["candidate-0"])
    assert not may_gain({"a": shape(same, same)}, ["candidate-0"])
    assert may_gain({"a": shape(same, slower), "b": shape(same, faster)}, ["candidate-0"])
    assert not may_gain({"b": shape(same, faster)}, ["candidate-1"])   # not a candidate
    nan = [float("nan")] * len(same)
    assert not may_gain({"a": shape(same, nan)}, ["candidate-0"])
    # a gain the rules do not count (under min_gain) keeps nothing, however tight: SwiGLU's
    # flat view, +0.14% with its interval below 1, cost a 10-shape pass on the H100
    tiny = [t * 0.999 for t in same]
    assert may_gain({"a": shape(same, tiny)}, ["candidate-0"])
    assert not may_gain({"a": shape(same, tiny)}, ["candidate-0"], min_gain=0.005)
    assert may_gain({"a": shape(same, faster)}, ["candidate-0"], min_gain=0.005)


# ---- the workload view (perfloop bench) -----------------------------------------------------
def _timed(ms: dict, floor=None, bucket=None) -> dict:
    from support.records import shape_dict

    return shape_dict({"bucket": bucket, "variants": {label: {"median_ms": t, **(
        {"share_of_floor": floor / t} if floor and label == "incumbent" else {})}
        for label, t in ms.items()}})


def test_the_workload_view_compares_cutile_with_its_best_peer_at_every_shape():
    from perfloop.report import workload_view

    labels = {"incumbent": "cutile", "incumbent-again": "cutile-again",
              "torch-compile": "torch-compile", "torch-eager": "torch-eager", "triton": "triton"}
    summary = {
        "head": _timed({"incumbent": 1.0, "incumbent-again": 1.0, "torch-compile": 1.2,
                        "torch-eager": 2.0, "triton": 1.1}, floor=0.9, bucket="bf16/n4096"),
        "held:bf16:50x8192": {**_timed({"incumbent": 2.0, "incumbent-again": 2.0,
                                        "torch-compile": 1.0, "torch-eager": 3.0,
                                        "triton": 1.5}, bucket="bf16/n4096"),
                              "routed_from": "bf16/n8192"},
        "held:fp16:1x4096": _timed({"incumbent": 1.0, "incumbent-again": 1.0,
                                    "torch-compile": 0.95, "torch-eager": 0.9, "triton": 2.0})}
    v = workload_view.view(summary, labels, {"held:bf16:50x8192": "bfloat16/hidden<=8192",
                                             "held:fp16:1x4096": "float16/hidden<=4096"}, 7)
    rows = {r["shape"]: r for r in v["shapes"]}
    assert rows["head"]["best_peer"] == "triton" and rows["head"]["vs_best_peer"] == 1.1
    assert not rows["head"]["held_out"] and rows["head"]["share_of_floor"] == 0.9
    assert rows["held:bf16:50x8192"]["vs_best_peer"] == 0.5
    assert rows["held:bf16:50x8192"]["bucket"] == "bf16/n4096"         # as the timer ran it
    assert rows["held:bf16:50x8192"]["own_bucket"] == "bf16/n8192"
    assert rows["head"]["own_bucket"] is None
    assert rows["held:fp16:1x4096"]["best_peer"] == "torch-eager"   # cuBLAS, for a matmul
    assert v["below_bar"] == ["held:bf16:50x8192"] and v["seed"] == 7
    assert v["geomean_held_out"] == pytest.approx((0.5 * 0.9) ** 0.5, abs=1e-3)
    assert v["geomean_vs_best_peer"] == pytest.approx((1.1 * 0.5 * 0.9) ** (1 / 3), abs=1e-3)
    text = "\n".join(workload_view.render(v))
    assert "held:bf16:50x8192" in text and "below 0.90 of the best peer: held:bf16:50x8192" in text
    assert "| bf16/n4096 (its own: bf16/n8192) |" in text
    # a tuned shape ran whichever finalist won: the view does not say it ran the nearest's
    summary["held:bf16:50x8192"]["tuned"] = True
    tuned = workload_view.view(summary, labels, {}, 7)
    assert "| tuned once, nearest bf16/n4096 (its own: bf16/n8192) |" in \
        "\n".join(workload_view.render(tuned))


def test_bench_draws_held_out_shapes_only_from_a_declared_workload(tmp_path):
    from perfloop.commands import bench
    from perfloop.core.errors import UserError

    declared = type("Spec", (), {"workload": parse(NORMS), "shapes": BENCH, "held_back": ()})
    seed, shapes = bench.drawn(declared, None, 3)
    assert seed == 3 and len(shapes) == 4 and not set(shapes) & set(BENCH)
    assert bench.drawn(declared, 2, 3)[1] == W.draw(parse(NORMS.replace("= 4", "= 2")), 3, BENCH)
    assert bench.drawn(declared, 0, 3) == (None, ())
    with pytest.raises(UserError):
        bench.drawn(declared, 99, 3)
    plain = type("Spec", (), {"workload": W.parse(None, BENCH), "shapes": BENCH, "held_back": ()})
    assert bench.drawn(plain, None, None) == (None, ())


def test_the_workload_plot_draws_each_shape_against_the_bar():
    pytest.importorskip("matplotlib")
    from perfloop.report import plots

    view = {"bar": 0.9, "shapes": [
        {"shape": "head", "held_out": False, "vs_best_peer": 1.1},
        {"shape": "held:bf16:50x8192", "held_out": True, "vs_best_peer": 0.5},
        {"shape": "held:fp16:1x4096", "held_out": True, "vs_best_peer": None}]}
    fig = plots.workload(view)
    ax = fig.axes[0]
    assert [round(b.get_height(), 3) for b in ax.patches] == [1.1, 0.5]   # untimed: no bar
    assert [t.get_text() for t in ax.get_xticklabels()] == ["head", "held:bf16:50x8192"]
    assert 0.9 in [line.get_ydata()[0] for line in ax.get_lines()]
    assert plots.png(fig).startswith(b"\x89PNG")
    assert plots.workload(None) is None and plots.workload({"shapes": []}) is None


def test_a_launcher_runs_each_buckets_knobs_though_the_kernels_build_ignores_the_table(tmp_path):
    # a README-style kernel: build(knobs) knows nothing of dispatch; the timer's launcher
    # routes each launch to the knobs the loop decided for its bucket
    from perfloop.child import launcher

    (tmp_path / "kernel.toml").write_text(
        'name = "k"\n[[shapes]]\nname = "head"\ndims = [256, 1024]\ndtype = "float32"\n'
        'headline = true\n[[shapes]]\nname = "tail"\ndims = [64, 1000]\ndtype = "float32"\n')
    (tmp_path / "kernel.py").write_text(
        "def build(knobs):\n"
        "    def launch(inputs, out):\n"
        "        out.append(knobs['fast_math'])\n"
        "    return launch\n")
    knobs = {"fast_math": False, "dispatch": {"d0<=256/d1<=1024": {"fast_math": True}}}
    launch = launcher.build({"kind": "kernel", "folder": str(tmp_path), "knobs": knobs})
    seen: list = []
    for rows, cols in ((256, 1024), (64, 1000), (200, 700)):
        launch((torch.empty(rows, cols),), seen)
    assert seen == [True, False, True]   # 200 x 700 falls in the head's bucket


def test_a_tuned_held_out_shape_is_timed_whichever_buckets_entry_changes():
    # a launch in an unmeasured bucket runs whichever finalist was fastest: a change of any
    # measured bucket's entry may change its time, so dispatch experiments always time it
    from types import SimpleNamespace

    from perfloop.run.experiment import _tuned

    held = Shape("held", (300, 8192), "bfloat16")    # no benchmark shape in its bucket
    for unseen, expected in (("tune", ["held"]), ("nearest", [])):
        wl = parse(NORMS + f'unseen = "{unseen}"\n')
        trial = SimpleNamespace(s=SimpleNamespace(spec=SimpleNamespace(workload=wl)),
                                timed_shapes=W.with_buckets(BENCH + (held,), wl))
        assert _tuned(trial) == expected


def test_a_regression_at_a_tuned_shape_reverts_the_whole_dispatch():
    # held:tuned counts in "small" (its nearest) but, tuned, may run big's knobs: dropping
    # "small" and keeping "big" would keep what may have slowed it by 40% (found by a review)
    from support.records import summary as typed

    from perfloop.contract.playbook import SHIPPED, load
    from perfloop.plan import weigh

    def shape(bucket, ratio, held, tuned=False):
        return {"bucket": bucket, "held_back": held, "floor_ms": None,
                **({"routed_from": "tiny", "tuned": True} if tuned else {}),
                "variants": {"candidate-0": {"median_ms": ratio}, "incumbent": {"median_ms": 1}},
                "vs_incumbent": {"candidate-0": {"ratio": ratio, "ci_low": ratio - 0.002,
                                                 "ci_high": ratio + 0.002, "noise": 0.001}}}

    rules = load(SHIPPED).rules.decision
    table = {"big": {"tile": 64}, "small": {"tile": 16}}
    shapes = {"head": shape("big", 0.7, False), "held:head": shape("big", 0.75, True),
              "guard": shape("small", 0.9, False), "held:guard": shape("small", 0.95, True),
              "held:out": shape("small", 1.4, True, tuned=True)}
    summary = typed(shapes)
    verdict = weigh.verdict(summary, "candidate-0", "head", rules, dispatch_value=table,
                          incumbent_knobs={})
    assert verdict.status == "revert" and "held:out" in verdict.reason, verdict
    # the same regression at a shape routed to its nearest bucket (not tuned) is that
    # bucket's: the dispatch is kept in the other
    routed = typed({**shapes, "held:out": {**shapes["held:out"], "tuned": False}})
    verdict = weigh.verdict(routed, "candidate-0", "head", rules, dispatch_value=table,
                          incumbent_knobs={})
    assert verdict.status == "keep" and verdict.dropped_buckets == ("small",), verdict
    # a tuned held-back shape is no bucket's check: "small" is then unchecked
    only_tuned = {k: v for k, v in summary.items() if k != "held:guard"}
    assert weigh.ungeneralized(only_tuned, ["big", "small"]) == ("small",)


def test_each_declared_finalist_is_judged_as_a_variant_of_its_own():
    # a tuned launch may run a declared finalist wherever it is fastest; the judge's cases
    # check only each case's winner, so the loop asks the judge about each one outright
    from perfloop.core.dispatch_table import declared
    from perfloop.measure.judge import JudgeResult
    from perfloop.measure.outcomes import finalist_variants, with_finalists

    finalists = declared(((("occupancy", 2), ("tile", (2, 0))),))
    name = next(iter(finalists))
    table = {"dispatch": {"bf16/rows<=16384": {"tile": (4, 0)}}}
    cands = [{"label": "c1", "folder": "f", "knobs": {"tile": (1, 0), "occupancy": None, **table}},
             {"label": "c3", "folder": "f", "knobs": {"tile": (1, 0), "dispatch": {}}}]
    extra = finalist_variants(cands, finalists)
    # an explicitly empty table is a config run as itself: c3's launches never run a finalist
    assert list(extra) == ["c1"] and len(extra["c1"]) == 1
    v = extra["c1"][0]
    assert v["label"] == "c1-finalist1" and v["finalist"] == name
    # plain + patch, with an empty table: its launch runs it, never tunes again
    assert v["knobs"] == {"tile": (2, 0), "occupancy": 2, "dispatch": {}}
    # no table at all: launches in unmeasured buckets tune from the start, so it is judged too
    plain = [{"label": "c2", "folder": "f", "knobs": {"tile": (1, 0), "occupancy": None}}]
    assert [x["knobs"] for x in finalist_variants(plain, finalists)["c2"]] == [v["knobs"]]
    # the incumbent ran the same config with the same code: judged then, not again
    assert finalist_variants(cands, finalists, cands[0]["knobs"]) == {}
    assert finalist_variants(cands, finalists, {**cands[0]["knobs"], "occupancy": 8}) == {}
    other = {**cands[0]["knobs"], "fast_math": True}     # a knob the patch leaves as it is
    assert len(finalist_variants(cands, finalists, other)["c1"]) == 1
    # a candidate whose own cases pass fails when its finalist fails; a failed one stays so
    judged = JudgeResult(passed={"c1": True, "c1-finalist1": False},
                         cases={"c1-finalist1": [{"case": "bf16[3, 5000]", "passed": False}]})
    out = with_finalists({"c1": ("ok", "")}, extra, judged)
    assert out["c1"][0] == "fail" and name in out["c1"][1] and "bf16[3, 5000]" in out["c1"][1]
    judged.passed["c1-finalist1"] = True
    assert with_finalists({"c1": ("ok", "")}, extra, judged) == {"c1": ("ok", "")}
    assert with_finalists({"c1": ("crash", "x")}, extra, judged) == {"c1": ("crash", "x")}
