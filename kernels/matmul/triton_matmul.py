"""A Triton matmul, a competitor in `perfloop bench` (not part of the cuTile kernel): grouped
block order, float32 accumulation, masked tails, autotuned once per (M, N, K) over configs that
do well on sm_90."""

import torch
import triton
import triton.language as tl

CONFIGS = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP": 8}, num_warps=w, num_stages=s)
           for bm, bn, bk, w, s in [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
                                    (128, 128, 64, 4, 4), (128, 128, 64, 8, 4),
                                    (64, 256, 64, 4, 4), (128, 64, 64, 4, 4),
                                    (64, 128, 64, 4, 4), (64, 64, 64, 4, 5)]]


@triton.autotune(configs=CONFIGS, key=["M", "N", "K"])
@triton.jit
def _matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP * tiles_n
    first = (pid // per_group) * GROUP
    rows = min(tiles_m - first, GROUP)
    pm = first + (pid % per_group) % rows
    pn = (pid % per_group) // rows
    om = pm * BM + tl.arange(0, BM)
    on = pn * BN + tl.arange(0, BN)
    ok = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        kk = k * BK + ok
        x = tl.load(a + om[:, None] * sam + kk[None, :] * sak,
                    mask=(om[:, None] < M) & (kk[None, :] < K), other=0.0)
        y = tl.load(b + kk[:, None] * sbk + on[None, :] * sbn,
                    mask=(kk[:, None] < K) & (on[None, :] < N), other=0.0)
        acc = tl.dot(x, y, acc)
    tl.store(c + om[:, None] * scm + on[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(om[:, None] < M) & (on[None, :] < N))


def triton_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)

    def grid(meta):
        return (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)

    _matmul[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                  c.stride(0), c.stride(1))
    return c
