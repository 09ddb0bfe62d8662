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
  split_rows       below this many rows, a row wider than WHOLE_MAX is split across blocks
                   (null: never): two launches, each chunk's max and sum, then a combine
                   that writes (splits())
"""

from __future__ import annotations

import math
from pathlib import Path

import cuda.tile as ct
import torch

from perfloop import dispatch
from perfloop import kernel_tools as kt

NEG_INF = ct.PaddingMode.NEG_INF
UNSET = ct.PaddingMode.UNDETERMINED   # an unchecked load takes no other (tileiras 13.4)
APPROX = ct.RoundingMode.APPROX
LOG2E = 1.0 / math.log(2.0)
PERSISTENT_OCCUPANCY = 4  # blocks per SM of a persistent grid when occupancy is unset
# A whole row in one tile is held in registers as float32: past 32768 columns it spills
# (kernels/softmax/NOTES.md).
WHOLE_MAX = 32768
WIDE_COLS = 4096
SPLIT_COLS = 4096   # tile width of a row split across blocks (splits())
DTYPES = kt.dtypes()
KNOBS = Path(__file__).resolve().parent / "knobs.json"


def _hint(value: int):
    """-1/0/1 constants for null/false/true hints."""
    return None if value < 0 else value == 1


def _read(arr, t, j, TM: int, TN: int, GATHER: bool, LAT: int, TMA: int, CHECK: bool):
    """The (TM, TN) tile of rows t*TM.. and columns j*TN.. as float32, -inf outside (CHECK:
    the tile may leave the array; without it the load is not masked)."""
    if GATHER:
        rows = ct.reshape(t * TM + ct.arange(TM, dtype=ct.int32), (TM, 1))
        cols = ct.reshape(j * TN + ct.arange(TN, dtype=ct.int32), (1, TN))
        tile = ct.gather(arr, (rows, cols), padding_value=-math.inf,
                         latency=LAT if LAT > 0 else None)
    else:
        tile = ct.load(arr, (t, j), (TM, TN), padding_mode=NEG_INF if CHECK else UNSET,
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


def _online(m, s, v, FAST: bool):
    """(max, sum) of the rows so far and tile v: the sum is of exp(x - finite max) and is
    rescaled when the max grows. The max itself stays -inf while every entry is, so that a
    later tile of entries far below 0 is not taken against a max of 0 (exp would underflow)."""
    new = ct.maximum(m, ct.max(v, axis=1, keepdims=True))
    sub = _finite(new)
    return new, s * _exp(m - sub, FAST) + ct.sum(_exp(v - sub, FAST), axis=1, keepdims=True)


def _rows(x, y, t, TM: int, TN: int, ONE_TILE: bool, GATHER: bool, LAT: int, LTMA: int,
          SLAT: int, STMA: int, FAST: bool, CHECK: bool):
    """Rows t*TM.. of y (CHECK: masked loads and stores of the whole-row tile)."""
    if ONE_TILE:
        v = _read(x, t, 0, TM, TN, GATHER, LAT, LTMA, CHECK)
        e = _exp(v - _finite(ct.max(v, axis=1, keepdims=True)), FAST)
        _write(y, t, 0, _div(e, ct.sum(e, axis=1, keepdims=True), FAST), TM, TN, GATHER,
               SLAT, STMA, CHECK)
    else:
        tiles = ct.cdiv(x.shape[1], TN)
        m = ct.full((TM, 1), -math.inf, dtype=ct.float32)
        s = ct.full((TM, 1), 0.0, dtype=ct.float32)
        for j in range(tiles):
            m, s = _online(m, s, _read(x, t, j, TM, TN, GATHER, LAT, LTMA, True), FAST)
        sub = _finite(m)
        for j in range(tiles):
            v = _read(x, t, j, TM, TN, GATHER, LAT, LTMA, True)
            _write(y, t, j, _div(_exp(v - sub, FAST), s, FAST), TM, TN, GATHER, SLAT, STMA,
                   True)


def softmax_kernel(x, y, TM: ct.Constant[int], TN: ct.Constant[int],
                   ONE_TILE: ct.Constant[bool], GATHER: ct.Constant[bool],
                   LAT: ct.Constant[int], LTMA: ct.Constant[int], SLAT: ct.Constant[int],
                   STMA: ct.Constant[int], FAST: ct.Constant[bool], PERSIST: ct.Constant[bool],
                   EXACT: ct.Constant[bool]):
    """One block per TM rows (grid-stride when PERSIST); ONE_TILE when TN covers the row.
    Where EXACT (TN is n) a block whose rows all lie in x loads and stores unmasked:
    tileiras issues a masked load of dynamic width chunk by chunk, each waited for before
    the next (RMSNorm on an H100: about 1 us a launch at a few rows)."""
    if PERSIST:
        for t in range(ct.bid(0), ct.cdiv(x.shape[0], TM), ct.num_blocks(0)):
            _block(x, y, t, TM, TN, ONE_TILE, GATHER, LAT, LTMA, SLAT, STMA, FAST, EXACT)
    else:
        _block(x, y, ct.bid(0), TM, TN, ONE_TILE, GATHER, LAT, LTMA, SLAT, STMA, FAST, EXACT)


def _block(x, y, t, TM: int, TN: int, ONE_TILE: bool, GATHER: bool, LAT: int, LTMA: int,
           SLAT: int, STMA: int, FAST: bool, EXACT: bool):
    if EXACT and (t + 1) * TM <= x.shape[0]:
        _rows(x, y, t, TM, TN, ONE_TILE, GATHER, LAT, LTMA, SLAT, STMA, FAST, False)
    else:
        _rows(x, y, t, TM, TN, ONE_TILE, GATHER, LAT, LTMA, SLAT, STMA, FAST, True)


def split_partial_kernel(x, M, L, TN: ct.Constant[int], CH: ct.Constant[int],
                         LTMA: ct.Constant[int], FAST: ct.Constant[bool]):
    """A row split across blocks, first launch: block (row, s) takes its row's chunk s of CH
    tiles and stores the chunk's max and sum of exp(x - max) at M[row, s] and L[row, s]."""
    row = ct.bid(0) // M.shape[1]
    part = ct.bid(0) % M.shape[1]
    m = ct.full((1, 1), -math.inf, dtype=ct.float32)
    s = ct.full((1, 1), 0.0, dtype=ct.float32)
    for j in range(part * CH, min(part * CH + CH, ct.cdiv(x.shape[1], TN))):
        m, s = _online(m, s, _read(x, row, j, 1, TN, False, 0, LTMA, True), FAST)
    ct.store(M, (row, part), m)
    ct.store(L, (row, part), s)


