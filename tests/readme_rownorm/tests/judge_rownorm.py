"""Row L2 norm correctness, owned by the repository: the loop changes kernels/rownorm/, never
this file.

Run by hand it judges the committed knobs, each knob at the ends of its range and a few
combinations (perfloop.correctness.default_variants); run by the loop it judges exactly the
candidates the loop asks about. Outputs are poisoned with NaN before the launch; the reference
is float64; tolerances are the kernel's declared ones (kernel.toml), as the timer uses them.
"""

from pathlib import Path

import pytest
import torch

from perfloop.correctness import (
    check,
    default_variants,
    module_for,
    requested_variants,
    tolerance,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

FOLDER = Path(__file__).resolve().parent.parent / "kernels" / "rownorm"
# (dtype, dims): odd widths no tile divides, one row, one element, 3-D inputs, widths no power
# of two (split rows whose tail is masked, or ends at n), row counts no rows-per-block divides
# (a partial last block), rows wider than a looped tile, and the benchmark's widths.
CASES = [("bfloat16", (257, 1000)), ("float16", (3, 5, 777)), ("float32", (64, 4096)),
         ("bfloat16", (1, 4096)), ("float32", (1, 1)), ("float16", (33, 8193)),
         ("bfloat16", (130, 5000)), ("float16", (9, 3000)), ("bfloat16", (7, 5120)),
         ("float32", (3, 17, 6001)), ("float16", (5, 11008)), ("bfloat16", (2, 16384)),
         ("float32", (1, 2049)), ("bfloat16", (1000, 2048))]
SEEDS = (0, 1)
TOLERANCE = {dtype: tolerance(FOLDER, dtype) for dtype in ("bfloat16", "float16", "float32")}
COMBOS = {
    "all-gather": {"memory_path": "gather_scatter", "tile": [4, 1024], "block_elems": None,
                   "persistent": True, "occupancy": 2, "latency": 4, "store_latency": 2,
                   "fast_math": True},
    "looped-blocks": {"tile": [1, 1024], "block_elems": 8192, "persistent": True,
                      "occupancy": 2},
    "padded-rows": {"split_row": False, "tile": [4, 0], "block_elems": None,
                    "fast_math": True},
    "split-gather": {"memory_path": "gather_scatter", "block_elems": 4096, "occupancy": 4,
                     "persistent": True},
    "all-hints": {"tile": [8, 512], "block_elems": None, "persistent": True,
                  "load_allow_tma": True, "store_allow_tma": True, "latency": 8,
                  "store_latency": 8, "worker_warps": 8},
}
VARIANTS = requested_variants() or default_variants(FOLDER, COMBOS)


def _inputs(dtype: str, dims: tuple, seed: int):
    """Rows of very different scales; an all-zero row (its norm must be exactly 0); a row of
    large magnitudes whose squares overflow the input dtype (fp16) but not float32, with a
    norm the output dtype still holds; a row of mostly the same small value."""
    g = torch.Generator().manual_seed(4000 + seed)
    n = dims[-1]
    x = torch.randn(dims, generator=g) * (torch.rand((*dims[:-1], 1), generator=g) * 8 + 1e-3)
    rows = x.view(-1, n)
    if rows.shape[0] > 2:
        rows[0] = 0.0
        big = {"float16": min(1e3, 3e4 / n ** 0.5), "bfloat16": 1e15, "float32": 1e15}[dtype]
        rows[1] = big * torch.sign(rows[1])
        rows[2, ::7] = 1e-3
    return x.to("cuda", getattr(torch, dtype))


def reference(x):
    return torch.linalg.vector_norm(x.double(), dim=-1)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype,dims", CASES,
                         ids=[f"{d}-{'x'.join(map(str, s))}" for d, s in CASES])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v["label"] for v in VARIANTS])
def test_matches_float64_reference(variant, dtype, dims, seed):
    x = _inputs(dtype, dims, seed)

    def run():
        launch = module_for(variant["folder"]).build(variant["knobs"])
        out = torch.full(x.shape[:-1], float("nan"), dtype=x.dtype, device=x.device)
        launch((x,), out)
        return out

    check(variant["label"], f"{dtype}{list(dims)}-seed{seed}", run, reference(x),
          **TOLERANCE[dtype])


@pytest.mark.skipif(requested_variants() is not None, reason="judging loop candidates only")
def test_public_entry_point_takes_strided_and_batched_inputs():
    x = _inputs("bfloat16", (4, 6, 2 * 1000), 3)[..., ::2]      # not contiguous
    out = module_for(str(FOLDER)).rownorm(x)
    expected = reference(x)
    assert out.shape == x.shape[:-1] and out.dtype == x.dtype
    assert float((out.double() - expected).norm() / expected.norm()) < 5e-3
