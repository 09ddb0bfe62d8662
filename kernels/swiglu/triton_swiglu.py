"""A Triton SwiGLU, a competitor in `perfloop bench` (not part of the cuTile kernel): c =
silu(a) * b over the flat elements, float32 inside, BLOCK elements per program."""

import torch
import triton
import triton.language as tl


@triton.jit
def _swiglu_flat(a, b, c, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(a + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(b + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(c + offs, (x / (1.0 + tl.exp(-x)) * y).to(c.dtype.element_ty), mask=mask)


def triton_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty_like(a)
    n = a.numel()
    block = 4096 if a.element_size() < 4 else 2048
    if n:
        _swiglu_flat[(triton.cdiv(n, block),)](a, b, c, n, BLOCK=block, num_warps=8)
    return c
