"""Row-wise RMSNorm, y = x / sqrt(mean(x^2) + eps) * w, on CPU torch tensors.

A CPU-timed kernel (kernel.toml: requires_gpu = false). Its cost is made nearly
deterministic: each launch computes the result, then spins until a budget of wall time derived
from the knobs and the shape has passed since it began, the clock perfloop's timer reads on a
CPU.
"""
import time

import numpy as np
import torch

EPS = 1e-6
DEVICE = "cpu"

# Budget of one launch at the headline shape (256 x 1024), in milliseconds, before knob factors.
BASE_MS = 2.0
HEADLINE_ELEMS = 256 * 1024
SPIN_SCALE = 1.0

_TILE_FACTOR = {(1, 512): 1.10, (1, 1024): 1.00, (1, 2048): 0.85, (2, 1024): 0.95}
_OCC_FACTOR = {2: 1.00}


def _budget_ms(knobs, numel):
    f = 1.0
    if knobs.get("fast_math"):
        f *= 0.80
    if knobs.get("memory_path") == "gather_scatter":
        f *= 1.25
    f *= _TILE_FACTOR.get(tuple(knobs.get("tile", (1, 1024))), 1.05)
    f *= _OCC_FACTOR.get(knobs.get("occupancy", 2), 1.08)
    return max(0.2, BASE_MS * numel / HEADLINE_ELEMS) * f * SPIN_SCALE


def build(knobs):
    fast_math = bool(knobs.get("fast_math", False))
    tile = tuple(knobs.get("tile", (1, 1024)))
    cols_per_tile = int(tile[1])

    def launch(inputs, out):
        x, w = inputs
        deadline = time.perf_counter() + _budget_ms(knobs, x.numel()) / 1e3
        # The math runs on numpy views of the CPU tensors: single-threaded, so no thread-pool
        # barrier spins when the machine is busy.
        xa, wa, oa = x.numpy(), w.numpy(), out.numpy()
        n = xa.shape[-1]
        ss = np.zeros(xa.shape[:-1] + (1,), dtype=np.float32)
        for c0 in range(0, n, cols_per_tile):          # column tiles; the last may be a tail
            xc = xa[..., c0:c0 + cols_per_tile]
            ss += np.einsum("...i,...i->...", xc, xc)[..., None]
        ms = ss / np.float32(n) + np.float32(EPS)
        inv = np.float32(1.0) / np.sqrt(ms) if not fast_math else np.sqrt(np.float32(1.0) / ms)
        np.multiply(xa * inv, wa, out=oa)
        while time.perf_counter() < deadline:
            pass

    return launch


def _field(shape, key):
    # The README says a shape "has" name, dims, dtype and headline: attribute or key, accept both.
    return shape[key] if isinstance(shape, dict) else getattr(shape, key)


def make_inputs(shape, seed, device):
    dtype = getattr(torch, _field(shape, "dtype"))
    rows, cols = _field(shape, "dims")
    g = torch.Generator(device=device).manual_seed(int(seed))
    x = torch.randn((rows, cols), generator=g, dtype=dtype, device=device)
    w = 1.0 + 0.1 * torch.randn((cols,), generator=g, dtype=dtype, device=device)
    return (x, w)


def empty_output(inputs):
    return torch.empty_like(inputs[0])


def reference(x, w):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + EPS) * w


def traffic(shape):
    rows, cols = _field(shape, "dims")
    size = torch.empty((), dtype=getattr(torch, _field(shape, "dtype"))).element_size()
    nbytes = (2 * rows * cols + cols) * size            # read x and w, write y
    flops = 4 * rows * cols                             # square, add, scale, multiply by w
    return nbytes, flops

