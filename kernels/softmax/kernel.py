"""cuTile row softmax over the last dimension, for bf16, fp16 and fp32 x of shape (..., n);
float32 arithmetic inside. Masked entries (-inf) get probability 0.

Every knob in knobs.json is a compile-time constant or a kernel hint:
  memory_path      "load_store": tiles through ct.load/ct.store (TMA where allowed);
                   "gather_scatter": the same tiles through ct.gather/ct.scatter
  tile             [rows, cols]: rows per block, and columns per tile along n (0: the whole
                   row, padded to a power of two, in one tile, up to WHOLE_MAX columns; a
                   wider row is read in tiles of WIDE_COLS). With cols < n the block reads
                   its rows twice: an online pass for the running max and sum, then a pass
                   that writes exp(x - max) / sum
  block_elems      when set, rows per block = block_elems / columns per tile (at least 1),
                   replacing tile's rows: the same value then fits narrow and wide rows.
                   Either way rows per block halve while the grid would have fewer than two
                   blocks per SM (perfloop.kernel_tools.fill_rows)
  latency          latency hint on the loads of x (null: none)
  load_allow_tma   allow_tma on the loads of x (null: the compiler's choice)
  store_latency    latency hint on the store (null: none)
  store_allow_tma  allow_tma on the store (null: the compiler's choice)
  occupancy        hint, blocks per SM (null: the compiler's choice)
  persistent       grid of SM count x occupancy blocks striding over the row blocks
  worker_warps     hint, warps per block that do the work (cuTile's num_worker_warps, 4 or 8;
                   null: the compiler's choice): a row held in few blocks wants more warps
  fast_math        exp2 of pre-scaled inputs and approximate division, denormals flushed
"""

from __future__ import annotations

import math
from pathlib import Path

import cuda.tile as ct
import torch

from perfloop import dispatch
from perfloop import kernel_tools as kt

NEG_INF = ct.PaddingMode.NEG_INF
APPROX = ct.RoundingMode.APPROX
LOG2E = 1.0 / math.log(2.0)
PERSISTENT_OCCUPANCY = 4  # blocks per SM of a persistent grid when occupancy is unset
# A whole row in one tile is held in registers as float32: past 32768 columns it spills. On
# an H100 (perfloop's device clock) bf16 1000 x 50304 as one 65536-column tile ran 533 us,
# in 4096-column tiles 131 (Triton 100); fp32 2048 x 50304 1279 against 420 (Triton 417).
WHOLE_MAX = 32768
WIDE_COLS = 4096
DTYPES = kt.dtypes()
KNOBS = Path(__file__).resolve().parent / "knobs.json"


def _hint(value: int):
    """-1/0/1 constants for null/false/true hints."""
    return None if value < 0 else value == 1


def _read(arr, t, j, TM: int, TN: int, GATHER: bool, LAT: int, TMA: int):
    """The (TM, TN) tile of rows t*TM.. and columns j*TN.. as float32, -inf outside."""
    if GATHER:
        rows = ct.reshape(t * TM + ct.arange(TM, dtype=ct.int32), (TM, 1))
        cols = ct.reshape(j * TN + ct.arange(TN, dtype=ct.int32), (1, TN))
        tile = ct.gather(arr, (rows, cols), padding_value=-math.inf,
                         latency=LAT if LAT > 0 else None)
    else:
        tile = ct.load(arr, (t, j), (TM, TN), padding_mode=NEG_INF,
                       latency=LAT if LAT > 0 else None, allow_tma=_hint(TMA))
    return ct.astype(tile, ct.float32)


def _write(arr, t, j, tile, TM: int, TN: int, GATHER: bool, LAT: int, TMA: int):
    tile = ct.astype(tile, arr.dtype)
    if GATHER:
        rows = ct.reshape(t * TM + ct.arange(TM, dtype=ct.int32), (TM, 1))
        cols = ct.reshape(j * TN + ct.arange(TN, dtype=ct.int32), (1, TN))
        ct.scatter(arr, (rows, cols), tile, latency=LAT if LAT > 0 else None)
    else:
        ct.store(arr, (t, j), tile, latency=LAT if LAT > 0 else None, allow_tma=_hint(TMA))


