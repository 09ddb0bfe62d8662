"""cuTile fused attention forward (FMHA): out = softmax(q k^T * scale, masked) v, for bf16 and
fp16 q (B, Hq, Sq, D) and k, v (B, Hkv, Sk, D), Hq a multiple of Hkv (grouped-query
attention), D of 64, 128 or 256; the softmax and both products accumulate in float32. Causal
masking is aligned to the end, as FlashAttention 2.1+ and SDPA's causal_lower_right do: query
i sees keys j <= i + Sk - Sq. A query that sees no key (causal with Sq > Sk) gets zeros.

One block computes a tile of query rows against every key it sees, with an online softmax
(a running row max and sum, the accumulator rescaled when the max grows), as NVIDIA's cuTile
attention sample (samples/AttentionFMHA.py in NVIDIA/cutile-python) does; the plain knobs are
that sample's config. Every knob in knobs.json is a compile-time constant or a kernel hint:
  tile            [rows, keys]: query rows per block, keys per step of its loop
  occupancy       hint, blocks per SM (null: the compiler's choice)
  num_ctas        hint, CTAs per cluster (null: the compiler's choice)
  worker_warps    hint, warps per block that do the work (cuTile's num_worker_warps, 4 or 8;
                  null: the compiler's)
  latency         [k, v]: latency hints on the loads of K and of V (null: none; 0 in a pair:
                  none on that load)
  load_allow_tma  allow_tma on the loads of q, K and V (null: the compiler's choice)
  store_allow_tma allow_tma on the store of out (null: the compiler's choice)
  fast_math       exp2 with denormals flushed to zero, the scale folded with log2(e), and
                  approximate division (false: exp and IEEE division)
  diagonal_split  two loops: the key tiles every row of the block sees unmasked, then those on
                  the diagonal or past Sk with a mask (false: one loop that branches on each
                  step to mask where needed, as the sample does)
  persistent      a grid of SM count x occupancy blocks striding over the (query tile, head,
                  key split) work (occupancy null: PERSISTENT_OCCUPANCY)
  group_heads     a block's rows are the query heads that share a KV head (up to the rows,
                  the group's size rounded up to a power of two) times positions, so K and V are
                  loaded once for all of them (false: one head per block)
  split_kv        null, or the blocks per SM to aim for: where query tiles x heads make fewer,
                  as in decoding, the keys are split across blocks that write partial outputs
                  and their log-sum-exp, and a second launch combines them (flash-decoding)
Causal launches take the query tiles longest first, so the short ones fill the last wave.
"""

from __future__ import annotations

import math
from pathlib import Path

import cuda.tile as ct
import torch

from perfloop import dispatch
from perfloop import kernel_tools as kt

ZERO = ct.PaddingMode.ZERO
NEG_INF = ct.PaddingMode.NEG_INF
APPROX = ct.RoundingMode.APPROX
LOG2E = 1.0 / math.log(2.0)
DTYPES = kt.dtypes(("bfloat16", "float16"))
HEAD_DIMS = (64, 128, 256)
PERSISTENT_OCCUPANCY = 2   # blocks per SM of a persistent grid when occupancy is unset
DECODE_ROWS = 16           # Sq up to this is a decode step (its own bucket and workload family)
MAX_SPLITS = 32            # key splits per row: the combine holds them in one tile
SEES_ALL = 1 << 30         # the causal limit of a launch that is not causal
KNOBS = Path(__file__).resolve().parent / "knobs.json"


def _hint(value: int):
    """-1/0/1 constants for null/false/true hints."""
    return None if value < 0 else value == 1


def _exp(x, FAST: bool):
    if FAST:
        return ct.exp2(x, flush_to_zero=True)
    return ct.exp(x)


def _log(x, FAST: bool):
    if FAST:
        return ct.log2(x)
    return ct.log(x)


def _div(x, y, FAST: bool):
    if FAST:
        return ct.truediv(x, y, rounding_mode=APPROX, flush_to_zero=True)
    return x / y


