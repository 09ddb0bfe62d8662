"""The Triton competitors `perfloop bench` times beside cuTile (each kernel's competitors()):
each must compute what the kernel's judge asks of the cuTile kernel, on the judge's own inputs
(tails no block divides, rows wider than one pass, all-zero and -inf rows, large magnitudes).
bench checks the outputs it times, but only at the benchmark shapes on ordinary inputs."""

import importlib.util
import pytest
from conftest import ROOT, judge_of

from perfloop.contract.judge_api import check, module_for, tolerance

torch = pytest.importorskip("torch")

SEEDS = (0, 1)
# (kernel, dtype, dims): the judges' tails, and rows past the competitors' whole-row limit
CASES = [("rmsnorm", "bfloat16", (257, 1000)), ("rmsnorm", "float16", (3, 5, 777)),
         ("rmsnorm", "float32", (130, 5000)), ("rmsnorm", "float16", (9, 16384)),
         ("rmsnorm", "float32", (5, 20000)), ("rmsnorm", "bfloat16", (1, 1)),
         ("softmax", "bfloat16", (257, 1000)), ("softmax", "float16", (7, 32768)),
         ("softmax", "float32", (130, 5000)), ("softmax", "float32", (5, 20000)),
         ("softmax", "bfloat16", (4, 16384)), ("softmax", "float16", (1, 1)),
         ("matmul", "bfloat16", (257, 300, 1000)), ("matmul", "float16", (130, 513, 4097)),
         ("matmul", "bfloat16", (1, 1, 1)), ("matmul", "float16", (3, 4100, 260)),
         ("swiglu", "bfloat16", (257, 1000)), ("swiglu", "float16", (3, 5, 777)),
         ("swiglu", "float32", (130, 5000)), ("swiglu", "bfloat16", (1, 1))]


def _judge(kernel: str):
    """The kernel's judge module, for its inputs and float64 reference."""
    path = judge_of(kernel)
    spec = importlib.util.spec_from_file_location(f"competitor_judge_{kernel}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.gpu
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kernel,dtype,dims", CASES,
                         ids=[f"{k}-{d}-{'x'.join(map(str, s))}" for k, d, s in CASES])
def test_triton_competitor_matches_float64_reference(kernel, dtype, dims, seed):
    folder = ROOT / "kernels" / kernel
    rivals = module_for(str(folder)).competitors()
    if "triton" not in rivals:
        pytest.skip("Triton is not installed")
    judge = _judge(kernel)
    tol = tolerance(folder, dtype, dims=dims)
    if kernel == "matmul":   # as its judge: entries scaled so that C's are about 1
        scale = dims[2] ** -0.25
        inputs = judge._inputs(dtype, dims, seed, scale)
        expected = inputs[0].double() @ inputs[1].double()
    else:
        inputs = judge._inputs(dtype, dims, seed)
        expected = judge.reference(*inputs)

    def run():
        # the competitor allocates its output: hand it a block just filled with NaN, so that
        # elements it never writes show
        poison = torch.full(expected.shape, float("nan"), dtype=inputs[0].dtype, device="cuda")
        del poison
        return rivals["triton"](*inputs)

    check(f"triton-{kernel}", f"{dtype}{list(dims)}-seed{seed}", run, expected, **tol)


def test_competitors_are_empty_without_triton(monkeypatch):
    """Without Triton a kernel offers no competitor, rather than failing bench on an import."""
    from perfloop.contract import kernel

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    assert kernel.triton_competitor(ROOT / "kernels" / "rmsnorm", "triton_rmsnorm.py",
                                    "triton_rmsnorm") == {}


def test_torch_compile_keeps_a_compile_for_every_shape_bench_times(monkeypatch):
    """bench compiles the reference once per shape (dynamic=False), all for one code object:
    past dynamo's recompile limit (8) a further shape would silently run eager, so the
    torch.compile launcher lifts it before compiling anything."""
    import torch._dynamo

    from perfloop.child import launcher

    # dynamo's defaults, restored after the test (the launcher sets them process-wide)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)
    monkeypatch.setattr(torch._dynamo.config, "accumulated_recompile_limit", 256)
    launch = launcher.build({"kind": "compile",
                             "contract_folder": str(ROOT / "tests" / "readme_kernel" / "kernel")})
    assert callable(launch)
    assert torch._dynamo.config.recompile_limit >= 32
    assert torch._dynamo.config.accumulated_recompile_limit >= 32
