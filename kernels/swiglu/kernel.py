"""cuTile SwiGLU forward, c = silu(a) * b, for bf16, fp16 and fp32 inputs of shape (..., n).

Every knob in knobs.json is a compile-time constant or a kernel hint:
  memory_path      "load_store": each tile through ct.load/ct.store (TMA where the compiler
                   chooses); "gather_scatter": the same tiles through ct.gather/ct.scatter
  tile             [rows, cols] of one tile; a block handles one tile (or strides, persistent)
  occupancy        hint, blocks per SM (null: the compiler's choice)
  num_ctas         hint, CTAs per cluster (null: the compiler's choice)
  fast_math        flush-to-zero and approximate division in the sigmoid (false: IEEE)
  latency          latency hint on the loads (null: none)
  store_allow_tma  allow_tma on the store (null: the compiler's choice)
  persistent       grid of SM count x occupancy blocks striding over the work
  autotune         launch through perfloop's autotune layer (occupancy searched once per shape)
  flat             view the (contiguous) inputs as rows of the tile's width, when that width
                   divides their size: elementwise, so rows do not matter, and no tile is then
                   cut short at the end of each row (n = 5000 leaves a 904-wide tail tile)
Each distinct variant is compiled once: kernel objects are cached by their hints, and cuTile
caches the compiled code per set of constants.
"""

from __future__ import annotations

import math
from pathlib import Path

import cuda.tile as ct
import torch

from perfloop import dispatch
from perfloop import kernel_tools as kt

ZERO = ct.PaddingMode.ZERO
APPROX = ct.RoundingMode.APPROX
PERSISTENT_OCCUPANCY = 4  # blocks per SM of a persistent grid when occupancy is unset
DTYPES = kt.dtypes()
KNOBS = Path(__file__).resolve().parent / "knobs.json"


def _silu_mul(x, y, FAST):
    x = ct.astype(x, ct.float32)
    y = ct.astype(y, ct.float32)
    if FAST:
        den = ct.add(1.0, ct.exp(-x), flush_to_zero=True)
        s = ct.truediv(x, den, rounding_mode=APPROX, flush_to_zero=True)
    else:
        s = x / (1.0 + ct.exp(-x))
    return s * y


def _load(arr, i, j, TR, TC, LAT):
    if LAT > 0:
        return ct.load(arr, (i, j), (TR, TC), padding_mode=ZERO, latency=LAT)
    return ct.load(arr, (i, j), (TR, TC), padding_mode=ZERO)


def _gather(arr, rows, cols, LAT):
    if LAT > 0:
        return ct.gather(arr, (rows, cols), latency=LAT)
    return ct.gather(arr, (rows, cols))


