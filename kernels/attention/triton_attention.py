"""A Triton fused attention forward, a competitor in `perfloop bench` (not part of the cuTile
kernel): FlashAttention 2's online softmax over key blocks, q (B, Hq, Sq, D) and k, v
(B, Hkv, Sk, D) with Hq a multiple of Hkv, causal aligned to the end (query i sees keys
j <= i + Sk - Sq), rows that see no key 0, masked tails. Each query block loops first over
the key blocks all its rows see whole, without a mask, then over the masked ones (the
diagonal, the last partial block). Autotuned once per (Sq, Sk, D, causal) over configs that
do well on sm_90; head dim 256 keeps to those whose tiles fit in shared memory."""

import torch
import triton
import triton.language as tl

CONFIGS = [triton.Config({"BM": bm, "BN": bn}, num_warps=w, num_stages=s)
           for bm, bn, w, s in [(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3),
                                (64, 64, 4, 3), (128, 64, 8, 2), (64, 64, 4, 2)]]
LOG2E = tl.constexpr(1.4426950408889634)   # a global a jitted function reads


def _fits(configs, named_args, **kwargs):
    """Head dim 256: blocks of at most 64 keys in at most 2 stages (K and V tiles of 128 keys
    x 256 in 3 stages need 384 KB of shared memory)."""
    # (Triton 3.x passes constexpr arguments in kwargs, not named_args)
    if {**named_args, **kwargs}["D"] < 256:
        return configs
    return [c for c in configs if c.kwargs["BN"] <= 64 and c.num_stages <= 2]


@triton.jit
def _step(q, acc, m, l, K, V, n, rows, cols, dims, SK, shift, scale, skn, svn,
          MASK: tl.constexpr, CAUSAL: tl.constexpr):
    keys = n + cols
    if MASK:
        k = tl.load(K + keys[None, :] * skn + dims[:, None], mask=keys[None, :] < SK, other=0.0)
    else:
        k = tl.load(K + keys[None, :] * skn + dims[:, None])
    s = tl.dot(q, k) * scale
    if MASK:
        ok = keys[None, :] < SK
        if CAUSAL:
            ok = ok & (keys[None, :] <= rows[:, None] + shift)
        s = tl.where(ok, s, float("-inf"))
    new = tl.maximum(m, tl.max(s, 1))
    sub = tl.where(new == float("-inf"), 0.0, new)    # a row that saw no key yet
    p = tl.math.exp2(s - sub[:, None])
    alpha = tl.math.exp2(m - sub)
    l = l * alpha + tl.sum(p, 1)
    if MASK:
        v = tl.load(V + keys[:, None] * svn + dims[None, :], mask=keys[:, None] < SK, other=0.0)
    else:
        v = tl.load(V + keys[:, None] * svn + dims[None, :])
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, new, l


@triton.autotune(configs=CONFIGS, key=["SQ", "SK", "D", "CAUSAL"],
                 prune_configs_by={"early_config_prune": _fits})
@triton.jit
def _attention(Q, K, V, O, scale, SQ, SK, HQ, GROUP,
               sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
               D: tl.constexpr, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    start = tl.program_id(0)
    b = tl.program_id(1) // HQ
    h = tl.program_id(1) % HQ
    kv = h // GROUP
    rows = start * BM + tl.arange(0, BM)
    cols = tl.arange(0, BN)
    dims = tl.arange(0, D)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dims[None, :],
                mask=rows[:, None] < SQ, other=0.0)
    K += b * skb + kv * skh
    V += b * svb + kv * svh
    scale = scale * LOG2E
    m = tl.full((BM,), float("-inf"), dtype=tl.float32)
    l = tl.zeros((BM,), dtype=tl.float32)
    acc = tl.zeros((BM, D), dtype=tl.float32)
    shift = SK - SQ
    if CAUSAL:
        # rows see keys up to row + shift: the first row's bound is every row's
        whole = tl.minimum(tl.maximum(start * BM + shift + 1, 0) // BN, SK // BN) * BN
        hi = tl.maximum(tl.minimum(SK, (start + 1) * BM + shift), 0)
    else:
        whole = SK // BN * BN
        hi = SK
    for n in range(0, whole, BN):
        acc, m, l = _step(q, acc, m, l, K, V, n, rows, cols, dims, SK, shift, scale, skn, svn,
                          False, CAUSAL)
    for n in range(whole, hi, BN):
        acc, m, l = _step(q, acc, m, l, K, V, n, rows, cols, dims, SK, shift, scale, skn, svn,
                          True, CAUSAL)
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    tl.store(O + b * sob + h * soh + rows[:, None] * son + dims[None, :],
             out.to(O.dtype.element_ty), mask=rows[:, None] < SQ)


def triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                     scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v, scale 1 / sqrt(D) by default, causal aligned to the end."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    out = torch.empty_like(q)
    scale = d ** -0.5 if scale is None else scale

    def grid(meta):
        return (triton.cdiv(sq, meta["BM"]), b * hq)

    _attention[grid](q, k, v, out, scale, sq, sk, hq, hq // hkv,
                     *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
                     D=d, CAUSAL=bool(causal))
    return out
