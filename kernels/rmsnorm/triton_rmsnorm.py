"""A Triton RMSNorm, a competitor in `perfloop bench` (not part of the cuTile kernel): one row
per program, float32 inside; the whole row in registers up to 16384 columns, wider rows in two
passes over 4096-column chunks (the sum of squares, then the output)."""

import torch
import triton
import triton.language as tl

EPS = 1e-6
WHOLE_ROW_MAX = 16384


@triton.jit
def _rmsnorm_row(x, w, y, n, stride, eps, BLOCK: tl.constexpr, WHOLE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xr, yr = x + row * stride, y + row * stride
    if WHOLE:
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        v = tl.load(xr + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(v * v, axis=0) / n + eps)
        g = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(yr + cols, (v * r * g).to(y.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            v = tl.load(xr + cols, mask=cols < n, other=0.0).to(tl.float32)
            acc += v * v
        r = tl.rsqrt(tl.sum(acc, axis=0) / n + eps)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n
            v = tl.load(xr + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(w + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(yr + cols, (v * r * g).to(y.dtype.element_ty), mask=mask)


def triton_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    block = triton.next_power_of_2(n)
    whole = block <= WHOLE_ROW_MAX
    if not whole:
        block = 4096
    warps = 4 if block <= 1024 else 8 if block <= 4096 else 16
    if x2.shape[0]:
        _rmsnorm_row[(x2.shape[0],)](x2, w.contiguous(), y, n, x2.stride(0), EPS,
                                     BLOCK=block, WHOLE=whole, num_warps=warps)
    return y.view(x.shape)
