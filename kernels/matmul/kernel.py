"""cuTile matmul, C = A @ B for bf16 and fp16 A (M, K) and B (K, N), float32 accumulation.

Every knob in knobs.json is a compile-time constant or a kernel hint:
  tile             [tm, tn, tk]: C's tile per block and the K step of its loop
  group            grouped block order: blocks walk GROUP rows of C tiles column by column,
                   so consecutive blocks share B's tiles in L2 (null: row-major order)
  num_ctas         hint, CTAs per cluster (null: the compiler's choice)
  occupancy        hint, blocks per SM (null: the compiler's choice)
  worker_warps     hint, warps per block that do the work (cuTile's num_worker_warps, 4 or 8;
                   null: the compiler's, 4): 128x256x64 tiles without a cluster spill on 4
  persistent       grid of SM count x occupancy blocks striding over C's tiles
  latency          latency hint on the loads of A and B (null: none)
  load_allow_tma   allow_tma on the loads of A and B (null: the compiler's choice)
  store_allow_tma  allow_tma on the store of C (null: the compiler's choice)
  tail_tile        [tm, tn, tk] or null: the rows of C past the last whole wave of `tile`'s
                   blocks run in a second launch, in these smaller tiles and not persistent
                   (wave_rows), so the last wave is not left mostly idle
"""

from __future__ import annotations

import math
from pathlib import Path

import cuda.tile as ct
import torch

from perfloop import dispatch
from perfloop import kernel_tools as kt

ZERO = ct.PaddingMode.ZERO
PERSISTENT_OCCUPANCY = 1  # blocks per SM of a persistent grid when occupancy is unset
DTYPES = kt.dtypes(("bfloat16", "float16"))
KNOBS = Path(__file__).resolve().parent / "knobs.json"


def _hint(value: int):
    """-1/0/1 constants for null/false/true hints."""
    return None if value < 0 else value == 1