def split_write_kernel(x, y, M, L, TN: ct.Constant[int], CH: ct.Constant[int],
                       PARTS: ct.Constant[int], LTMA: ct.Constant[int], SLAT: ct.Constant[int],
                       STMA: ct.Constant[int], FAST: ct.Constant[bool]):
    """Second launch: block (row, s) combines its row's maxima and sums (PARTS: their count
    rounded up to a power of two) and writes chunk s."""
    row = ct.bid(0) // M.shape[1]
    part = ct.bid(0) % M.shape[1]
    maxima = ct.load(M, (row, 0), (1, PARTS), padding_mode=NEG_INF)
    sums = ct.load(L, (row, 0), (1, PARTS), padding_mode=ct.PaddingMode.ZERO)
    sub = _finite(ct.max(maxima, axis=1, keepdims=True))
    total = ct.sum(sums * _exp(maxima - sub, FAST), axis=1, keepdims=True)
    for j in range(part * CH, min(part * CH + CH, ct.cdiv(x.shape[1], TN))):
        v = _read(x, row, j, 1, TN, False, 0, LTMA, True)
        _write(y, row, j, _div(_exp(v - sub, FAST), total, FAST), 1, TN, False, SLAT, STMA,
               True)


kernel_object = kt.kernel_objects(softmax_kernel)   # (occupancy, num_ctas, worker_warps)
SPLIT_KERNELS = (ct.kernel(split_partial_kernel), ct.kernel(split_write_kernel))


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
            bool(knobs["persistent"]), tn == n)


