"""Autotune on a real GPU: correct with it on and off, searches counted, split buffers, and
a tuned launch no slower than the fixed one beyond noise."""

import json
import os
import subprocess
import sys
import pytest
from conftest import ROOT

from perfloop.referee import clock as measure
from perfloop.contract import autotune, dispatch
from perfloop.core import stats
from perfloop.contract.kernel import Shape, import_module, read_knobs
from perfloop.contract.playbook import SHIPPED, load

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
FOLDER = ROOT / "kernels" / "swiglu"
SHAPE = Shape("t", (4096, 11008), "bfloat16")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFLOOP_AUTOTUNE_CACHE", str(tmp_path / "cache"))
    autotune._memory.clear()
    return tmp_path / "cache"


def _swiglu(tag):
    """SwiGLU's plain knobs with autotune on, without its dispatch table: a dispatched launch
    routes to one launcher per bucket, and these tests read the one launcher's tuner."""
    module = import_module(FOLDER, tag)
    knobs = dispatch.knobs_for(read_knobs(FOLDER / "knobs.json"), "")
    return module, {**knobs, "autotune": True}


@pytest.mark.parametrize("off", [False, True], ids=["autotune-on", "autotune-off"])
def test_results_are_correct_with_autotune_on_and_off(fresh_cache, monkeypatch, off):
    if off:
        monkeypatch.setenv("DISABLE_AUTOTUNE", "1")
    module, knobs = _swiglu(f"at_{off}")
    a, b = module.make_inputs(SHAPE, 0, "cuda")
    out = torch.full_like(a, float("nan"))
    launch = module.build(knobs)
    launch((a, b), out)
    expected = torch.nn.functional.silu(a.double()) * b.double()
    assert float((out.double() - expected).norm() / expected.norm()) < 5e-3
    assert launch.tuner.searches == (0 if off else 1)
    assert not list(fresh_cache.glob("*.json")) if off else len(list(fresh_cache.glob("*.json"))) == 1


def test_second_call_and_second_process_do_not_search(fresh_cache):
    module, knobs = _swiglu("at_twice")
    a, b = module.make_inputs(SHAPE, 1, "cuda")
    out = torch.empty_like(a)
    first = module.build(knobs)
    first((a, b), out)
    again = module.build(knobs)   # a new tuner object, the same process
    again((a, b), out)
    assert (first.tuner.searches, again.tuner.searches) == (1, 0)
    script = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
              "from perfloop.contract.kernel import import_module, read_knobs, Shape\n"
              f"m = import_module(__import__('pathlib').Path({str(FOLDER)!r}), 'second')\n"
              "from perfloop.dispatch import knobs_for\n"
              "k = {**knobs_for(read_knobs(m.KNOBS), ''), 'autotune': True}\n"
              f"a, b = m.make_inputs(Shape('t', {SHAPE.dims!r}, 'bfloat16'), 1, 'cuda')\n"
              "import torch, json; out = torch.empty_like(a); f = m.build(k); f((a, b), out)\n"
              "torch.cuda.synchronize(); print(json.dumps({'searches': f.tuner.searches}))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PERFLOOP_AUTOTUNE_CACHE": str(fresh_cache)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"searches": 0}


def test_inplace_kernel_is_right_after_a_search(fresh_cache):
    from support import inplace_scale

    x = torch.randn(3 * 1024 * 1024 + 7, device="cuda")
    expected = x * 1.5
    tuned = inplace_scale.tuner(autotune.DiskCache(fresh_cache))
    inplace_scale.scale_(x, 1.5, tuned)
    torch.cuda.synchronize()
    assert tuned.searches == 1
    assert torch.equal(x, expected)


def test_without_the_split_buffer_the_search_corrupts_the_input(fresh_cache):
    """The control for the test above: it can fail, and this is how."""
    from support import inplace_scale

    x = torch.randn(1024 * 1024, device="cuda")
    expected = x * 1.5
    inplace_scale.scale_(x, 1.5, inplace_scale.tuner(autotune.DiskCache(fresh_cache)),
                         split_buffer=False)
    torch.cuda.synchronize()
    assert not torch.equal(x, expected)


def test_tuned_launch_is_not_slower_than_the_fixed_one_beyond_noise(fresh_cache):
    module, knobs = _swiglu("at_speed")
    inputs = module.make_inputs(SHAPE, 2, "cuda")
    out = module.empty_output(inputs)
    tuned, fixed = module.build(knobs), module.build({**knobs, "autotune": False})
    tuned(inputs, out)  # the search happens here, outside the timing
    run_fixed = lambda: fixed(inputs, out)  # noqa: E731
    timed = measure.alternating(measure.CudaClock(), {"fixed": run_fixed, "fixed-again": run_fixed,
                                                       "tuned": lambda: tuned(inputs, out)},
                                load(SHIPPED).rules.measure)
    medians = {k: [sorted(r)[len(r) // 2] for r in v] for k, v in timed.rounds.items()}
    c = stats.compare(medians["fixed"], medians["tuned"])
    noise = stats.noise_of(stats.compare(medians["fixed"], medians["fixed-again"]))
    print(f"tuned/fixed {c.ratio:.4f} [{c.ci_low:.4f}, {c.ci_high:.4f}], A/A noise {noise:.4%}")
    assert c.ci_low <= 1.0 or c.ratio - 1 <= noise