def _exp(x, FAST: bool):
    if FAST:
        return ct.exp2(x * LOG2E, flush_to_zero=True)
    return ct.exp(x)


def _div(x, y, FAST: bool):
    if FAST:
        return ct.truediv(x, y, rounding_mode=APPROX, flush_to_zero=True)
    return x / y


def _finite(m):
    """The row max to subtract: 0 where the whole row (so far) is -inf, so -inf - m is -inf
    and exp gives 0 instead of NaN."""
    return ct.where(m == -math.inf, 0.0, m)


def softmax_kernel(x, y, TM: ct.Constant[int], TN: ct.Constant[int],
                   ONE_TILE: ct.Constant[bool], GATHER: ct.Constant[bool],
                   LAT: ct.Constant[int], LTMA: ct.Constant[int], SLAT: ct.Constant[int],
                   STMA: ct.Constant[int], FAST: ct.Constant[bool], PERSIST: ct.Constant[bool]):
    """One block per TM rows (grid-stride when PERSIST); ONE_TILE when TN covers the row."""
    total = ct.cdiv(x.shape[0], TM)
    step = ct.num_blocks(0) if PERSIST else total
    for t in range(ct.bid(0), total, step):
        if ONE_TILE:
            v = _read(x, t, 0, TM, TN, GATHER, LAT, LTMA)
            e = _exp(v - _finite(ct.max(v, axis=1, keepdims=True)), FAST)
            _write(y, t, 0, _div(e, ct.sum(e, axis=1, keepdims=True), FAST), TM, TN, GATHER,
                   SLAT, STMA)
        else:
            tiles = ct.cdiv(x.shape[1], TN)
            m = ct.full((TM, 1), -math.inf, dtype=ct.float32)
            s = ct.full((TM, 1), 0.0, dtype=ct.float32)
            for j in range(tiles):  # online: rescale the running sum when the max grows
                v = _read(x, t, j, TM, TN, GATHER, LAT, LTMA)
                new = _finite(ct.maximum(m, ct.max(v, axis=1, keepdims=True)))
                s = s * _exp(m - new, FAST) + ct.sum(_exp(v - new, FAST), axis=1, keepdims=True)
                m = new
            for j in range(tiles):
                v = _read(x, t, j, TM, TN, GATHER, LAT, LTMA)
                _write(y, t, j, _div(_exp(v - m, FAST), s, FAST), TM, TN, GATHER, SLAT, STMA)


