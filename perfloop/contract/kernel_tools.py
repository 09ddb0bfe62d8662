"""What every cuTile kernel.py repeats, in one place (public as `perfloop.kernel_tools`):
kernel objects cached per set of hints, the launcher cached per set of knobs, the persistent
grid, hint constants, L2 streaming for read-once inputs, the inputs' random draws, and
ahead-of-time compilation.

Imported by kernel code, so it runs in the judge's and the timer's children too: it imports
nothing from perfloop, and torch and cuda.tile only when a function needs them.
"""

from __future__ import annotations

import ctypes
import functools
import io
import json
from pathlib import Path
from typing import Callable

DEFAULT_DTYPES = ("bfloat16", "float16", "float32")
TMA_CODE = {None: -1, False: 0, True: 1}   # an allow_tma knob as a compile-time constant


def dtypes(names=DEFAULT_DTYPES) -> dict:
    """{"bfloat16": torch.bfloat16, ...}: the torch dtypes kernel.toml's shapes name."""
    import torch

    return {name: getattr(torch, name) for name in names}


def kernel_objects(function) -> Callable:
    """kernel_object(occupancy=None, num_ctas=None, worker_warps=None): one ct.kernel of
    `function` per set of hints (None: the compiler's choice), made once and never rebuilt on
    the launch path. worker_warps is cuTile's num_worker_warps (4 or 8 with CTK 13.4)."""

    @functools.cache
    def made(occupancy, num_ctas, worker_warps):
        import cuda.tile as ct

        hints = {k: v for k, v in (("occupancy", occupancy), ("num_ctas", num_ctas),
                                   ("num_worker_warps", worker_warps)) if v is not None}
        return ct.kernel(function, **hints)

    def kernel_object(occupancy: int | None = None, num_ctas: int | None = None,
                      worker_warps: int | None = None):
        return made(occupancy, num_ctas, worker_warps)

    return kernel_object


def launchers(build: Callable[[dict], Callable], knobs_file: Path) -> Callable:
    """launcher(knobs=None) -> build(knobs): the kernel's launch for these knob values (None:
    knobs_file's, read at the first call), built once per distinct set of values. Lists
    become tuples, as perfloop passes them to build."""

    @functools.cache
    def built(text: str | None):
        knobs = json.loads(Path(knobs_file).read_text() if text is None else text)
        return build({k: tuple(v) if isinstance(v, list) else v for k, v in knobs.items()})

    def launcher(knobs: dict | None = None):
        return built(None if knobs is None else json.dumps(knobs, sort_keys=True))

    launcher.cache_clear = built.cache_clear
    return launcher


@functools.cache
def sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


SM_COUNT = {"sm_90": 132, "sm_100": 148}   # for compiling ahead without a GPU
WAVES = 2   # blocks per SM that a row kernel keeps, where it has the rows