def _scores(q, K, b, h, j, TM: int, TN: int, D: int, LK: int, LTMA: int):
    """q's rows against key tile j, as float32 (TM, TN)."""
    k = ct.load(K, (b, h, 0, j), (1, 1, D, TN), order=(0, 1, 3, 2), padding_mode=ZERO,
                latency=LK if LK > 0 else None, allow_tma=_hint(LTMA)).reshape((D, TN))
    return ct.mma(q, k, ct.full((TM, TN), 0.0, dtype=ct.float32))


def _masked(s, j, pos, lim, sk, TN: int):
    """Scores of keys past Sk, or past a row's causal limit (position + lim), set to -inf."""
    keys = j * TN + ct.arange(TN, dtype=ct.int32)[None, :]
    return ct.where((keys < sk) & (keys <= pos + lim), s, -math.inf)


def _update(s, m, l, acc, V, b, h, j, scale, TN: int, D: int, LV: int, LTMA: int,
            FAST: bool, SAFE: bool):
    """The online softmax step: the new row max, the rescaled sum and accumulator plus this
    tile's. SAFE: a row whose scores are all -inf so far subtracts 0, not -inf (NaN)."""
    new = ct.maximum(m, ct.max(s, axis=-1, keepdims=True) * scale)
    sub = new
    if SAFE:
        sub = ct.where(new == -math.inf, 0.0, new)
    p = _exp(s * scale - sub, FAST)
    alpha = _exp(m - sub, FAST)
    l = l * alpha + ct.sum(p, axis=-1, keepdims=True)
    v = ct.load(V, (b, h, j, 0), (1, 1, TN, D), padding_mode=ZERO,
                latency=LV if LV > 0 else None, allow_tma=_hint(LTMA)).reshape((TN, D))
    acc = ct.mma(ct.astype(p, V.dtype), v, acc * alpha)
    return new, l, acc


