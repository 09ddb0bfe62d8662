"""cuTile RMSNorm forward, y = x / sqrt(mean(x^2) + eps) * w over the last dimension, for
bf16, fp16 and fp32 x of shape (..., n) and w of shape (n,); float32 arithmetic inside.

Every knob in knobs.json is a compile-time constant or a kernel hint:
  memory_path      "load_store": tiles through ct.load/ct.store (TMA where allowed);
                   "gather_scatter": the same tiles through ct.gather/ct.scatter
  tile             [rows, cols]: rows per block, and columns per tile along n (0: the whole
                   row, padded to a power of two, in one tile). With cols < n the block loops
                   over the row twice
  block_elems      when set, rows per block = block_elems / columns per tile (at least 1),
                   replacing tile's rows: the same value then fits narrow and wide rows
  split_row        with the whole row in one tile (cols 0) and n not a power of two, hold
                   the row as two tiles, the largest power of two within n and a power-of-two
                   tail (5000: 4096 + 1024 instead of one 8192 tile, 5/8 of the registers;
                   5120 and 3072 then end at n, so their loads need no mask)
  latency          latency hint on the loads of x (null: none)
  load_allow_tma   allow_tma on the loads of x (null: the compiler's choice)
  store_latency    latency hint on the store (null: none)
  store_allow_tma  allow_tma on the store (null: the compiler's choice)
  occupancy        hint, blocks per SM (null: the compiler's choice)
  persistent       grid of SM count x occupancy blocks striding over the row blocks
  worker_warps     hint, warps per block that do the work (cuTile's num_worker_warps, 4 or 8;
                   null: the compiler's choice): a row held in few blocks wants more warps
  fast_math        approximate reciprocal square root, denormals flushed to zero

Where a block's tiles end at n and hold only rows of x, its loads and stores are not masked:
tileiras issues a masked load of dynamic width chunk by chunk, each waited for before the
next, which cost about 1 us a launch at a few rows. H100, do_bench, 34 x 2048 bf16: masked,
6.27 us with TMA and 5.63 without (Triton 4.70); unmasked, on another H100, 4.90 and 4.67
(Triton 4.93).
"""

from __future__ import annotations

import math
from pathlib import Path

import cuda.tile as ct
import torch

from perfloop import dispatch
from perfloop import kernel_tools as kt

EPS = 1e-6
ZERO = ct.PaddingMode.ZERO
UNSET = ct.PaddingMode.UNDETERMINED   # an unchecked load takes no other (tileiras 13.4)
PERSISTENT_OCCUPANCY = 4  # blocks per SM of a persistent grid when occupancy is unset
DTYPES = kt.dtypes()
KNOBS = Path(__file__).resolve().parent / "knobs.json"


def _hint(value: int):
    """-1/0/1 constants for null/false/true hints."""
    return None if value < 0 else value == 1


def _read(arr, t, j, TM: int, TN: int, GATHER: bool, LAT: int, TMA: int, CHECK: bool):
    """The (TM, TN) tile of rows t*TM.. and columns j*TN.. as float32, zero outside (CHECK:
    the tile may leave the array; without it the load is not masked)."""
    if GATHER:
        rows = ct.reshape(t * TM + ct.arange(TM, dtype=ct.int32), (TM, 1))
        cols = ct.reshape(j * TN + ct.arange(TN, dtype=ct.int32), (1, TN))
        tile = ct.gather(arr, (rows, cols), latency=LAT if LAT > 0 else None)
    else:
        tile = ct.load(arr, (t, j), (TM, TN), padding_mode=ZERO if CHECK else UNSET,
                       check_bounds=CHECK, latency=LAT if LAT > 0 else None,
                       allow_tma=_hint(TMA))
    return ct.astype(tile, ct.float32)


def _write(arr, t, j, tile, TM: int, TN: int, GATHER: bool, LAT: int, TMA: int, CHECK: bool):
    tile = ct.astype(tile, arr.dtype)
    if GATHER:
        rows = ct.reshape(t * TM + ct.arange(TM, dtype=ct.int32), (TM, 1))
        cols = ct.reshape(j * TN + ct.arange(TN, dtype=ct.int32), (1, TN))
        ct.scatter(arr, (rows, cols), tile, latency=LAT if LAT > 0 else None)
    else:
        ct.store(arr, (t, j), tile, check_bounds=CHECK, latency=LAT if LAT > 0 else None,
                 allow_tma=_hint(TMA))


def _weight(w, j, TN: int, CHECK: bool):
    """w's (1, TN) tile as float32, never by TMA: a TMA load of w is waited for before x's
    load is issued."""
    return ct.astype(ct.load(w, (0, j), (1, TN), padding_mode=ZERO if CHECK else UNSET,
                             check_bounds=CHECK, allow_tma=False), ct.float32)


def _scale(ss, n, FAST: bool):
    """1 / sqrt(ss / n + eps) per row."""
    if FAST:
        return ct.rsqrt(ss / n + EPS, flush_to_zero=True)
    return 1.0 / ct.sqrt(ss / n + EPS)