def fill_rows(rows: int, m: int, sms: int) -> int:
    """Rows per block: `rows` (a power of two), halved while m rows would make fewer than
    WAVES blocks per SM. A block of many short rows, right for 16384 of them, leaves most SMs
    idle at a few thousand (H100 softmax, 11782 x 128: 46 blocks of 256 rows, 3.75x slower
    than 369 of 32). Not for every kernel: RMSNorm's held-out shapes of 228-2197 rows ran
    4-14% slower with it on the H100, so it does not use it."""
    while rows > 1 and -(-m // rows) < WAVES * sms:
        rows //= 2
    return rows


def grid(blocks: int, persistent: bool, per_sm: int, device) -> tuple[int]:
    """(blocks,), or for a persistent kernel no more blocks than per_sm on every SM."""
    if not persistent:
        return (blocks,)
    return (min(blocks, sm_count(device.index or 0) * per_sm),)


def spread_grid(blocks: int, x: int = 1) -> tuple[int, int, int]:
    """(x, y, z) with y * z >= blocks and y within the hardware's 65535: a grid whose blocks
    are counted on y and z. cuTile reads bid(1) and bid(2) with a multiply, but bid(0) with
    an exact division by the cluster's width, a chain of some 15 dependent instructions
    before a block's first load (SwiGLU on an H200: 0.1-0.16 us of a 4.8 us launch). The
    kernel takes its block index as bid(1) + bid(2) * num_blocks(1) and skips the fewer
    than z past `blocks`."""
    z = max(1, -(-blocks // 65535))
    return (x, -(-blocks // z), z)


class _Window(ctypes.Structure):   # CUaccessPolicyWindow
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t),
                ("hit_ratio", ctypes.c_float), ("hit_prop", ctypes.c_int),
                ("miss_prop", ctypes.c_int)]


class _StreamAttr(ctypes.Union):   # CUstreamAttrValue (CUlaunchAttributeValue: 64 bytes)
    _fields_ = [("window", _Window), ("pad", ctypes.c_char * 64)]


_ACCESS_POLICY_WINDOW = 1            # CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW
_NORMAL, _STREAMING = 0, 1           # CU_ACCESS_PROPERTY_*
_MAX_WINDOW = 109                    # CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE


@functools.cache
def _libcuda():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuStreamSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                         ctypes.POINTER(_StreamAttr)]
    lib.cuStreamGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                         ctypes.POINTER(_StreamAttr)]
    return lib


@functools.cache
def _max_window(index: int) -> int:
    lib, device, size = _libcuda(), ctypes.c_int(), ctypes.c_int()
    _checked(lib.cuDeviceGet(ctypes.byref(device), index), "cuDeviceGet")
    _checked(lib.cuDeviceGetAttribute(ctypes.byref(size), _MAX_WINDOW, device),
             "cuDeviceGetAttribute")
    return size.value


def _checked(code: int, call: str) -> None:
    if code != 0:
        raise RuntimeError(f"{call} failed with CUresult {code}")


class streaming_reads:
    """`with streaming_reads(x):` launches on `stream` (default: torch's current one on x's
    device) inside the block read `x`'s first bytes (up to the device's largest access policy
    window, 128 MB on an H100) as streaming: in L2 their lines are evicted first, before the
    lines other data holds. Triton's evict_first, which torch.compile gives a reduction's
    read-once loads; cuTile's loads take no such hint. It matters after a kernel that wrote
    much: the L2 is then full of dirty lines, and each one a load evicts is written back
    inside the launch (H100, a row norm of bf16 8192 x 4096 after do_bench's writing L2
    clear: 33.70 us, 29.18 inside this block, torch.compile 27.97). It costs host time on
    every launch (three driver calls), which counts wherever launches come back to back
    (docs/writing-a-kernel.md, "Inputs read once, and the L2"). The stream's window before is
    put back after. A tensor not on a GPU: nothing is set. A class, not a generator: the
    host time is the point."""

    __slots__ = ("_handle", "_window", "_before")

    def __init__(self, tensor, stream=None):
        self._handle = None
        if not getattr(tensor, "is_cuda", False) or tensor.numel() == 0:
            return
        import torch

        index = tensor.get_device()
        raw = (stream.cuda_stream if stream is not None
               else torch._C._cuda_getCurrentRawStream(index))
        self._handle = ctypes.c_void_p(raw)
        self._window = _StreamAttr()
        self._window.window = _Window(tensor.data_ptr(),
                                      min(tensor.numel() * tensor.element_size(),
                                          _max_window(index)),
                                      1.0, _STREAMING, _NORMAL)
        self._before = _StreamAttr()

    def __enter__(self):
        if self._handle is not None:
            lib = _libcuda()
            _checked(lib.cuStreamGetAttribute(self._handle, _ACCESS_POLICY_WINDOW,
                                              self._before), "cuStreamGetAttribute")
            _checked(lib.cuStreamSetAttribute(self._handle, _ACCESS_POLICY_WINDOW,
                                              self._window), "cuStreamSetAttribute")
        return self

    def __exit__(self, *exc):
        if self._handle is not None:
            _checked(_libcuda().cuStreamSetAttribute(self._handle, _ACCESS_POLICY_WINDOW,
                                                     self._before), "cuStreamSetAttribute")
        return False


class Draws:
    """make_inputs' random draws: tensors on `device` (float32, or `dtype` where given) from
    one generator seeded with `seed`, in the order they are asked for."""

    def __init__(self, seed: int, device):
        import torch

        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def normal(self, dims, dtype=None):
        """N(0, 1) values. Drawn in the inputs' own `dtype` (2 bytes a value for bfloat16), they
        skip the float32 draw and its cast (10): the timer draws fresh inputs into every slot of
        every batch."""
        import torch

        return torch.randn(dims, generator=self.generator, dtype=dtype or torch.float32,
                           device=self.device)

    def uniform(self, dims):
        """U[0, 1) values."""
        import torch

        return torch.rand(dims, generator=self.generator, device=self.device)


def array(dtype: str, ndim: int = 2):
    """What compile_ahead assumes of an argument: a `dtype` array of `ndim` dimensions, rows
    contiguous (last stride 1), 16-byte aligned, int32 indices, aliasing nothing."""
    import cuda.tile as ct
    from cuda.tile.compilation import ArrayConstraint

    return ArrayConstraint(getattr(ct, dtype), ndim, index_dtype=ct.int32,
                           stride_lower_bound_incl=0, alias_groups=(),
                           may_alias_internally=False,
                           stride_constant=(None,) * (ndim - 1) + (1,),
                           base_addr_divisible_by=16)


def export(kernel_object, function, arg_lists: list[list], arch: str) -> None:
    """Compile `kernel_object` (a ct.kernel of `function`) with tileiras for `arch`, once per
    list of arguments (array() constraints and the constants), in one cubin; no GPU needed."""
    from cuda.tile.compilation import CallingConvention, KernelSignature, export_kernel

    signatures = [KernelSignature(args, CallingConvention.cutile_python_v1())
                  .with_mangled_symbol(function.__name__) for args in arg_lists]
    export_kernel(kernel_object, signatures, io.BytesIO(), gpu_code=arch, output_format="cubin")