def _block(Q, K, V, Out, OP, LP, qk_scale, lim, causal, split_len, tile, bh, split,
           TG: int, TS: int, TN: int, D: int, FAST: bool, LK: int, LV: int, LTMA: int,
           STMA: int, DIAG: bool, PARTS: bool):
    """One tile of TG heads x TS query positions of one (batch, KV head) against the keys of
    one split. Q and Out are seen as (B, Hkv, G, Sq, D), so a tile of several heads of a group
    is one load."""
    TM = TG * TS
    sq, sk = Q.shape[3], K.shape[2]
    n_s = ct.cdiv(sq, TS)
    st = tile % n_s
    st = st + causal * (n_s - 1 - 2 * st)   # causal: the longest tiles first
    gt = tile // n_s
    b = bh // Q.shape[1]
    h = bh % Q.shape[1]
    scale = qk_scale * LOG2E if FAST else qk_scale
    q = ct.load(Q, (b, h, gt, st, 0), (1, 1, TG, TS, D), padding_mode=ZERO,
                allow_tma=_hint(LTMA)).reshape((TM, D))
    first = st * TS
    pos = (first + ct.arange(TM, dtype=ct.int32) % TS)[:, None]
    lo = split * split_len
    # the keys some row of the tile sees end at its last row's limit; those every row sees,
    # at its first row's
    hi = min(min(sk, lo + split_len), min(first + TS, sq) - 1 + lim + 1)
    unmasked = min(sk // TN, max(first + lim + 1, 0) // TN)
    lo_t = lo // TN
    hi_t = ct.cdiv(hi, TN)
    m = ct.full((TM, 1), -math.inf, dtype=ct.float32)
    l = ct.full((TM, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TM, D), 0.0, dtype=ct.float32)
    if DIAG:
        mid = min(max(unmasked, lo_t), hi_t)
        for j in range(lo_t, mid):
            s = _scores(q, K, b, h, j, TM, TN, D, LK, LTMA)
            m, l, acc = _update(s, m, l, acc, V, b, h, j, scale, TN, D, LV, LTMA, FAST, False)
        for j in range(mid, hi_t):
            s = _masked(_scores(q, K, b, h, j, TM, TN, D, LK, LTMA), j, pos, lim, sk, TN)
            m, l, acc = _update(s, m, l, acc, V, b, h, j, scale, TN, D, LV, LTMA, FAST, True)
    else:
        for j in range(lo_t, hi_t):
            s = _scores(q, K, b, h, j, TM, TN, D, LK, LTMA)
            if j >= unmasked:
                s = _masked(s, j, pos, lim, sk, TN)
            m, l, acc = _update(s, m, l, acc, V, b, h, j, scale, TN, D, LV, LTMA, FAST, True)
    seen = ct.where(l == 0.0, 1.0, l)    # a row that saw no key: 0 / 1
    o = _div(acc, seen, FAST)
    if PARTS:
        lse = ct.where(l == 0.0, -math.inf, m + _log(seen, FAST))
        ct.store(OP, (b, h, gt, st, split, 0), o.reshape((1, 1, TG, TS, 1, D)))
        ct.store(LP, (b, h, gt, st, split), lse.reshape((1, 1, TG, TS, 1)))
    else:
        ct.store(Out, (b, h, gt, st, 0), ct.astype(o, Out.dtype).reshape((1, 1, TG, TS, D)),
                 allow_tma=_hint(STMA))


def attention_kernel(Q, K, V, Out, OP, LP, qk_scale: float, lim: int, causal: int,
                     n_splits: int, split_len: int, TG: ct.Constant[int], TS: ct.Constant[int],
                     TN: ct.Constant[int], D: ct.Constant[int], FAST: ct.Constant[bool],
                     LK: ct.Constant[int], LV: ct.Constant[int], LTMA: ct.Constant[int],
                     STMA: ct.Constant[int], DIAG: ct.Constant[bool], PERSIST: ct.Constant[bool],
                     PARTS: ct.Constant[bool]):
    """Blocks over (query tile, batch x KV head, key split), or a grid-stride loop over them
    when PERSIST (head-major, so blocks running together share K and V in L2). PARTS: write
    each split's normalized output and log-sum-exp to OP and LP for combine_kernel."""
    tiles = ct.cdiv(Q.shape[3], TS) * ct.cdiv(Q.shape[2], TG)
    heads = Q.shape[0] * Q.shape[1]
    if PERSIST:
        for w in range(ct.bid(0), tiles * heads * n_splits, ct.num_blocks(0)):
            _block(Q, K, V, Out, OP, LP, qk_scale, lim, causal, split_len, w % tiles,
                   (w // tiles) % heads, w // (tiles * heads), TG, TS, TN, D, FAST, LK, LV,
                   LTMA, STMA, DIAG, PARTS)
    else:
        _block(Q, K, V, Out, OP, LP, qk_scale, lim, causal, split_len, ct.bid(0), ct.bid(1),
               ct.bid(2), TG, TS, TN, D, FAST, LK, LV, LTMA, STMA, DIAG, PARTS)


def combine_kernel(OP, LP, Out, SP: ct.Constant[int], D: ct.Constant[int],
                   FAST: ct.Constant[bool]):
    """One output row from its splits (SP: their count rounded up to a power of two): each
    split's output weighted by exp(its log-sum-exp - the largest), over the weights' sum; a
    row no split saw a key for gets zeros."""
    r = ct.bid(0)
    lse = ct.load(LP, (r, 0), (1, SP), padding_mode=NEG_INF)
    parts = ct.load(OP, (r, 0, 0), (1, SP, D), padding_mode=ZERO).reshape((SP, D))
    top = ct.max(lse, axis=1, keepdims=True)
    w = _exp(lse - ct.where(top == -math.inf, 0.0, top), FAST)
    total = ct.sum(w, axis=1, keepdims=True)
    o = ct.sum(parts * w.reshape((SP, 1)), axis=0, keepdims=True)
    o = _div(o, ct.where(total == 0.0, 1.0, total), FAST)
    ct.store(Out, (r, 0), ct.astype(o, Out.dtype))


kernel_object = kt.kernel_objects(attention_kernel)   # (occupancy, num_ctas, worker_warps)
COMBINE = ct.kernel(combine_kernel)


# ---- the launch plan: pure functions of the knobs and the shape ----------------------------
def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def rows(knobs: dict, group: int) -> tuple[int, int]:
    """(TG heads, TS positions) of a block's query rows: TG is 1 unless group_heads, then the
    group's size rounded up to a power of two, at most the tile's rows."""
    tm = knobs["tile"][0]
    tg = min(_pow2(group), tm) if knobs["group_heads"] else 1
    return tg, tm // tg


def splits(knobs: dict, blocks: int, sk: int, tn: int, sms: int) -> tuple[int, int]:
    """(key splits, keys per split, a multiple of tn): one split unless split_kv is set and
    `blocks` (query tiles x batch x KV heads) make fewer than split_kv per SM; then enough for
    that, each of whole key tiles, at most MAX_SPLITS."""
    tiles = -(-sk // tn)
    if not knobs["split_kv"] or blocks >= knobs["split_kv"] * sms:
        return 1, tiles * tn
    want = min(tiles, MAX_SPLITS, -(-knobs["split_kv"] * sms // blocks))
    per = -(-tiles // max(want, 1))
    return -(-tiles // per), per * tn


def plan(knobs: dict, dims: tuple, sms: int) -> dict:
    """What a launch at dims = (B, Hq, Hkv, Sq, Sk, D) runs: its tile's heads and positions,
    blocks, key splits and grid."""
    b, hq, hkv, sq, sk, d = dims
    tn = knobs["tile"][1]
    tg, ts = rows(knobs, hq // hkv)
    tiles = -(-sq // ts) * -(-(hq // hkv) // tg)
    n_splits, split_len = splits(knobs, tiles * b * hkv, sk, tn, sms)
    work = tiles * b * hkv * n_splits
    per_sm = knobs["occupancy"] or PERSISTENT_OCCUPANCY
    grid = (min(work, sms * per_sm), 1, 1) if knobs["persistent"] else (tiles, b * hkv, n_splits)
    return {"tg": tg, "ts": ts, "tn": tn, "tiles": tiles, "splits": n_splits,
            "split_len": split_len, "grid": grid}


def _latency(value) -> tuple[int, int]:
    """(k, v) latency hints, 0 for none: a pair, one value for both, or null."""
    if value is None:
        return 0, 0
    if isinstance(value, (tuple, list)):
        return tuple(v or 0 for v in value)
    return value, value


def _constants(knobs: dict, p: dict, d: int, parts: bool) -> tuple:
    tma = kt.TMA_CODE
    lk, lv = _latency(knobs["latency"])
    return (p["tg"], p["ts"], p["tn"], d, bool(knobs["fast_math"]), lk, lv,
            tma[knobs["load_allow_tma"]], tma[knobs["store_allow_tma"]],
            bool(knobs["diagonal_split"]), bool(knobs["persistent"]), parts)


def canonical(knobs: dict) -> dict:
    """The same knobs with what this kernel ignores set to one value (perfloop.contract.knobspace):
    one cluster of one CTA is no hint on sm_90, and one latency for K and V is that pair."""
    out = dict(knobs)
    if out.get("num_ctas") == 1:
        out["num_ctas"] = None
    lat = out.get("latency")
    if lat is not None:
        out["latency"] = None if _latency(lat) == (0, 0) else _latency(lat)
    return out


def restrict(knobs: dict) -> str | None:
    """Why these knobs cannot work together (perfloop.contract.knobspace), None where they can.
    From tileiras 13.4's sm_90 cubins (cuobjdump; bf16, D 128; kernel.toml's [candidates])."""
    rows_ = knobs["tile"][0]
    if rows_ >= 256:
        # 256x128: 390 spill stores on 8 worker warps, 241 on clusters of 2 (256 x 128 float32
        # accumulator and as many scores are 512 values a thread on 8 warps)
        return f"a tile of {rows_} query rows spills with every hint compiled"
    if knobs.get("num_ctas") == 2 and rows_ < 128:
        # each CTA of the pair takes half the rows, under the 64 of one warpgroup's product:
        # 64x128 compiled to 17656 instructions (2160 alone), 9.6 TFLOP/s in the issue
        return "num_ctas = 2 splits the tile's rows between two CTAs: it needs 128 rows"
    occupancy = knobs.get("occupancy")
    if knobs.get("load_allow_tma") is False and occupancy != 1 and (
            occupancy is None or occupancy >= 3 or knobs["tile"] == (64, 64)
            or knobs.get("worker_warps") == 8 or knobs.get("num_ctas") == 2):
        # tileiras 13.4 for sm_90 fails with return code 5 and no message: at occupancy 3 and
        # 4 at D 64 (64x128, 128x128) and 128 (64x64, 128x64); at 2, 64x64 at D 256, 8 warps
        # on 128x128 (D 64, 128) and 128x64 (D 128), clusters of 2 on 128x64 (D 256). At
        # occupancy 1 every tile, warp count and cluster compiled
        return ("loads without TMA compile only at occupancy 1, or 2 on 4 warps without a "
                "cluster and tiles other than 64x64")
    return None


# ---- the launch ----------------------------------------------------------------------------
def bucket(inputs) -> str:
    """The key of per-shape dispatch: dtype, decode or causal or full, the head dim, and the
    keys' power of two, e.g. "bfloat16/causal/d<=128/sk<=4096": the issue's H100 figures at
    head dim 256 were taken at occupancy 4 non-causal and 1 causal, and a decode step has a
    grid of a few hundred blocks that a key split fills."""
    q, k, causal = inputs[0], inputs[1], bool(inputs[3])
    mode = "decode" if q.shape[2] <= DECODE_ROWS else ("causal" if causal else "full")
    return (f"{str(q.dtype).removeprefix('torch.')}/{mode}/d<={q.shape[3]}"
            f"/sk<={_pow2(k.shape[2])}")


def build(knobs: dict):
    """launch((q, k, v, causal[, scale]), out) for these knob values; out is q's shape and
    dtype. Values in knobs.json's "dispatch" table hold only for their bucket (bucket())."""
    return dispatch.build(knobs, _build_one, bucket)


_DUMMIES: dict = {}


def _dummies(device):
    """Unused partial buffers for launches that do not split (PARTS false)."""
    if device not in _DUMMIES:
        _DUMMIES[device] = (torch.zeros((1,) * 6, dtype=torch.float32, device=device),
                            torch.zeros((1,) * 5, dtype=torch.float32, device=device))
    return _DUMMIES[device]


def _build_one(knobs: dict):
    kern = kernel_object(knobs["occupancy"], knobs["num_ctas"], knobs["worker_warps"])

    def launch(inputs, out):
        q, k, v, causal = inputs[:4]
        scale = inputs[4] if len(inputs) > 4 and inputs[4] is not None else q.shape[3] ** -0.5
        b, hq, sq, d = q.shape
        hkv, sk = k.shape[1], k.shape[2]
        g = hq // hkv
        p = plan(knobs, (b, hq, hkv, sq, sk, d), kt.sm_count(q.device.index or 0))
        q5, o5 = q.view(b, hkv, g, sq, d), out.view(b, hkv, g, sq, d)
        lim = sk - sq if causal else SEES_ALL
        stream = torch.cuda.current_stream()
        runtime = (float(scale), lim, int(bool(causal)), p["splits"], p["split_len"])
        if p["splits"] == 1:
            ct.launch(stream, p["grid"], kern,
                      (q5, k, v, o5, *_dummies(q.device), *runtime,
                       *_constants(knobs, p, d, False)))
            return out
        op = torch.empty((b, hkv, g, sq, p["splits"], d), dtype=torch.float32, device=q.device)
        lp = torch.empty((b, hkv, g, sq, p["splits"]), dtype=torch.float32, device=q.device)
        ct.launch(stream, p["grid"], kern,
                  (q5, k, v, o5, op, lp, *runtime, *_constants(knobs, p, d, True)))
        r = b * hq * sq
        ct.launch(stream, (r, 1, 1), COMBINE,
                  (op.view(r, p["splits"], d), lp.view(r, p["splits"]), out.view(r, d),
                   _pow2(p["splits"]), d, bool(knobs["fast_math"])))
        return out

    return launch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None, knobs: dict | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v with the committed knob values (or the given ones): q
    (B, Hq, Sq, D), k and v (B, Hkv, Sk, D), scale 1 / sqrt(D) by default, causal aligned to
    the end (query i sees keys j <= i + Sk - Sq)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k and v must be 4-D: (batch, heads, sequence, head dim)")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError("k and v must be (B, Hkv, Sk, D) with q's batch and head dim")
    if q.shape[1] % k.shape[1]:
        raise ValueError("q's heads must be a multiple of k's and v's")
    if q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"head dim must be one of {HEAD_DIMS}, not {q.shape[3]}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in DTYPES.values():
        raise ValueError("q, k and v must all be bfloat16 or all float16")
    if scale is not None and not scale > 0:
        raise ValueError("scale must be positive")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty_like(q)
    if out.numel():
        _launcher(knobs)((q, k, v, bool(causal), scale), out)
    return out


_launcher = kt.launchers(build, KNOBS)   # knobs (None: knobs.json's) -> launch, built once


# ---- the plug-in contract ------------------------------------------------------------------
# A shape's dims are [B, Hq, Hkv, Sq, Sk, D]; params.causal says whether it is causal.
def make_inputs(shape, seed: int, device):
    """q, k, v ~ N(0, 1), q times 2 so that rows attend to a few keys (scores ~ N(0, 4)) and a
    wrong mask or max shows; the causal flag from the shape's params."""
    b, hq, hkv, sq, sk, d = shape.dims
    draw, dtype = kt.Draws(seed, device), DTYPES[shape.dtype]
    q = draw.normal((b, hq, sq, d), dtype).mul_(2)
    return (q, draw.normal((b, hkv, sk, d), dtype), draw.normal((b, hkv, sk, d), dtype),
            bool(shape.params.get("causal", False)))


def empty_output(inputs):
    return torch.empty_like(inputs[0])


CHUNK_ELEMENTS = 1 << 27   # scores the reference holds at once (1 GiB in float64)


def reference(q, k, v, causal, scale=None):
    """The attention in PyTorch, query rows in chunks so that no (Sq, Sk) matrix of a large
    shape is held whole: the products in the inputs' dtype (float64 when perfloop checks), the
    softmax in float32 at least, causal aligned to the end; a row that sees no key is 0.
    `perfloop bench` times it eager and compiled."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    g = hq // hkv
    scale = d ** -0.5 if scale is None else scale
    soft = torch.float64 if q.dtype == torch.float64 else torch.float32
    kt_ = k.unsqueeze(2).transpose(-1, -2)              # (B, Hkv, 1, D, Sk)
    vv = v.unsqueeze(2)
    step = max(1, CHUNK_ELEMENTS // max(1, b * hq * sk))
    keys = torch.arange(sk, device=q.device)
    parts = []
    for start in range(0, sq, step):
        qc = q[:, :, start:start + step].reshape(b, hkv, g, -1, d)
        s = torch.matmul(qc, kt_).to(soft) * scale
        if causal:
            rows_ = torch.arange(start, start + qc.shape[3], device=q.device)
            s = s.masked_fill(keys[None, :] > rows_[:, None] + (sk - sq), -math.inf)
        top = s.amax(-1, keepdim=True)
        p = torch.exp(s - torch.where(torch.isfinite(top), top, torch.zeros_like(top)))
        total = p.sum(-1, keepdim=True)
        o = torch.matmul(p.to(q.dtype), vv).to(soft) / torch.where(total > 0, total, 1)
        parts.append(o.to(q.dtype).reshape(b, hq, -1, d))
    return torch.cat(parts, dim=2)


def pairs(sq: int, sk: int, causal: bool) -> int:
    """The (query, key) pairs a head computes: all of them, or causal, query i's i + Sk - Sq +
    1 keys (none where that is not positive): about half of them for Sq = Sk, the issue's
    "halved when causal"."""
    if not causal:
        return sq * sk
    low = max(1, sk - sq + 1)                # the counts run from sk - sq + 1 up to sk
    return (low + sk) * (sk - low + 1) // 2 if sk >= low else 0


def traffic(shape) -> dict:
    """Bytes that must move (q, k and v read once, out written once: what bounds a decode
    step) and, per (query, key) pair a head computes, 4 D tensor-core FLOPs (q k^T and p v, an
    FMA counting 2), one exp on the special-function units and 4 fp32 FLOPs (scale and
    subtract, max, sum)."""
    b, hq, hkv, sq, sk, d = shape.dims
    n = b * hq * pairs(sq, sk, bool(shape.params.get("causal", False)))
    size = DTYPES[shape.dtype].itemsize
    return {"bytes": (2 * b * hq * sq * d + 2 * b * hkv * sk * d) * size,
            "flops": {f"tensor.{shape.dtype}": 4 * d * n, "sfu": n, "fp32": 4 * n}}


# out's tolerance is twice PyTorch's own error in the dtype, the judge's rule
# (tests/judges/test_attention.py), as bounds that hold over make_inputs' draw: SDPA's math backend
# in bf16 / fp16 against the float64 reference on the CPU machine (torch 2.13; head dims 64,
# 128, 256; Sq x Sk of 9 x 9 to 2047 x 2047, 1 x 4096, 16 x 2048, 300 x 100; causal and not;
# GQA 2) erred by up to 1.73e-3 / 2.2e-4 norm-wise and 3.9e-3 / 4.9e-4 x max(1, |ref|) per
# element: the output's rounding, with scores and probabilities held in float32 there. The
# kernel's tiles, run block by block on the CPU (tests/judges/tile_emulator.py: float32
# products, probabilities rounded to the dtype), erred by up to 2.3e-3 / 2.8e-4 and 5.3e-3 /
# 5.7e-4 at such shapes.
_PYTORCH = {"bfloat16": {"rtol": 4e-3, "atol": 4e-3, "max_rel_err": 1.8e-3},
            "float16": {"rtol": 5e-4, "atol": 5e-4, "max_rel_err": 2.3e-4}}


def tolerance(shape, index: int, dtype: str) -> dict | None:
    """out's tolerance (perfloop.contract.hooks): twice PyTorch's own error bound for the dtype
    (_PYTORCH); None for other dtypes."""
    if dtype not in _PYTORCH:
        return None
    return {key: 2 * value for key, value in _PYTORCH[dtype].items()}


def competitors() -> dict:
    """Other implementations `perfloop bench` times beside PyTorch's, {name: fn(q, k, v,
    causal[, scale]) -> out}: SDPA with each backend this torch has (cuDNN, flash, efficient,
    math; causal with Sq != Sk through a mask aligned to the end), and a Triton kernel where
    Triton is installed."""
    from perfloop.kernel import triton_competitor

    return {**sdpa_backends(), **triton_competitor(Path(__file__).resolve().parent,
                                                   "triton_attention.py", "triton_attention")}


def sdpa_backends() -> dict:
    """{"sdpa-cudnn": fn, ...} for each SDPA backend torch.nn.attention names."""
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:
        return {}
    names = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION",
             "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
    return {f"sdpa-{short}": _sdpa(getattr(SDPBackend, full))
            for short, full in names.items() if hasattr(SDPBackend, full)}


def lower_right(sq: int, sk: int, causal: bool, device) -> tuple:
    """(attn_mask, is_causal) for SDPA: its is_causal aligns to the start, so Sq != Sk gets
    a boolean mask aligned to the end (causal_lower_right() would pick flash or efficient
    attention itself, whatever sdpa_kernel() allows); one query sees every key."""
    if not causal or sq == 1:
        return None, False
    if sq == sk:
        return None, True
    return torch.ones(sq, sk, dtype=torch.bool, device=device).tril(sk - sq), False


def _sdpa(backend):
    def run(q, k, v, causal, scale=None):
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel

        mask, is_causal = lower_right(q.shape[2], k.shape[2], bool(causal), q.device)
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                 scale=scale, enable_gqa=q.shape[1] != k.shape[1])
        blind = q.shape[2] - k.shape[2] if causal else 0
        if blind > 0:   # rows that see no key: cuDNN leaves them nonzero (an H200), math NaN
            out[:, :, :blind] = 0
        return out
    run.__name__ = f"sdpa_{backend.name.lower()}"
    return run


# ---- compiling ahead -----------------------------------------------------------------------
def _array(dtype: str, dims: tuple):
    """An argument as a launch at `dims` specializes it: rows contiguous, each dim's size and
    stride marked divisible by 16 (elements: stride 8 for 2-byte values) where it is."""
    from cuda.tile.compilation import ArrayConstraint

    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    per16 = 16 // (4 if dtype == "float32" else 2)
    return ArrayConstraint(getattr(ct, dtype), len(dims), index_dtype=ct.int32,
                           stride_lower_bound_incl=0, alias_groups=(),
                           may_alias_internally=False,
                           stride_constant=tuple(1 if s == 1 else None for s in strides),
                           stride_divisible_by=tuple(per16 if s % per16 == 0 else 1
                                                     for s in strides),
                           shape_divisible_by=tuple(16 if n % 16 == 0 else 1 for n in dims),
                           base_addr_divisible_by=16)


def launches(knobs: dict, shape, sms: int) -> list[tuple]:
    """(kernel name, argument list) of each launch at `shape`, for compile_ahead."""
    b, hq, hkv, sq, sk, d = shape.dims
    g = hq // hkv
    p = plan(knobs, shape.dims, sms)
    parts = p["splits"] > 1
    q5, kv = _array(shape.dtype, (b, hkv, g, sq, d)), _array(shape.dtype, (b, hkv, sk, d))
    if parts:
        op = _array("float32", (b, hkv, g, sq, p["splits"], d))
        lp = _array("float32", (b, hkv, g, sq, p["splits"]))
    else:
        op, lp = _array("float32", (1,) * 6), _array("float32", (1,) * 5)
    runtime = (0.125, sk - sq, 1, p["splits"], p["split_len"])
    out = [("attention", [q5, kv, kv, q5, op, lp, *runtime, *_constants(knobs, p, d, parts)])]
    if parts:
        r = b * hq * sq
        out.append(("combine", [_array("float32", (r, p["splits"], d)),
                                _array("float32", (r, p["splits"])), _array(shape.dtype, (r, d)),
                                _pow2(p["splits"]), d, bool(knobs["fast_math"])]))
    return out


def compile_ahead(knobs: dict, shapes, arch: str) -> None:
    """Compile this variant for every distinct launch of `shapes` with tileiras, no GPU
    needed."""
    sms = kt.SM_COUNT.get(arch, 132)
    lists: dict = {"attention": {}, "combine": {}}
    for shape in shapes:
        for name, args in launches(knobs, shape, sms):
            lists[name].setdefault(repr(args), args)
    kern = kernel_object(knobs["occupancy"], knobs["num_ctas"], knobs["worker_warps"])
    if lists["attention"]:
        kt.export(kern, attention_kernel, list(lists["attention"].values()), arch)
    if lists["combine"]:
        kt.export(COMBINE, combine_kernel, list(lists["combine"].values()), arch)