def _tile_of(t, tiles_m, tiles_n, GROUP: int):
    """The (row, column) of C's tile number t: row-major, or grouped by GROUP tile rows."""
    if GROUP > 0:
        per_group = GROUP * tiles_n
        first = (t // per_group) * GROUP
        rows = min(tiles_m - first, GROUP)
        return first + (t % per_group) % rows, (t % per_group) // rows
    return t // tiles_n, t % tiles_n


def _product(A, B, C, bm, bn, TM: int, TN: int, TK: int, LAT: int, LTMA: int, STMA: int):
    acc = ct.full((TM, TN), 0.0, dtype=ct.float32)
    for k in range(ct.cdiv(A.shape[1], TK)):
        a = ct.load(A, (bm, k), (TM, TK), padding_mode=ZERO,
                    latency=LAT if LAT > 0 else None, allow_tma=_hint(LTMA))
        b = ct.load(B, (k, bn), (TK, TN), padding_mode=ZERO,
                    latency=LAT if LAT > 0 else None, allow_tma=_hint(LTMA))
        acc = ct.mma(a, b, acc)
    ct.store(C, (bm, bn), ct.astype(acc, C.dtype), allow_tma=_hint(STMA))


def matmul_kernel(A, B, C, TM: ct.Constant[int], TN: ct.Constant[int], TK: ct.Constant[int],
                  GROUP: ct.Constant[int], PERSIST: ct.Constant[bool], LAT: ct.Constant[int],
                  LTMA: ct.Constant[int], STMA: ct.Constant[int]):
    """One block per (TM, TN) tile of C, or a grid-stride loop over them when PERSIST; tiles
    past M, N or K read zeros and store only what lies inside C."""
    tiles_m = ct.cdiv(A.shape[0], TM)
    tiles_n = ct.cdiv(B.shape[1], TN)
    if PERSIST:
        for t in range(ct.bid(0), tiles_m * tiles_n, ct.num_blocks(0)):
            bm, bn = _tile_of(t, tiles_m, tiles_n, GROUP)
            _product(A, B, C, bm, bn, TM, TN, TK, LAT, LTMA, STMA)
    else:
        bm, bn = _tile_of(ct.bid(0), tiles_m, tiles_n, GROUP)
        _product(A, B, C, bm, bn, TM, TN, TK, LAT, LTMA, STMA)


kernel_object = kt.kernel_objects(matmul_kernel)   # (occupancy, num_ctas, warps) -> ct.kernel


def _constants(knobs: dict) -> tuple:
    tma = kt.TMA_CODE
    tm, tn, tk = knobs["tile"]
    return (tm, tn, tk, knobs["group"] or 0, bool(knobs["persistent"]), knobs["latency"] or 0,
            tma[knobs["load_allow_tma"]], tma[knobs["store_allow_tma"]])


def grid(knobs: dict, m: int, n: int, device) -> tuple[int]:
    tm, tn, _ = knobs["tile"]
    return kt.grid(-(-m // tm) * -(-n // tn), knobs["persistent"],
                   knobs["occupancy"] or PERSISTENT_OCCUPANCY, device)


def wave_rows(m: int, n: int, tm: int, tn: int, slots: int) -> int:
    """The rows of C whose (tm, tn) tiles make whole waves of `slots` blocks (SMs x blocks
    per SM): the first launch's share where tail_tile is set. 0 (no second launch) where the
    whole rows of tiles make less than one wave or the first launch would take every row.
    H100, bf16 1721 x 4096 x 4096: 448 tiles of 128x128 are 3.4 waves; 1536 rows in them and
    185 in 64x128 tiles ran 92.9 us against 100.8 in one launch (cuBLAS 78.7)."""
    per_row = -(-n // tn)
    waves = (m // tm) * per_row // slots
    rows = waves * slots // per_row * tm
    return rows if 0 < rows < m else 0


def _tail_knobs(knobs: dict) -> dict:
    """The second launch's knobs: tail_tile's tiles, one block per tile, the compiler's hints."""
    return {**knobs, "tile": knobs["tail_tile"], "persistent": False, "num_ctas": None,
            "occupancy": None, "worker_warps": None, "tail_tile": None}


def build(knobs: dict):
    """launch((a, b), c) for these knob values; c is (M, N) in a's dtype.
    Values in knobs.json's "dispatch" table hold only for their bucket of the workload in
    kernel.toml (dtype and the powers of two of M, N and K): which tile wins turns on how
    many tiles the product makes against the SMs, so on N as much as on M. A bucket no
    benchmark shape measured is tuned once among the run's finalists (unseen = "tune")."""
    return dispatch.build(knobs, _build_one)


def _build_one(knobs: dict):
    whole = _one_launch(knobs)
    if not knobs.get("tail_tile"):
        return whole
    tail = _one_launch(_tail_knobs(knobs))
    tm, tn, _ = knobs["tile"]
    per_sm = knobs["occupancy"] or PERSISTENT_OCCUPANCY

    def launch(inputs, out):
        a, b = inputs
        rows = wave_rows(a.shape[0], b.shape[1], tm, tn, kt.sm_count(a.device.index or 0) * per_sm)
        if not rows:
            return whole(inputs, out)
        whole((a[:rows], b), out[:rows])
        tail((a[rows:], b), out[rows:])
        return out

    return launch


def _one_launch(knobs: dict):
    kern = kernel_object(knobs["occupancy"], knobs["num_ctas"], knobs["worker_warps"])
    consts = _constants(knobs)

    def launch(inputs, out):
        a, b = inputs
        ct.launch(torch.cuda.current_stream(), grid(knobs, a.shape[0], b.shape[1], a.device),
                  kern, (a, b, out, *consts))
        return out

    return launch


def matmul(a: torch.Tensor, b: torch.Tensor, knobs: dict | None = None) -> torch.Tensor:
    """a @ b with the committed knob values (or the given ones)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError("a must be (M, K) and b (K, N)")
    if a.dtype != b.dtype or a.dtype not in DTYPES.values():
        raise ValueError("a and b must both be bfloat16 or both float16")
    a, b = a.contiguous(), b.contiguous()
    out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    _launcher(knobs)((a, b), out)
    return out


_launcher = kt.launchers(build, KNOBS)   # knobs (None: knobs.json's) -> launch, built once


# ---- the plug-in contract ------------------------------------------------------------------
# A shape's dims are [M, N, K].
def make_inputs(shape, seed: int, device):
    """A ~ N(0, 1) and B ~ N(0, 1) / sqrt(K), so C's entries are about N(0, 1) at every K and
    one tolerance per dtype fits every shape."""
    m, n, k = shape.dims
    draw, dtype = kt.Draws(seed, device), DTYPES[shape.dtype]
    return draw.normal((m, k), dtype), draw.normal((k, n), dtype).div_(k ** 0.5)


def empty_output(inputs):
    a, b = inputs
    return torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)


def reference(a, b):
    """torch.matmul in the inputs' dtype (cuBLAS on a GPU): the competitor in `perfloop bench`."""
    return torch.matmul(a, b)


# C's tolerance at [M, N, K]. Two errors add up:
#  - rounding C to the output dtype, relative and K-free: unit roundoff 2^-8 (bf16), 2^-11
#    (fp16). RTOL allows 2u and 4u per element, MAX_REL what that rounding gives norm-wise
#    (~1.7e-3 bf16, ~2.1e-4 fp16, measured on the CPU) with room to spare;
#  - the float32 sum of K products, each exact in float32 (8- or 11-bit significands). By
#    Higham & Mary's probabilistic analysis (SIAM J. Sci. Comput. 41(5), 2019) an element's
#    error is within lambda * sqrt(K) * u32 * sum_k |a_ik b_kj|, u32 = 2^-24, with probability
#    at least 1 - 2K exp(-lambda^2 / 2) each: with lambda = 8, under 0.2% that any of the 16M
#    elements of the 4096^3 product exceeds it. make_inputs draws A ~ N(0, 1) and
#    B ~ N(0, 1/K), so C's entries are ~N(0, 1) and sum_k |a_ik b_kj| ~ (2/pi) sqrt(K):
#    atol = 8 (2/pi) K u32. Norm-wise the sum's error is its rms, ~sqrt(K) u32; 32 sqrt(K) u32
#    covers even products added one at a time with truncation toward zero (a CPU emulation,
#    worse than tensor cores: 15 sqrt(K) u32 at K = 2000).
# A judge whose inputs are larger multiplies atol by its own scale (tests/judges/test_matmul.py).
# At the benchmark shapes, rtol / atol / max_rel_err (fixed before: 8e-3 / 2e-3 / 5e-3 bf16,
# 2e-3 / 5e-4 / 1e-3 fp16):
#   4096^3 bf16           8e-3 / 1.24e-3 / 5.12e-3
#   128 x 8192 x 8192 bf16 8e-3 / 2.49e-3 / 5.17e-3
#   3000 x 5000 x 2000 fp16 2e-3 / 6.07e-4 / 1.09e-3
# Dropping even one of K's products costs ~1/sqrt(K) norm-wise (1.1e-2 at K = 8192): it fails.
U32 = 2.0 ** -24
RTOL = {"bfloat16": 8e-3, "float16": 2e-3}
MAX_REL = {"bfloat16": 5e-3, "float16": 1e-3}


def tolerance(shape, index: int, dtype: str) -> dict | None:
    """C's tolerance at shape.dims = [M, N, K] (perfloop.contract.hooks); None for other dtypes."""
    if dtype not in RTOL:
        return None
    k = shape.dims[2]
    return {"rtol": RTOL[dtype], "atol": 8 * (2 / math.pi) * k * U32,
            "max_rel_err": MAX_REL[dtype] + 32 * math.sqrt(k) * U32}


def traffic(shape) -> dict:
    """Bytes that must move (read A and B once, write C) and tensor-core FLOPs (2 M N K) at
    the inputs' dtype ("tensor.bfloat16" or "tensor.float16": one rate)."""
    m, n, k = shape.dims
    return {"bytes": (m * k + k * n + m * n) * DTYPES[shape.dtype].itemsize,
            "flops": {f"tensor.{shape.dtype}": 2 * m * n * k}}


def competitors() -> dict:
    """Other implementations `perfloop bench` times beside PyTorch's, {name: fn(a, b) -> c}:
    a Triton matmul where Triton is installed."""
    from perfloop.kernel import triton_competitor

    return triton_competitor(Path(__file__).resolve().parent, "triton_matmul.py",
                             "triton_matmul")


def compile_ahead(knobs: dict, shapes, arch: str) -> None:
    """Compile this variant (and its tail launch's) for every dtype of `shapes` with
    tileiras, no GPU needed."""
    for each in [knobs] + ([_tail_knobs(knobs)] if knobs.get("tail_tile") else []):
        arg_lists = [[kt.array(dtype)] * 3 + list(_constants(each))
                     for dtype in sorted({s.dtype for s in shapes})]
        kt.export(kernel_object(each["occupancy"], each["num_ctas"], each["worker_warps"]),
                  matmul_kernel, arg_lists, arch)