kernel_object = kt.kernel_objects(softmax_kernel)   # (occupancy, num_ctas, worker_warps)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _geometry(knobs: dict, m: int, n: int, sms: int) -> tuple[int, int]:
    """(rows per block, columns per tile) for m rows of n elements on `sms` SMs."""
    rows, cols = knobs["tile"]
    whole = _pow2(n)
    tn = whole if not cols or cols >= whole else cols
    if tn > WHOLE_MAX:
        tn = WIDE_COLS
    if knobs["block_elems"]:
        rows = max(1, knobs["block_elems"] // tn)
    return kt.fill_rows(rows, m, sms), tn


def _constants(knobs: dict, m: int, n: int, sms: int) -> tuple:
    rows, tn = _geometry(knobs, m, n, sms)
    tma = kt.TMA_CODE
    gather = {"load_store": False, "gather_scatter": True}[knobs["memory_path"]]
    return (rows, tn, tn >= n, gather, knobs["latency"] or 0, tma[knobs["load_allow_tma"]],
            knobs["store_latency"] or 0, tma[knobs["store_allow_tma"]], bool(knobs["fast_math"]),
            bool(knobs["persistent"]))


def grid(knobs: dict, m: int, n: int, device) -> tuple[int]:
    rows = _geometry(knobs, m, n, kt.sm_count(device.index or 0))[0]
    return kt.grid(-(-m // rows), knobs["persistent"],
                   knobs["occupancy"] or PERSISTENT_OCCUPANCY, device)


def canonical(knobs: dict) -> dict:
    """The same knobs with what this kernel ignores set to one value (perfloop.core.knobspace):
    with block_elems set, tile's rows are not used."""
    if knobs["block_elems"]:
        return {**knobs, "tile": (1, knobs["tile"][1])}
    return knobs


def build(knobs: dict):
    """launch((x,), y) for these knob values; y has x's shape and dtype.
    Values in knobs.json's "dispatch" table hold only for their bucket of the workload in
    kernel.toml (dtype and the row width's power of two). A bucket no benchmark shape
    measured is tuned once among the run's finalists (unseen = "tune"): 256 columns want
    several rows per block where 5000 want one, and a few vocabulary rows want more warps."""
    return dispatch.build(knobs, _build_one)


def _build_one(knobs: dict):
    kern = kernel_object(knobs["occupancy"], worker_warps=knobs["worker_warps"])

    def launch(inputs, out):
        x2 = inputs[0].reshape(-1, inputs[0].shape[-1])
        y2 = out.view(-1, out.shape[-1])
        ct.launch(torch.cuda.current_stream(), grid(knobs, *x2.shape, x2.device), kern,
                  (x2, y2, *_constants(knobs, *x2.shape, kt.sm_count(x2.device.index or 0))))
        return out

    return launch


def softmax(x: torch.Tensor, knobs: dict | None = None) -> torch.Tensor:
    """softmax(x, dim=-1) with the committed knob values (or the given ones)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    _launcher(knobs)((x,), out)
    return out


_launcher = kt.launchers(build, KNOBS)   # knobs (None: knobs.json's) -> launch, built once


# ---- the plug-in contract ------------------------------------------------------------------
def make_inputs(shape, seed: int, device):
    """Logits ~ N(0, 4^2): peaked rows, so a wrong max or sum shows."""
    return (kt.Draws(seed, device).normal(shape.dims, DTYPES[shape.dtype]).mul_(4),)


def empty_output(inputs):
    return torch.empty_like(inputs[0])


def reference(x):
    """PyTorch eager in the input's dtype: the competitor in `perfloop bench`."""
    return torch.softmax(x, dim=-1)


def traffic(shape) -> dict:
    """Bytes that must move (read x, write y); fp32 FLOPs per element (max, subtract, sum,
    scale by 1 / sum); on the special-function units an exp per element and a reciprocal of
    the sum per row."""
    numel = math.prod(shape.dims)
    rows = numel // shape.dims[-1]
    return {"bytes": 2 * numel * DTYPES[shape.dtype].itemsize,
            "flops": {"fp32": 4 * numel, "sfu": numel + rows}}


def competitors() -> dict:
    """Other implementations `perfloop bench` times beside PyTorch's, {name: fn(x) -> y}:
    a Triton softmax (one row per program) where Triton is installed."""
    from perfloop.kernel import triton_competitor

    return triton_competitor(Path(__file__).resolve().parent, "triton_softmax.py",
                             "triton_softmax")


def compile_ahead(knobs: dict, shapes, arch: str) -> None:
    """Compile this variant for every (dtype, n) of `shapes` with tileiras, no GPU needed."""
    for dtype, m, n in sorted({(s.dtype, math.prod(s.dims[:-1]), s.dims[-1]) for s in shapes}):
        array = kt.array(dtype)
        kt.export(kernel_object(knobs["occupancy"], worker_warps=knobs["worker_warps"]),
                  softmax_kernel,
                  [[array, array, *_constants(knobs, m, n, kt.SM_COUNT.get(arch, 132))]], arch)
