"""cuTile row L2 norm: out[r] = sqrt(sum_j x[r, j] ** 2) over the last dimension, for bf16,
fp16 and fp32 x of shape (..., n); squares summed in float32, out of shape x.shape[:-1] in
x's dtype.

One block holds TM rows (a power of two). The row is read in one of three forms:
  one tile    the whole row, padded to a power of two, in one (TM, TN) tile;
  split       (split_row, n no power of two) a power-of-two head of TN columns, which lies
              inside the row and is never masked, and a power-of-two tail of TT columns,
              masked only where head + tail overrun n;
  looped      (tile's columns below the row's width) a loop over (TM, TN) column tiles, all
              unmasked but the last partial one, summed into a float32 accumulator.
A block whose rows all lie in x loads without bounds checks; the last, partial block branches
at run time to masked loads (tileiras issues a masked load of a width known only at launch
chunk by chunk: docs/writing-a-kernel.md, "Masked loads").

Knobs (knobs.json), each a compile-time constant or a kernel hint:
  memory_path      "load_store" (ct.load / ct.store) or "gather_scatter" (element indices)
  tile             [rows, cols]: rows per block, columns per tile (0: the whole row)
  block_elems      when set, rows per block = block_elems / (columns held), a power of two,
                   replacing tile's rows
  split_row        hold a row of n (no power of two) as head + tail tiles (above)
  latency          latency hint on x's loads (null: none)
  load_allow_tma   allow_tma on x's loads (null: the compiler's choice)
  store_latency    latency hint on the store (null: none)
  store_allow_tma  allow_tma on the store (null: the compiler's choice)
  occupancy        blocks per SM hint (null: the compiler's choice)
  persistent       a grid of SM count x occupancy blocks striding over the row blocks
  worker_warps     cuTile's num_worker_warps hint (4 or 8; null: the compiler's choice)
  fast_math        approximate square root, denormals flushed to zero
"""

from __future__ import annotations

import math
from pathlib import Path

import cuda.tile as ct
import torch

from perfloop import dispatch
from perfloop import kernel_tools as kt

ZERO = ct.PaddingMode.ZERO
UNSET = ct.PaddingMode.UNDETERMINED   # an unchecked load takes no padding mode
PERSISTENT_OCCUPANCY = 4              # blocks per SM of a persistent grid without occupancy
MAX_ROWS = 256                        # rows per block at most (block_elems over narrow rows)
DTYPES = kt.dtypes()
KNOBS = Path(__file__).resolve().parent / "knobs.json"

ONE_TILE, SPLIT, LOOPED = 0, 1, 2


def _hint(code: int):
    """-1/0/1 constants for null/false/true hints."""
    return None if code < 0 else code == 1


def _squares(x, t, j, TM: int, TN: int, GATHER: bool, LAT: int, TMA: int, CHECK: bool):
    """The (TM, TN) tile of rows t*TM.. and columns j*TN.. squared, as float32, zero outside
    x (CHECK: it may leave x; without it the load is not masked)."""
    if GATHER:
        rows = ct.reshape(t * TM + ct.arange(TM, dtype=ct.int32), (TM, 1))
        cols = ct.reshape(j * TN + ct.arange(TN, dtype=ct.int32), (1, TN))
        tile = ct.gather(x, (rows, cols), check_bounds=CHECK,
                         latency=LAT if LAT > 0 else None)
    else:
        tile = ct.load(x, (t, j), (TM, TN), padding_mode=ZERO if CHECK else UNSET,
                       check_bounds=CHECK, latency=LAT if LAT > 0 else None,
                       allow_tma=_hint(TMA))
    v = ct.astype(tile, ct.float32)
    return v * v