def _rows(x, w, y, t, TM: int, TN: int, TT: int, ONE_TILE: bool, GATHER: bool, LAT: int,
          LTMA: int, SLAT: int, STMA: int, FAST: bool, CHECK: bool):
    """Rows t*TM.. of y (CHECK: masked loads and stores)."""
    n = x.shape[1]
    if ONE_TILE and TT > 0:
        v = _read(x, t, 0, TM, TN, GATHER, LAT, LTMA, CHECK)
        u = _read(x, t, TN // TT, TM, TT, GATHER, LAT, LTMA, CHECK)
        g, h = _weight(w, 0, TN, CHECK), _weight(w, TN // TT, TT, CHECK)
        ss = ct.sum(v * v, axis=1, keepdims=True) + ct.sum(u * u, axis=1, keepdims=True)
        r = _scale(ss, n, FAST)
        _write(y, t, 0, v * r * g, TM, TN, GATHER, SLAT, STMA, CHECK)
        _write(y, t, TN // TT, u * r * h, TM, TT, GATHER, SLAT, STMA, CHECK)
    elif ONE_TILE:
        v = _read(x, t, 0, TM, TN, GATHER, LAT, LTMA, CHECK)
        g = _weight(w, 0, TN, CHECK)
        r = _scale(ct.sum(v * v, axis=1, keepdims=True), n, FAST)
        _write(y, t, 0, v * r * g, TM, TN, GATHER, SLAT, STMA, CHECK)
    else:
        tiles = ct.cdiv(n, TN)
        acc = ct.full((TM, TN), 0.0, dtype=ct.float32)
        for j in range(tiles):
            v = _read(x, t, j, TM, TN, GATHER, LAT, LTMA, True)
            acc = acc + v * v
        r = _scale(ct.sum(acc, axis=1, keepdims=True), n, FAST)
        for j in range(tiles):
            v = _read(x, t, j, TM, TN, GATHER, LAT, LTMA, True)
            _write(y, t, j, v * r * _weight(w, j, TN, True), TM, TN, GATHER, SLAT, STMA, True)


def _block(x, w, y, t, TM: int, TN: int, TT: int, ONE_TILE: bool, GATHER: bool, LAT: int,
           LTMA: int, SLAT: int, STMA: int, FAST: bool, EXACT: bool):
    """Rows t*TM.. of y; unmasked where EXACT (the row's tiles end at n) and the block's rows
    are all in x (the module's docstring says why)."""
    if EXACT and (t + 1) * TM <= x.shape[0]:
        _rows(x, w, y, t, TM, TN, TT, ONE_TILE, GATHER, LAT, LTMA, SLAT, STMA, FAST, False)
    else:
        _rows(x, w, y, t, TM, TN, TT, ONE_TILE, GATHER, LAT, LTMA, SLAT, STMA, FAST, True)


def rmsnorm_kernel(x, w, y, TM: ct.Constant[int], TN: ct.Constant[int], TT: ct.Constant[int],
                   ONE_TILE: ct.Constant[bool], GATHER: ct.Constant[bool],
                   LAT: ct.Constant[int], LTMA: ct.Constant[int], SLAT: ct.Constant[int],
                   STMA: ct.Constant[int], FAST: ct.Constant[bool], PERSIST: ct.Constant[bool],
                   EXACT: ct.Constant[bool]):
    """One block per TM rows (grid-stride when PERSIST); ONE_TILE when TN (plus a tail tile
    of TT columns at column TN, when TT > 0) covers the row. w is (1, n). Without PERSIST
    there is no loop: in one, w's load is hoisted before the loop and waited for before x's
    load is issued (a DRAM round trip more per block)."""
    if PERSIST:
        for t in range(ct.bid(0), ct.cdiv(x.shape[0], TM), ct.num_blocks(0)):
            _block(x, w, y, t, TM, TN, TT, ONE_TILE, GATHER, LAT, LTMA, SLAT, STMA, FAST, EXACT)
    else:
        _block(x, w, y, ct.bid(0), TM, TN, TT, ONE_TILE, GATHER, LAT, LTMA, SLAT, STMA, FAST,
               EXACT)


kernel_object = kt.kernel_objects(rmsnorm_kernel)   # (occupancy, num_ctas, worker_warps)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _geometry(knobs: dict, n: int) -> tuple[int, int, int]:
    """(rows per block, columns per tile, columns of the tail tile or 0) for rows of n."""
    rows, cols = knobs["tile"]
    whole = _pow2(n)
    tn = whole if not cols or cols >= whole else cols
    tail = 0
    if knobs["split_row"] and tn == whole and whole != n:
        head = whole // 2
        tail = _pow2(n - head)
        if tail < head:   # else two tiles hold no fewer columns than one
            tn = head
        else:
            tail = 0
    if knobs["block_elems"]:   # rows per block must be a power of two, like every tile side
        rows = 1 << max(knobs["block_elems"] // (tn + tail), 1).bit_length() - 1
    return rows, tn, tail


def _constants(knobs: dict, n: int) -> tuple:
    rows, tn, tail = _geometry(knobs, n)
    tma = kt.TMA_CODE
    gather = {"load_store": False, "gather_scatter": True}[knobs["memory_path"]]
    return (rows, tn, tail, tn + tail >= n, gather, knobs["latency"] or 0, tma[knobs["load_allow_tma"]],
            knobs["store_latency"] or 0, tma[knobs["store_allow_tma"]], bool(knobs["fast_math"]),
            bool(knobs["persistent"]), tn + tail == n)


def grid(knobs: dict, m: int, n: int, device) -> tuple[int]:
    return kt.grid(-(-m // _geometry(knobs, n)[0]), knobs["persistent"],
                   knobs["occupancy"] or PERSISTENT_OCCUPANCY, device)


def canonical(knobs: dict) -> dict:
    """The same knobs with what this kernel ignores set to one value (perfloop.contract.knobspace):
    with block_elems set, tile's rows are not used."""
    if knobs["block_elems"]:
        return {**knobs, "tile": (1, knobs["tile"][1])}
    return knobs


def build(knobs: dict):
    """launch((x, w), y) for these knob values; y has x's shape and dtype.
    Values in knobs.json's "dispatch" table hold only for their bucket of the workload in
    kernel.toml (dtype, rows' and row width's powers of two): rows matter as much as width,
    since a few hundred rows leave most SMs idle under a block size chosen for 16384. A
    bucket no benchmark shape measured is tuned once among the run's finalists (unseen =
    "tune")."""
    return dispatch.build(knobs, _build_one)


def _build_one(knobs: dict):
    kern = kernel_object(knobs["occupancy"], worker_warps=knobs["worker_warps"])

    def launch(inputs, out):
        x, w = inputs
        x2 = x.reshape(-1, x.shape[-1])
        y2 = out.view(-1, out.shape[-1])
        ct.launch(torch.cuda.current_stream(), grid(knobs, *x2.shape, x.device), kern,
                  (x2, w.view(1, -1), y2, *_constants(knobs, x2.shape[1])))
        return out

    return launch


def rmsnorm(x: torch.Tensor, w: torch.Tensor, knobs: dict | None = None) -> torch.Tensor:
    """RMSNorm of x over its last dimension, scaled by w, with the committed knob values."""
    if w.shape != (x.shape[-1],) or w.dtype != x.dtype:
        raise ValueError("w must have shape (x.shape[-1],) and x's dtype")
    x = x.contiguous()
    out = torch.empty_like(x)
    _launcher(knobs)((x, w.contiguous()), out)
    return out


_launcher = kt.launchers(build, KNOBS)   # knobs (None: knobs.json's) -> launch, built once


# ---- the plug-in contract ------------------------------------------------------------------
def make_inputs(shape, seed: int, device):
    """x ~ N(0, 1) with rows of different scales, w ~ 1 + N(0, 0.1)."""
    draw, dtype = kt.Draws(seed, device), DTYPES[shape.dtype]
    x = draw.normal(shape.dims, dtype)
    x *= (draw.uniform((*shape.dims[:-1], 1)) * 4 + 0.25).to(dtype)
    w = 1 + 0.1 * draw.normal(shape.dims[-1])
    return x, w.to(dtype)


def empty_output(inputs):
    return torch.empty_like(inputs[0])


def reference(x, w):
    """PyTorch eager in the inputs' dtype (float32 inside): the competitor in `perfloop bench`."""
    xf = x.float() if x.dtype != torch.float64 else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (y * w.to(y.dtype)).to(x.dtype)


def traffic(shape) -> dict:
    """Bytes that must move (read x and w, write y); fp32 FLOPs per element (square and add,
    one FMA: 2; scale; weight) and per row (mean, eps), and one rsqrt per row on the
    special-function units."""
    numel = math.prod(shape.dims)
    rows, size = numel // shape.dims[-1], DTYPES[shape.dtype].itemsize
    return {"bytes": (2 * numel + shape.dims[-1]) * size,
            "flops": {"fp32": 4 * numel + 2 * rows, "sfu": rows}}


def competitors() -> dict:
    """Other implementations `perfloop bench` times beside PyTorch's, {name: fn(x, w) -> y}:
    a Triton rmsnorm (one row per program) where Triton is installed."""
    from perfloop.kernel import triton_competitor

    return triton_competitor(Path(__file__).resolve().parent, "triton_rmsnorm.py",
                             "triton_rmsnorm")


def compile_ahead(knobs: dict, shapes, arch: str) -> None:
    """Compile this variant for every (dtype, n) of `shapes` with tileiras, no GPU needed."""
    for dtype, n in sorted({(s.dtype, s.dims[-1]) for s in shapes}):
        args = [kt.array(dtype, 2), kt.array(dtype, 2), kt.array(dtype, 2),
                *_constants(knobs, n)]
        kt.export(kernel_object(knobs["occupancy"], worker_warps=knobs["worker_warps"]),
                  rmsnorm_kernel, [args], arch)