def splits(knobs: dict, m: int, n: int, sms: int) -> tuple[int, int, int] | None:
    """(chunks per row, tiles of SPLIT_COLS per chunk, chunks rounded up to a power of two)
    where the knobs split rows of n across blocks at m rows, else None: about two blocks per
    SM in all, and only past WHOLE_MAX columns. H100, do_bench, the split as a script with
    4096-column tiles against the shipped kernel (softmax()): bf16 1 x 128256 11.1 us against
    32.0 (torch.compile 17.2), 16 x 50304 fp16 13.6 against 17.5, fp32 8 x 128256 13.5
    against 35.4; it lost at 1 x 32000 (10.8 against 8.0) and 64 x 32000 (16.9 against 10.0)."""
    if not knobs["split_rows"] or m >= knobs["split_rows"] or n <= WHOLE_MAX:
        return None
    tiles = -(-n // SPLIT_COLS)
    chunk = -(-tiles // max(1, min(tiles, -(-2 * sms // m))))
    parts = -(-tiles // chunk)
    return parts, chunk, _pow2(parts)


def grid(knobs: dict, m: int, n: int, device) -> tuple[int]:
    rows = _geometry(knobs, m, n, kt.sm_count(device.index or 0))[0]
    return kt.grid(-(-m // rows), knobs["persistent"],
                   knobs["occupancy"] or PERSISTENT_OCCUPANCY, device)


def canonical(knobs: dict) -> dict:
    """The same knobs with what this kernel ignores set to one value (perfloop.contract.knobspace):
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
        sms = kt.sm_count(x2.device.index or 0)
        split = splits(knobs, *x2.shape, sms)
        if split:
            _split(knobs, x2, y2, *split)
        else:
            ct.launch(torch.cuda.current_stream(), grid(knobs, *x2.shape, x2.device), kern,
                      (x2, y2, *_constants(knobs, *x2.shape, sms)))
        return out

    return launch


def _split_constants(knobs: dict, chunk: int, parts_pow2: int) -> tuple[tuple, tuple]:
    tma, fast = kt.TMA_CODE, bool(knobs["fast_math"])
    return ((SPLIT_COLS, chunk, tma[knobs["load_allow_tma"]], fast),
            (SPLIT_COLS, chunk, parts_pow2, tma[knobs["load_allow_tma"]],
             knobs["store_latency"] or 0, tma[knobs["store_allow_tma"]], fast))


def _split(knobs: dict, x2, y2, parts: int, chunk: int, parts_pow2: int) -> None:
    """Rows split across blocks: partial maxima and sums, then a launch that combines and
    writes. The partials live in a float32 workspace of m x parts."""
    m = x2.shape[0]
    maxima = torch.empty((m, parts), dtype=torch.float32, device=x2.device)
    sums = torch.empty_like(maxima)
    first, second = _split_constants(knobs, chunk, parts_pow2)
    stream = torch.cuda.current_stream()
    ct.launch(stream, (m * parts,), SPLIT_KERNELS[0], (x2, maxima, sums, *first))
    ct.launch(stream, (m * parts,), SPLIT_KERNELS[1], (x2, y2, maxima, sums, *second))


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
    """Compile this variant for every (dtype, m, n) of `shapes` with tileiras, no GPU needed:
    the split kernels where it splits those rows."""
    for dtype, m, n in sorted({(s.dtype, math.prod(s.dims[:-1]), s.dims[-1]) for s in shapes}):
        array, sms = kt.array(dtype), kt.SM_COUNT.get(arch, 132)
        split = splits(knobs, m, n, sms)
        if split:
            first, second = _split_constants(knobs, *split[1:])
            f32 = kt.array("float32")
            kt.export(SPLIT_KERNELS[0], split_partial_kernel, [[array, f32, f32, *first]], arch)
            kt.export(SPLIT_KERNELS[1], split_write_kernel,
                      [[array, array, f32, f32, *second]], arch)
            continue
        kt.export(kernel_object(knobs["occupancy"], worker_warps=knobs["worker_warps"]),
                  softmax_kernel, [[array, array, *_constants(knobs, m, n, sms)]], arch)
