"""Softmax correctness, owned by the harness: the loop changes kernels/softmax/, never this file.

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

FOLDER = Path(__file__).resolve().parents[2] / "kernels" / "softmax"   # (this file: tests/judges/)
# (dtype, dims): tails no tile divides, a single element, 3-D, rows longer than any tile, a
# row count no rows-per-block divides, a vocabulary's row (wider than a whole-row tile), a few
# rows wider than a whole-row tile with a tail (split across blocks by the committed knobs)
CASES = [("bfloat16", (257, 1000)), ("float16", (3, 5, 777)), ("float32", (64, 4096)),
         ("bfloat16", (3, 32768)), ("float32", (1, 1)), ("float16", (33, 8193)),
         ("float32", (130, 5000)), ("bfloat16", (5, 50304)), ("float32", (6, 40000))]
SEEDS = (0, 1)
TOLERANCE = {dtype: tolerance(FOLDER, dtype) for dtype in ("bfloat16", "float16", "float32")}
COMBOS = {
    "all-gather": {"memory_path": "gather_scatter", "tile": [4, 1024],
                   "block_elems": 16384, "persistent": True, "occupancy": 2, "latency": 4,
                   "store_latency": 2, "fast_math": True},
    "all-hints": {"tile": [1, 2048], "persistent": True, "load_allow_tma": False,
                  "store_allow_tma": False, "latency": 8, "store_latency": 8, "fast_math": True},
    "no-split": {"split_rows": None},
}
VARIANTS = requested_variants() or default_variants(FOLDER, COMBOS)


def _inputs(dtype: str, dims: tuple, seed: int):
    """Logits of very different spreads; rows masked with -inf (in places, and all but one
    entry, at the end of the row, so an online pass meets -inf tiles first); a row of large
    magnitudes; a constant row; a row whose first quarter is -inf and the rest far below 0
    (a running max taken as 0 while all is -inf underflows every exp after it)."""
    g = torch.Generator().manual_seed(3000 + seed)
    x = torch.randn(dims, generator=g) * (torch.rand((*dims[:-1], 1), generator=g) * 20)
    rows = x.view(-1, dims[-1])
    n = dims[-1]
    if rows.shape[0] > 3:
        rows[0, ::3] = -torch.inf
        rows[1, : n - 1] = -torch.inf               # only the last entry is unmasked
        big = {"float16": 6e4, "bfloat16": 1e30, "float32": 1e30}[dtype]
        rows[2] = rows[2].sign() * big * torch.rand(n, generator=g)
        rows[3] = 7.0
    if rows.shape[0] > 4:
        rows[4, n // 4:] = -300 + torch.randn(n - n // 4, generator=g)
        rows[4, : n // 4] = -torch.inf
    return (x.to("cuda", getattr(torch, dtype)),)


def reference(x):
    return torch.softmax(x.double(), dim=-1)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype,dims", CASES, ids=[f"{d}-{'x'.join(map(str, s))}" for d, s in CASES])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v["label"] for v in VARIANTS])
def test_matches_float64_reference(variant, dtype, dims, seed):
    inputs = _inputs(dtype, dims, seed)

    def run():
        launch = module_for(variant["folder"]).build(variant["knobs"])
        out = torch.full_like(inputs[0], float("nan"))
        launch(inputs, out)
        return out

    check(variant["label"], f"{dtype}{list(dims)}-seed{seed}", run, reference(*inputs),
          **TOLERANCE[dtype])


@pytest.mark.skipif(requested_variants() is not None, reason="judging loop candidates only")
def test_public_entry_point_takes_strided_and_batched_inputs():
    (x,) = _inputs("bfloat16", (4, 6, 2 * 1000), 3)
    x = x[..., ::2]                 # not contiguous; row 1 is now all -inf: NaN, as in torch
    out = module_for(str(FOLDER)).softmax(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out.double(), reference(x), rtol=8e-3, atol=1e-5, equal_nan=True)
