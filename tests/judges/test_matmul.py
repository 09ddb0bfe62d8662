"""Matmul correctness, owned by the harness: the loop changes kernels/matmul/, never this file.

Run by hand it judges the committed knobs, each knob at the ends of its range and a few
combinations; run by the loop it judges exactly the candidates the loop asks about. Outputs are
poisoned with NaN before the launch; the reference is float64; tolerances are the kernel's
own at each case's [M, N, K] (kernel.py's tolerance hook, the one the timer checks with), with
the absolute one scaled further by the size of the products when the inputs are larger than
make_inputs draws them.
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

FOLDER = Path(__file__).resolve().parents[2] / "kernels" / "matmul"   # (this file: tests/judges/)
# (dtype, (M, N, K)): tails in every dimension, one element, K shorter than any K step, exact
# tiles, a K tail of one, a skinny M, and rows past whole waves of tiles on 132 SMs (a
# tail_tile's second launch: 512 rows of 128x128 tiles, 88 of 64x128; tails in N and K)
CASES = [("bfloat16", (257, 300, 1000)), ("float16", (64, 64, 64)), ("bfloat16", (1, 1, 1)),
         ("float16", (130, 513, 4097)), ("bfloat16", (512, 512, 512)),
         ("bfloat16", (1000, 700, 8)), ("float16", (3, 4100, 260)),
         ("float16", (600, 4100, 72))]
SEEDS = (0, 1)
COMBOS = {
    "persistent-grouped": {"tile": [128, 128, 64], "group": 8, "persistent": True,
                           "occupancy": 2, "latency": 4},
    "wide-clustered": {"tile": [128, 256, 64], "num_ctas": 2, "group": 4,
                       "load_allow_tma": False, "store_allow_tma": False},
    # the few-rows finalist everywhere (no dispatch table), at every M of the cases
    "few-rows": {"tile": [16, 64, 128], "group": 4, "dispatch": {}},
    # whole waves of persistent 128x128 tiles, the rows past them in 64x128 ones, everywhere
    "wave-tail": {"tile": [128, 128, 64], "group": 8, "persistent": True,
                  "tail_tile": [64, 128, 64], "dispatch": {}},
}
VARIANTS = requested_variants() or default_variants(FOLDER, COMBOS)


def _inputs(dtype: str, dims: tuple, seed: int, scale: float):
    """A and B with entries of size `scale`; a zero row of A (C's row must be exactly 0), a
    row of A that cancels against equal entries of B, and a large entry in B."""
    m, n, k = dims
    g = torch.Generator().manual_seed(4000 + seed)
    a = torch.randn((m, k), generator=g) * scale
    b = torch.randn((k, n), generator=g) * scale
    a[0] = 0.0
    if m > 1 and k > 1:
        a[1, : k // 2 * 2] = torch.tensor([1.0, -1.0]).repeat(k // 2) * scale
        b[: k // 2 * 2] = b[0]                     # so row 1 of C sums to exactly 0
    b[-1, -1] = 30.0 * scale
    cast = getattr(torch, dtype)
    return a.to("cuda", cast), b.to("cuda", cast)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype,dims", CASES, ids=[f"{d}-{'x'.join(map(str, s))}" for d, s in CASES])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v["label"] for v in VARIANTS])
def test_matches_float64_reference(variant, dtype, dims, seed):
    # seed 0 normalized (entries of C about 1), seed 1 not: C's entries grow as sqrt(K)
    scale = dims[2] ** -0.25 if seed == 0 else 1.0
    a, b = _inputs(dtype, dims, seed, scale)
    expected = a.double() @ b.double()
    tol = tolerance(FOLDER, dtype, dims=dims)
    # the hook's atol assumes make_inputs' products, sum_k |a b| ~ sqrt(K); these are
    # sqrt(K) scale^2 times that
    tol["atol"] *= max(1.0, (dims[2] ** 0.5) * scale * scale)

    def run():
        launch = module_for(variant["folder"]).build(variant["knobs"])
        out = torch.full((dims[0], dims[1]), float("nan"), dtype=a.dtype, device="cuda")
        launch((a, b), out)
        return out

    check(variant["label"], f"{dtype}{list(dims)}-seed{seed}", run, expected, **tol)


@pytest.mark.skipif(requested_variants() is not None, reason="judging loop candidates only")
def test_public_entry_point_takes_strided_inputs_and_refuses_bad_ones():
    a, b = _inputs("bfloat16", (300, 200, 2 * 130), 3, 0.3)
    a_strided = a[:, ::2]                           # (300, 130), not contiguous
    out = module_for(str(FOLDER)).matmul(a_strided, b[:130])
    expected = a_strided.double() @ b[:130].double()
    assert out.shape == (300, 200) and out.dtype == torch.bfloat16
    assert float((out.double() - expected).norm() / expected.norm()) < 5e-3
    with pytest.raises(ValueError):
        module_for(str(FOLDER)).matmul(a, b[:130])  # K of 260 against 130
