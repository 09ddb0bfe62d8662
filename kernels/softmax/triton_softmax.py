"""A Triton row softmax, a competitor in `perfloop bench` (not part of the cuTile kernel): one
row per program, float32 inside; the whole row in registers up to 16384 columns, wider rows in
two passes over 4096-column chunks (an online max and sum, then the output). Rows masked with
-inf behave as in torch.softmax: a row that is -inf throughout gives NaN."""

import torch
import triton
import triton.language as tl

WHOLE_ROW_MAX = 16384


@triton.jit
def _softmax_row(x, y, n, stride, BLOCK: tl.constexpr, WHOLE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xr, yr = x + row * stride, y + row * stride
    if WHOLE:
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        v = tl.load(xr + cols, mask=mask, other=-float("inf")).to(tl.float32)
        e = tl.exp(v - tl.max(v, axis=0))
        tl.store(yr + cols, (e / tl.sum(e, axis=0)).to(y.dtype.element_ty), mask=mask)
    else:
        m = tl.full([BLOCK], -float("inf"), dtype=tl.float32)
        s = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            v = tl.load(xr + cols, mask=cols < n, other=-float("inf")).to(tl.float32)
            new = tl.maximum(m, v)
            # a lane that has seen only -inf so far adds nothing (exp(-inf - -inf) is NaN)
            live = new != -float("inf")
            s = tl.where(live, s * tl.exp(m - new) + tl.exp(v - new), 0.0)
            m = new
        top = tl.max(m, axis=0)
        total = tl.sum(tl.where(m != -float("inf"), s * tl.exp(m - top), 0.0), axis=0)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n
            v = tl.load(xr + cols, mask=mask, other=-float("inf")).to(tl.float32)
            tl.store(yr + cols, (tl.exp(v - top) / total).to(y.dtype.element_ty), mask=mask)


def triton_softmax(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    block = triton.next_power_of_2(n)
    whole = block <= WHOLE_ROW_MAX
    if not whole:
        block = 4096
    warps = 4 if block <= 1024 else 8 if block <= 4096 else 16
    if x2.shape[0]:
        _softmax_row[(x2.shape[0],)](x2, y, n, x2.stride(0), BLOCK=block, WHOLE=whole,
                                     num_warps=warps)
    return y.view(x.shape)
