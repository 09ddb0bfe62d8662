"""RMSNorm correctness, owned by the harness: the loop changes kernels/rmsnorm/, never this file.

Run by hand it judges the committed knobs, each knob at the ends of its range and a few
combinations; run by the loop it judges exactly the candidates the loop asks about. Outputs are
poisoned with NaN before the launch; the reference is float64; tolerances are the kernel's
declared ones (kernel.toml), as the timer uses them.
"""

from pathlib import Path

import pytest

from perfloop.correctness import (
    check,
    default_variants,
    module_for,
    requested_variants,
    tolerance,
)

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

FOLDER = Path(__file__).resolve().parents[2] / "kernels" / "rmsnorm"   # (this file: tests/judges/)
EPS = 1e-6
# (dtype, dims): tails no tile divides, a single element, 3-D, rows wider than any tile, a
# row count no rows-per-block divides, a row held unmasked as two tiles (split_row) in blocks
# of which the last is partial
CASES = [("bfloat16", (257, 1000)), ("float16", (3, 5, 777)), ("float32", (64, 4096)),
         ("bfloat16", (3, 16384)), ("float32", (1, 1)), ("float16", (33, 8193)),
         ("bfloat16", (130, 5000)), ("float16", (9, 3000)), ("bfloat16", (7, 5120))]
SEEDS = (0, 1)
TOLERANCE = {dtype: tolerance(FOLDER, dtype) for dtype in ("bfloat16", "float16", "float32")}
COMBOS = {
    "all-gather": {"memory_path": "gather_scatter", "tile": [4, 1024],
                   "block_elems": 16384, "persistent": True, "occupancy": 2, "latency": 4,
                   "store_latency": 2, "fast_math": True},
    "split-rows": {"split_row": True, "tile": [4, 0], "fast_math": True},
    "split-gather": {"split_row": True, "memory_path": "gather_scatter", "block_elems": 16384,
                     "occupancy": 2},
    "all-hints": {"tile": [8, 512], "persistent": True, "load_allow_tma": False,
                  "store_allow_tma": False, "latency": 8, "store_latency": 8, "fast_math": True},
}
VARIANTS = requested_variants() or default_variants(FOLDER, COMBOS)


def _inputs(dtype: str, dims: tuple, seed: int):
    """Rows of very different scales, an all-zero row, a row of large magnitudes (whose
    squares overflow fp16, and whose sum of squares stays inside float32)."""
    g = torch.Generator().manual_seed(2000 + seed)
    x = torch.randn(dims, generator=g) * (torch.rand((*dims[:-1], 1), generator=g) * 8 + 1e-3)
    w = 1 + 0.5 * torch.randn(dims[-1], generator=g)
    rows = x.view(-1, dims[-1])
    rows[0] = 0.0                                   # rsqrt(eps): the output must be exactly 0
    if rows.shape[0] > 2:
        big = {"float16": 3e4, "bfloat16": 1e15, "float32": 1e15}[dtype]
        rows[1] = big * torch.sign(rows[1])
        rows[2, ::7] = 1e-3                         # mostly the same small values
    cast = getattr(torch, dtype)
    return x.to("cuda", cast), w.to("cuda", cast)


def reference(x, w):
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype,dims", CASES, ids=[f"{d}-{'x'.join(map(str, s))}" for d, s in CASES])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v["label"] for v in VARIANTS])
def test_matches_float64_reference(variant, dtype, dims, seed):
    x, w = _inputs(dtype, dims, seed)

    def run():
        launch = module_for(variant["folder"]).build(variant["knobs"])
        out = torch.full_like(x, float("nan"))
        launch((x, w), out)
        return out

    check(variant["label"], f"{dtype}{list(dims)}-seed{seed}", run, reference(x, w),
          **TOLERANCE[dtype])


@pytest.mark.skipif(requested_variants() is not None, reason="judging loop candidates only")
def test_public_entry_point_takes_strided_and_batched_inputs():
    x, w = _inputs("bfloat16", (4, 6, 2 * 1000), 3)
    x = x[..., ::2]                                 # not contiguous
    out = module_for(str(FOLDER)).rmsnorm(x, w[:1000])
    expected = reference(x, w[:1000])
    assert out.shape == x.shape and out.dtype == x.dtype
    assert float((out.double() - expected).norm() / expected.norm()) < 5e-3
