"""The cuTile operations a kernel's block code uses, on torch CPU tensors, one block at a time:
enough to run kernels/attention/kernel.py's blocks on a machine without a GPU and check its
index arithmetic (tiles, tails, masks, splits, the persistent loop) against a reference.

It models what the cuTile docs say (ct.load: t[x, y] = array[i * tm + x, j * tn + y] of the
array with its axes permuted by `order`, padded past its ends; ct.store: elements past the
array's ends ignored), not the compiler: hints are ignored, approximate math is exact, and
a product accumulates in float32 from its inputs' own values, as tensor cores do.

    emu = Emulator()
    emu.install(module)          # module.ct and its launches run here
    ...                          # call module.build(knobs)(inputs, out) as usual
"""

from __future__ import annotations

import math

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "int32": torch.int32, "int64": torch.int64, "bool_": torch.bool}


class Emulator:
    """A stand-in for `cuda.tile` (the attributes kernels call), with a grid that
    `launch` walks block by block."""

    def __init__(self):
        self._bid = (0, 0, 0)
        self._grid = (1, 1, 1)
        self.launched: list[tuple] = []    # (kernel name, grid) of each launch
        for name, dtype in _DTYPES.items():
            setattr(self, name, dtype)

    # -- the grid ----------------------------------------------------------------------------
    def install(self, module) -> None:
        """Run `module`'s kernels here: its `ct` is this emulator, its kernel objects the
        plain functions."""
        self.real = module.ct
        module.ct = self
        if hasattr(module, "kernel_object"):
            function = module.attention_kernel
            module.kernel_object = lambda *hints: function
        if hasattr(module, "COMBINE"):
            module.COMBINE = module.combine_kernel

    def launch(self, stream, grid, kernel, args) -> None:
        grid = tuple(grid) + (1,) * (3 - len(grid))
        self.launched.append((kernel.__name__, grid))
        self._grid = grid
        for z in range(grid[2]):
            for y in range(grid[1]):
                for x in range(grid[0]):
                    self._bid = (x, y, z)
                    kernel(*args)

    def bid(self, axis: int) -> int:
        return self._bid[axis]

    def num_blocks(self, axis: int) -> int:
        return self._grid[axis]

    # -- scalars and tiles -------------------------------------------------------------------
    @staticmethod
    def cdiv(a, b):
        return -(-a // b)

    @staticmethod
    def full(shape, value, dtype=torch.float32):
        return torch.full(tuple(shape), value, dtype=dtype)

    @staticmethod
    def arange(n, dtype=torch.int32):
        return torch.arange(n, dtype=torch.int64)

    @staticmethod
    def where(cond, x, y):
        x = x if torch.is_tensor(x) else torch.tensor(x, dtype=torch.float32)
        y = y if torch.is_tensor(y) else torch.tensor(y, dtype=torch.float32)
        return torch.where(cond, x, y)

    @staticmethod
    def maximum(a, b):
        return torch.maximum(a, b)

    @staticmethod
    def max(t, axis=None, keepdims=False):
        return t.amax() if axis is None else t.amax(dim=axis, keepdim=keepdims)

    @staticmethod
    def sum(t, axis=None, keepdims=False):
        return t.sum() if axis is None else t.sum(dim=axis, keepdim=keepdims)

    @staticmethod
    def exp2(x, flush_to_zero=False):
        return torch.exp2(x)

    @staticmethod
    def exp(x, flush_to_zero=False):
        return torch.exp(x)

    @staticmethod
    def log2(x):
        return torch.log2(x)

    @staticmethod
    def log(x):
        return torch.log(x)

    @staticmethod
    def truediv(x, y, rounding_mode=None, flush_to_zero=False):
        return x / y

    @staticmethod
    def astype(t, dtype):
        return t.to(dtype)

    @staticmethod
    def mma(a, b, acc):
        """acc + a @ b in float32 from the operands' own values (tensor cores round nothing
        of bf16/fp16 products and add in float32)."""
        return acc + a.to(torch.float32) @ b.to(torch.float32)

    # -- memory ------------------------------------------------------------------------------
    @staticmethod
    def _view(array, index, shape, order):
        perm = tuple(range(array.dim())) if order == "C" else tuple(order)
        view = array.permute(perm)
        if len(index) != view.dim() or len(shape) != view.dim():
            raise ValueError(f"index {index} and shape {shape} for an array of {view.dim()} dims")
        starts = [int(i) * s for i, s in zip(index, shape)]
        if any(st >= n or st < 0 for st, n in zip(starts, view.shape)):
            raise IndexError(f"tile {index} of {shape} lies outside {tuple(view.shape)} "
                             "(undefined in cuTile)")
        region = tuple(slice(st, min(st + s, n)) for st, s, n in zip(starts, shape, view.shape))
        return view, region

    def load(self, array, index, shape, *, order="C", padding_mode=None, check_bounds=True,
             latency=None, allow_tma=None, **_):
        view, region = self._view(array, index, shape, order)
        name = getattr(padding_mode, "name", "UNDETERMINED")
        fill = {"ZERO": 0.0, "NEG_INF": -math.inf, "POS_INF": math.inf}.get(name, math.nan)
        out = torch.full(tuple(shape), fill, dtype=array.dtype)
        part = view[region]
        out[tuple(slice(0, n) for n in part.shape)] = part
        return out

    def store(self, array, index, tile, *, order="C", check_bounds=True, latency=None,
              allow_tma=None, **_):
        view, region = self._view(array, index, tuple(tile.shape), order)
        part = view[region]
        part.copy_(tile[tuple(slice(0, n) for n in part.shape)].to(array.dtype))