def _rows(x, out, t, TM: int, TN: int, TT: int, MODE: int, GATHER: bool, LAT: int, LTMA: int,
          SLAT: int, STMA: int, FAST: bool, EXACT: bool, CHECK: bool):
    """out[t*TM : (t+1)*TM] (CHECK: the block's last rows may lie past x's)."""
    n = x.shape[1]
    if MODE == SPLIT:
        ss = ct.sum(_squares(x, t, 0, TM, TN, GATHER, LAT, LTMA, CHECK), axis=1)
        ss = ss + ct.sum(_squares(x, t, TN // TT, TM, TT, GATHER, LAT, LTMA,
                                  CHECK or not EXACT), axis=1)
    elif MODE == ONE_TILE:
        ss = ct.sum(_squares(x, t, 0, TM, TN, GATHER, LAT, LTMA, CHECK or not EXACT), axis=1)
    else:
        acc = ct.full((TM, TN), 0.0, dtype=ct.float32)
        for j in range(n // TN):
            acc = acc + _squares(x, t, j, TM, TN, GATHER, LAT, LTMA, CHECK)
        if n % TN != 0:
            acc = acc + _squares(x, t, n // TN, TM, TN, GATHER, LAT, LTMA, True)
        ss = ct.sum(acc, axis=1)
    if FAST:
        norm = ct.sqrt(ss, rounding_mode=ct.RoundingMode.APPROX, flush_to_zero=True)
    else:
        norm = ct.sqrt(ss)
    norm = ct.astype(norm, out.dtype)
    if GATHER:
        ct.scatter(out, t * TM + ct.arange(TM, dtype=ct.int32), norm, check_bounds=CHECK,
                   latency=SLAT if SLAT > 0 else None)
    else:
        ct.store(out, (t,), norm, check_bounds=CHECK, latency=SLAT if SLAT > 0 else None,
                 allow_tma=_hint(STMA))


def _block(x, out, t, TM: int, TN: int, TT: int, MODE: int, GATHER: bool, LAT: int,
           LTMA: int, SLAT: int, STMA: int, FAST: bool, EXACT: bool):
    """Row block t: unmasked where all its rows are in x, else masked."""
    if (t + 1) * TM <= x.shape[0]:
        _rows(x, out, t, TM, TN, TT, MODE, GATHER, LAT, LTMA, SLAT, STMA, FAST, EXACT, False)
    else:
        _rows(x, out, t, TM, TN, TT, MODE, GATHER, LAT, LTMA, SLAT, STMA, FAST, EXACT, True)


def rownorm_kernel(x, out, TM: ct.Constant[int], TN: ct.Constant[int], TT: ct.Constant[int],
                   MODE: ct.Constant[int], GATHER: ct.Constant[bool], LAT: ct.Constant[int],
                   LTMA: ct.Constant[int], SLAT: ct.Constant[int], STMA: ct.Constant[int],
                   FAST: ct.Constant[bool], PERSIST: ct.Constant[bool],
                   EXACT: ct.Constant[bool]):
    """x is (m, n), out (m,). One block per TM rows, or a grid striding over them (PERSIST)."""
    if PERSIST:
        for t in range(ct.bid(0), ct.cdiv(x.shape[0], TM), ct.num_blocks(0)):
            _block(x, out, t, TM, TN, TT, MODE, GATHER, LAT, LTMA, SLAT, STMA, FAST, EXACT)
    else:
        _block(x, out, ct.bid(0), TM, TN, TT, MODE, GATHER, LAT, LTMA, SLAT, STMA, FAST, EXACT)


kernel_object = kt.kernel_objects(rownorm_kernel)   # (occupancy, num_ctas, worker_warps)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _geometry(knobs: dict, n: int) -> tuple[int, int, int, int]:
    """(rows per block, columns per tile, columns of the tail tile or 0, MODE) for rows of n."""
    rows, cols = knobs["tile"]
    whole = _pow2(n)
    if cols and cols < n:
        tn, tail, mode = _pow2(cols), 0, LOOPED
    else:
        tn, tail, mode = whole, 0, ONE_TILE
        if knobs["split_row"] and whole != n and n > 1:
            head = whole // 2
            rest = _pow2(n - head)
            if rest < head:            # else two tiles hold no fewer columns than one
                tn, tail, mode = head, rest, SPLIT
    if knobs["block_elems"]:           # a power of two, like every tile side
        rows = 1 << (max(knobs["block_elems"] // (tn + tail), 1).bit_length() - 1)
    rows = min(rows, MAX_ROWS)
    return rows, tn, tail, mode


def _constants(knobs: dict, n: int) -> tuple:
    rows, tn, tail, mode = _geometry(knobs, n)
    tma = kt.TMA_CODE
    gather = {"load_store": False, "gather_scatter": True}[knobs["memory_path"]]
    exact = (tn + tail == n) if mode != LOOPED else n % tn == 0
    return (rows, tn, tail, mode, gather, knobs["latency"] or 0, tma[knobs["load_allow_tma"]],
            knobs["store_latency"] or 0, tma[knobs["store_allow_tma"]],
            bool(knobs["fast_math"]), bool(knobs["persistent"]), exact)


def grid(knobs: dict, m: int, n: int, device) -> tuple[int]:
    return kt.grid(-(-m // _geometry(knobs, n)[0]), knobs["persistent"],
                   knobs["occupancy"] or PERSISTENT_OCCUPANCY, device)


def canonical(knobs: dict) -> dict:
    """The same knobs with what this kernel ignores set to one value: tile's rows when
    block_elems is set, and TMA on loads and store with gather/scatter."""
    if knobs["block_elems"]:
        knobs = {**knobs, "tile": (1, knobs["tile"][1])}
    if knobs["memory_path"] == "gather_scatter":
        knobs = {**knobs, "load_allow_tma": None, "store_allow_tma": None}
    return knobs


def build(knobs: dict):
    """launch((x,), out) for these knob values; out has shape x.shape[:-1] and x's dtype.
    A dispatch table in knobs.json holds per bucket of kernel.toml's [workload]; a bucket no
    benchmark shape measured is tuned once among the finalists (unseen = "tune")."""
    return dispatch.build(knobs, _build_one)


def _build_one(knobs: dict):
    kern = kernel_object(knobs["occupancy"], worker_warps=knobs["worker_warps"])

    def launch(inputs, out):
        (x,) = inputs
        x2 = x.reshape(-1, x.shape[-1])
        o1 = out.view(-1)
        if x2.shape[0] == 0:
            return out
        ct.launch(torch.cuda.current_stream(), grid(knobs, *x2.shape, x.device), kern,
                  (x2, o1, *_constants(knobs, x2.shape[1])))
        return out

    return launch


_launcher = kt.launchers(build, KNOBS)   # knobs (None: knobs.json's) -> launch, built once


def rownorm(x: torch.Tensor, knobs: dict | None = None) -> torch.Tensor:
    """The L2 norm of each row of x (over its last dimension), in x's dtype."""
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError("x must be bfloat16, float16 or float32")
    x = x.contiguous()
    out = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)
    _launcher(knobs)((x,), out)
    return out


# ---- the plug-in contract ------------------------------------------------------------------
def make_inputs(shape, seed: int, device):
    """x ~ N(0, 1), each row scaled by a factor in [0.25, 4.25)."""
    draw, dtype = kt.Draws(seed, device), DTYPES[shape.dtype]
    x = draw.normal(shape.dims, dtype)
    x *= (draw.uniform((*shape.dims[:-1], 1)) * 4 + 0.25).to(dtype)
    return (x,)


def empty_output(inputs):
    x = inputs[0]
    return torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)


def reference(x):
    """PyTorch eager (float32 inside; float64 stays float64), in x's dtype."""
    xf = x.float() if x.dtype != torch.float64 else x
    return torch.linalg.vector_norm(xf, dim=-1).to(x.dtype)


def traffic(shape) -> dict:
    """Read x once, write one value per row; one FMA (2 FLOPs) per element and a sqrt per
    row on the special-function units."""
    numel = math.prod(shape.dims)
    rows, size = numel // shape.dims[-1], DTYPES[shape.dtype].itemsize
    return {"bytes": (numel + rows) * size, "flops": {"fp32": 2 * numel, "sfu": rows}}


def compile_ahead(knobs: dict, shapes, arch: str) -> None:
    """Compile this variant for every (dtype, n) of `shapes` with tileiras, no GPU needed."""
    for dtype, n in sorted({(s.dtype, s.dims[-1]) for s in shapes}):
        args = [kt.array(dtype, 2), kt.array(dtype, 1), *_constants(knobs, n)]
        kt.export(kernel_object(knobs["occupancy"], worker_warps=knobs["worker_warps"]),
                  rownorm_kernel, [args], arch)