def swiglu_kernel(a, b, c, GATHER: ct.Constant[bool], TR: ct.Constant[int],
                  TC: ct.Constant[int], FAST: ct.Constant[bool], LAT: ct.Constant[int],
                  STORE_TMA: ct.Constant[int], PERSIST: ct.Constant[bool],
                  ONE_COL: ct.Constant[bool]):
    """c = silu(a) * b over TR x TC tiles: one tile per block, or grid-stride when PERSIST.
    GATHER moves each tile with element indices (ct.gather/ct.scatter, bounds-checked, no
    tensor maps) instead of ct.load/ct.store; STORE_TMA does not apply to scatter. ONE_COL:
    one column of tiles (a flat view, or rows no wider than TC), so the grid's x is 1."""
    if PERSIST:
        n_cols = ct.cdiv(a.shape[1], TC)
        total = ct.cdiv(a.shape[0], TR) * n_cols
        for t in range(ct.bid(0), total, ct.num_blocks(0)):
            _tile(a, b, c, t // n_cols, t % n_cols, GATHER, TR, TC, FAST, LAT, STORE_TMA)
    else:
        # column tiles on x, row tiles over y and z (kt.spread_grid): no division by a
        # runtime count before the first load (2-3% of a launch at a few rows)
        i = ct.bid(1) + ct.bid(2) * ct.num_blocks(1)
        if i < ct.cdiv(a.shape[0], TR):
            if ONE_COL:   # bid(0) is an exact division by the cluster's width: skip it
                _tile(a, b, c, i, 0, GATHER, TR, TC, FAST, LAT, STORE_TMA)
            else:
                _tile(a, b, c, i, ct.bid(0), GATHER, TR, TC, FAST, LAT, STORE_TMA)


def _tile(a, b, c, i, j, GATHER, TR, TC, FAST, LAT, STORE_TMA):
    if GATHER:
        rows = ct.reshape(i * TR + ct.arange(TR, dtype=ct.int32), (TR, 1))
        cols = ct.reshape(j * TC + ct.arange(TC, dtype=ct.int32), (1, TC))
        out = _silu_mul(_gather(a, rows, cols, LAT), _gather(b, rows, cols, LAT), FAST)
        ct.scatter(c, (rows, cols), ct.astype(out, c.dtype))
    else:
        out = ct.astype(_silu_mul(_load(a, i, j, TR, TC, LAT), _load(b, i, j, TR, TC, LAT),
                                  FAST), c.dtype)
        if STORE_TMA == 0:
            ct.store(c, (i, j), out, allow_tma=False)
        elif STORE_TMA == 1:
            ct.store(c, (i, j), out, allow_tma=True)
        else:
            ct.store(c, (i, j), out)


kernel_object = kt.kernel_objects(swiglu_kernel)   # (occupancy, num_ctas) -> ct.kernel


def _constants(knobs: dict) -> tuple:
    tma = kt.TMA_CODE[knobs["store_allow_tma"]]
    rows, cols = knobs["tile"]
    gather = {"load_store": False, "gather_scatter": True}[knobs["memory_path"]]
    return (gather, rows, cols, bool(knobs["fast_math"]), knobs["latency"] or 0, tma,
            bool(knobs["persistent"]))


def _one_col(knobs: dict, a) -> bool:
    return not knobs["persistent"] and a.shape[1] <= knobs["tile"][1]


def grid(knobs: dict, m: int, n: int, device, occupancy: int | None = None) -> tuple:
    rows, cols = knobs["tile"]
    if not knobs["persistent"]:   # column tiles on x, so blocks run in the rows' order
        return kt.spread_grid(-(-m // rows), x=-(-n // cols))
    return kt.grid(-(-m // rows) * -(-n // cols), True,
                   occupancy or knobs["occupancy"] or PERSISTENT_OCCUPANCY, device)


def _as_2d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]) if t.is_contiguous() else t.contiguous().view(-1, t.shape[-1])


def _operands(knobs: dict, inputs, out) -> tuple:
    """(a, b, c) as 2-D views: rows of the input's last dimension, or, with `flat` and a size
    the tile's width divides, rows of that width."""
    a, b = (_as_2d(t) for t in inputs)
    c = out.view(-1, out.shape[-1])
    width = knobs["tile"][1]
    if knobs.get("flat") and a.numel() % width == 0:
        a, b, c = (t.view(-1, width) for t in (a, b, c))
    return a, b, c


def build(knobs: dict):
    """launch(inputs, out) for these knob values; out has the inputs' shape and dtype.
    Values in knobs.json's "dispatch" table hold only for their bucket of inputs (bucket)."""
    return dispatch.build(knobs, _build_one, bucket)


bucket = dispatch.row_bucket   # the dispatch key: dtype and row width's power of two


def _build_one(knobs: dict):
    consts = _constants(knobs)
    if knobs.get("autotune"):
        return _autotuned(knobs, consts)
    kern = kernel_object(knobs["occupancy"], knobs["num_ctas"])

    def launch(inputs, out):
        a, b, c = _operands(knobs, inputs, out)
        ct.launch(torch.cuda.current_stream(), grid(knobs, *a.shape, a.device), kern,
                  (a, b, c, *consts, _one_col(knobs, a)))
        return out

    return launch


def _autotuned(knobs: dict, consts: tuple):
    """The launch through perfloop's autotune layer: the occupancy space of memory-bound
    kernels, with this variant's fixed occupancy always in it."""
    from perfloop.autotune import Autotuner, space_for

    base = kernel_object(None, knobs["num_ctas"])
    fixed = {"occupancy": knobs["occupancy"]}
    tuner = Autotuner(base, space=space_for("memory-bound", torch.cuda.get_device_capability()),
                      fixed=fixed, name=f"swiglu-{knobs['memory_path']}",
                      source=Path(__file__).read_bytes() + repr(sorted(knobs.items())).encode())

    def launch(inputs, out):
        a, b, c = _operands(knobs, inputs, out)
        key = (tuple(a.shape), str(a.dtype), str(a.device))
        tuner.launch(torch.cuda.current_stream(), key,
                     grid_fn=lambda cfg: grid(knobs, *a.shape, a.device, cfg["occupancy"]),
                     args_fn=lambda cfg: (a, b, c, *consts, _one_col(knobs, a)))
        return out

    launch.tuner = tuner
    return launch


def swiglu(a: torch.Tensor, b: torch.Tensor, knobs: dict | None = None) -> torch.Tensor:
    """silu(a) * b with the committed knob values (or the given ones)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError("a and b need the same shape and dtype")
    out = torch.empty_like(a, memory_format=torch.contiguous_format)
    _launcher(knobs)((a, b), out)
    return out


_launcher = kt.launchers(build, KNOBS)   # knobs (None: knobs.json's) -> launch, built once


# ---- the plug-in contract ------------------------------------------------------------------
def make_inputs(shape, seed: int, device):
    """Drawn on the device: the timer draws fresh inputs for every launch it times."""
    draw, dtype = kt.Draws(seed, device), DTYPES[shape.dtype]
    return draw.normal(shape.dims, dtype).mul_(3), draw.normal(shape.dims, dtype)


def empty_output(inputs):
    return torch.empty_like(inputs[0])


def reference(a, b):
    """PyTorch eager, in the inputs' dtype: the competitor in `perfloop bench`."""
    return torch.nn.functional.silu(a) * b


def traffic(shape) -> dict:
    """Bytes that must move (read a and b, write c); per element, the sigmoid's exp and
    reciprocal on the special-function units, and fp32 FLOPs (1 + exp, a x 1 / (1 + exp),
    times b)."""
    numel = math.prod(shape.dims)
    return {"bytes": 3 * numel * DTYPES[shape.dtype].itemsize,
            "flops": {"fp32": 3 * numel, "sfu": 2 * numel}}


def competitors() -> dict:
    """Other implementations `perfloop bench` times beside PyTorch's, {name: fn(a, b) -> c}:
    a Triton SwiGLU (flat, 4096 elements per program) where Triton is installed."""
    from perfloop.kernel import triton_competitor

    return triton_competitor(Path(__file__).resolve().parent, "triton_swiglu.py",
                             "triton_swiglu")


def compile_ahead(knobs: dict, shapes, arch: str) -> None:
    """Compile this variant for every dtype of `shapes` with tileiras, no GPU needed."""
    from perfloop.autotune import space_for

    occupancies = [knobs["occupancy"]]
    if knobs.get("autotune"):
        occupancies += [cfg["occupancy"] for cfg in space_for("memory-bound", _cc(arch))]
    consts = list(_constants(knobs))
    arg_lists = [[kt.array(dtype)] * 3 + consts + [one_col]
                 for dtype in sorted({s.dtype for s in shapes})
                 for one_col in ((False,) if knobs["persistent"] else (False, True))]
    for occupancy in dict.fromkeys(occupancies):
        kt.export(kernel_object(occupancy, knobs["num_ctas"]), swiglu_kernel, arg_lists, arch)


def _cc(arch: str) -> tuple[int, int]:
    digits = arch.removeprefix("sm_").rstrip("a")
    return int(digits[:-1]), int(digits[-1])
