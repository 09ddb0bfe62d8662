"""Attention correctness, owned by the harness: the loop changes kernels/attention/, never this file.

In the style of FlashAttention's tests: the reference is the attention computed in float32
from the judge's own inputs, and the kernel's error against it may be at most twice PyTorch's
own error in the inputs' dtype (SDPA's math backend, on the same inputs), plus a small
absolute term: element by element (the largest error) and norm-wise. Outputs are poisoned with
NaN before the launch. The cases: bf16 and fp16, head dims 64, 128 and 256, causal and not,
grouped-query attention (4 and 3 query heads per KV head, and one KV head), sequences that are
no multiple of any tile, Sq != Sk both ways (causal aligned to the end, so that Sq > Sk leaves
rows that see no key: they must be 0), decode steps of 1-16 queries against up to 32k keys,
peaked scores, a mask probe, a given scale.

Run by hand (GPU tests), it judges the committed knobs on every case, and on QUICK cases the
knob combinations in which every value the playbook can give every knob occurs at least once
(what `perfloop check --sample 0` compiles), and a few combinations; run by the loop, exactly
the candidates the loop asks about, on every case. Without a GPU, the plain tests run the
kernel's tiles block by block on the CPU (tile_emulator.py, beside this file) against the same
rule, and check the launch plan, the reference, the traffic, the tolerance and the buckets.
"""

import json
import math
from pathlib import Path

import pytest

from perfloop.correctness import check, module_for, requested_variants

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]   # (this file: tests/judges/)
FOLDER = ROOT / "kernels" / "attention"
gpu = pytest.mark.gpu
by_hand = pytest.mark.skipif(requested_variants() is not None,
                             reason="judging loop candidates only")

# (name, dtype, (B, Hq, Hkv, Sq, Sk, D), causal, kind)
CASES = [
    ("tails-bf16-d128", "bfloat16", (2, 4, 4, 1000, 1000, 128), False, "plain"),
    ("tails-causal-bf16-d128", "bfloat16", (2, 4, 4, 1000, 1000, 128), True, "plain"),
    ("gqa4-causal-fp16-d64", "float16", (1, 8, 2, 2047, 2047, 64), True, "plain"),
    ("gqa3-fp16-d64", "float16", (1, 6, 2, 4095, 4095, 64), False, "plain"),
    ("mqa-tiny-causal-bf16-d256", "bfloat16", (1, 4, 1, 9, 9, 256), True, "plain"),
    ("masked-rows-bf16-d256", "bfloat16", (1, 4, 2, 4095, 1000, 256), True, "plain"),
    ("sq<sk-causal-fp16-d128", "float16", (2, 4, 4, 1000, 2047, 128), True, "plain"),
    ("sq<sk-bf16-d256", "bfloat16", (1, 2, 2, 1000, 4095, 256), False, "plain"),
    ("whole-tiles-causal-bf16-d128", "bfloat16", (1, 4, 4, 4096, 4096, 128), True, "plain"),
    ("one-key-bf16-d128", "bfloat16", (1, 1, 1, 1, 1, 128), False, "plain"),
    ("decode-32k-bf16-d128", "bfloat16", (4, 32, 8, 1, 32768, 128), False, "plain"),
    ("decode16-causal-fp16-d64", "float16", (2, 16, 2, 16, 4095, 64), True, "plain"),
    ("decode5-causal-bf16-d256", "bfloat16", (1, 8, 8, 5, 1000, 256), True, "plain"),
    ("probe-causal-bf16-d128", "bfloat16", (1, 2, 2, 1000, 1000, 128), True, "probe"),
    ("peaked-fp16-d128", "float16", (1, 4, 4, 512, 700, 128), False, "peaked"),
    ("scale-causal-bf16-d64", "bfloat16", (1, 4, 2, 300, 300, 64), True, "scale"),
]
QUICK = ("tails-causal-bf16-d128", "masked-rows-bf16-d256", "decode16-causal-fp16-d64")
SEEDS = (0, 1)
ABS = 1e-5          # the small absolute term: PyTorch errs by exactly 0 at a one-key row
COMBOS = {
    "tuned-like": {"tile": [64, 128], "occupancy": 2, "diagonal_split": True, "persistent": True},
    "warpgroups": {"tile": [128, 128], "worker_warps": 8, "occupancy": 1, "diagonal_split": True},
    "decode": {"tile": [16, 128], "group_heads": True, "split_kv": 2},
    "split-everywhere": {"tile": [64, 64], "split_kv": 4, "persistent": True,
                         "group_heads": True, "diagonal_split": True},
    "ieee-no-tma": {"fast_math": False, "load_allow_tma": False, "store_allow_tma": False,
                    "latency": [4, 8], "tile": [64, 128]},
    "clusters": {"tile": [128, 128], "num_ctas": 2, "occupancy": 1},
}


def _covering(folder: Path) -> list[dict]:
    """The committed knobs, the combinations in which every value the playbook (and
    kernel.toml's [candidates]) can give every knob occurs at least once, restrict() allowing
    (perfloop check's --sample 0), and COMBOS, each over the committed knobs."""
    from perfloop.contract import knobspace, playbook, variants
    from perfloop.contract.kernel import read_knobs
    from perfloop.contract.playbook import freeze, read_toml

    committed = read_knobs(folder / "knobs.json")
    declared = read_toml(folder / "kernel.toml", "kernel manifest").get("candidates", {})
    book = playbook.load(playbook.resolve_dir(None, folder.parent.parent))
    doms = variants.domains(book, committed, {k: [freeze(v) for v in vals]
                                              for k, vals in declared.items()})
    space = knobspace.space_for(folder)
    rows, _ = variants.pairwise(doms, lambda knobs: space.why_not(knobs) is None)
    out = [{"label": "committed", "knobs": committed}]
    for i, row in enumerate(variants.sample(rows, 0, 0)[1:]):
        out.append({"label": f"cover{i}", "knobs": {**committed, **row}})
    for label, change in COMBOS.items():
        out.append({"label": label,
                    "knobs": {**committed, **{k: freeze(v) for k, v in change.items()}}})
    return [{**v, "folder": str(folder)} for v in out]


def _judged() -> list[tuple]:
    """(variant, case, seed): the loop's candidates on every case and seed; by hand, the
    committed knobs so, the others on QUICK with one seed (each variant compiles once per
    dtype and head dim, a few seconds each)."""
    asked = requested_variants()
    if asked is not None:
        return [(v, c, s) for v in asked for c in CASES for s in SEEDS]
    return [(v, c, s) for v in _covering(FOLDER) for c in CASES for s in SEEDS
            if v["label"] == "committed" or (c[0] in QUICK and s == SEEDS[0])]


# ---- the judge's own inputs and reference --------------------------------------------------
def _inputs(case, seed: int, device="cuda"):
    """q, k, v ~ N(0, 1) (q times 2: rows attend to a few keys), the causal flag, and a scale
    where the case gives one. "probe": later keys score ever higher, so a causal row's weight
    piles up at its last visible key and any key it should not see would dominate. "peaked":
    q times 8, nearly one key a row (a wrong running max shows)."""
    name, dtype, (b, hq, hkv, sq, sk, d), causal, kind = case
    g = torch.Generator().manual_seed(5000 + seed)
    q = torch.randn(b, hq, sq, d, generator=g) * (8 if kind == "peaked" else 2)
    k = torch.randn(b, hkv, sk, d, generator=g)
    v = torch.randn(b, hkv, sk, d, generator=g)
    if kind == "probe":
        u = torch.randn(d, generator=g)
        u /= u.norm()
        q += 3 * d ** 0.5 * u
        k += torch.linspace(0, 2, sk)[:, None] * u
    cast = getattr(torch, dtype)
    inputs = (q.to(device, cast), k.to(device, cast), v.to(device, cast), causal)
    return inputs + ((0.3,) if kind == "scale" else ())


def reference(q, k, v, causal, scale=None):
    """The attention in float32 (TF32 off) from the inputs' values, causal aligned to the end
    (query i sees key j iff j <= i + Sk - Sq), rows that see no key 0; query rows in chunks."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    kf = k.float().unsqueeze(2)
    vf = v.float().unsqueeze(2)
    keys = torch.arange(sk, device=q.device)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        out = []
        step = max(1, (1 << 26) // (b * hq * sk))
        for start in range(0, sq, step):
            qc = q[:, :, start:start + step].float().reshape(b, hkv, hq // hkv, -1, d)
            s = qc @ kf.transpose(-1, -2) * scale
            if causal:
                rows = torch.arange(start, start + qc.shape[3], device=q.device)
                s = s.masked_fill(keys > rows[:, None] + (sk - sq), -math.inf)
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)   # a row of -inf: NaN, so 0
            out.append((p @ vf).reshape(b, hq, -1, d))
        return torch.cat(out, dim=2)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def pytorch(q, k, v, causal, scale=None):
    """PyTorch's own attention in the inputs' dtype: SDPA's math backend, causal aligned to
    the end by a boolean mask where Sq != Sk (SDPA's is_causal aligns to the start;
    causal_lower_right() would choose flash or efficient attention itself), rows that see no
    key 0."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sq, sk = q.shape[2], k.shape[2]
    mask, is_causal = None, causal and sq == sk
    if causal and sq != sk:
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                             scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.nan_to_num(0.0)


def tolerance_of(inputs, expected) -> dict:
    """Twice PyTorch's own error against `expected`, plus ABS: its largest element error as
    atol (rtol 0), its norm-wise error as max_rel_err."""
    diff = (pytorch(*inputs).double() - expected.double()).abs()
    norm = expected.double().norm().clamp_min(1e-30)
    return {"rtol": 0.0, "atol": 2 * float(diff.max()) + ABS,
            "max_rel_err": 2 * float(diff.norm() / norm) + ABS}


# ---- the GPU judge -------------------------------------------------------------------------
@gpu
@pytest.mark.parametrize("variant,case,seed", _judged() if torch.cuda.is_available() else [],
                         ids=lambda x: x["label"] if isinstance(x, dict)
                         else x[0] if isinstance(x, tuple) else f"seed{x}")
def test_matches_float32_reference_within_twice_pytorch(variant, case, seed):
    inputs = _inputs(case, seed)
    expected = reference(*inputs)

    def run():
        launch = module_for(variant["folder"]).build(variant["knobs"])
        out = torch.full_like(inputs[0], float("nan"))
        launch(inputs, out)
        return out

    check(variant["label"], f"{case[0]}-seed{seed}", run, expected,
          **tolerance_of(inputs, expected))


@gpu
@by_hand
def test_public_entry_point_takes_strided_inputs_and_refuses_bad_ones():
    module = module_for(str(FOLDER))
    case = ("strided", "bfloat16", (2, 8, 2, 300, 500, 128), True, "plain")
    q, k, v, _ = _inputs(case, 3)
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)       # (B, H, S, D), not contiguous
    out = module.attention(q_t, k, v, causal=True, scale=0.2)
    expected = reference(q_t, k, v, True, 0.2)
    tol = tolerance_of((q_t, k, v, True, 0.2), expected)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert float((out.double() - expected.double()).abs().max()) <= tol["atol"]
    with pytest.raises(ValueError):
        module.attention(q, k[:, :, :, :64], v)


@gpu
@by_hand
@pytest.mark.parametrize("case", [c for c in CASES if c[0] in QUICK + ("probe-causal-bf16-d128",)],
                         ids=lambda c: c[0])
def test_competitors_match_the_reference_within_twice_pytorch(case):
    """Every competitor bench times computes what the judge asks of the kernel (an SDPA
    backend that cannot take the case, e.g. flash with a lower-right mask, is skipped)."""
    inputs = _inputs(case, 0)
    expected = reference(*inputs)
    tol = tolerance_of(inputs, expected)
    for name, fn in module_for(str(FOLDER)).competitors().items():
        try:
            out = fn(*inputs)
        except RuntimeError as exc:
            if name.startswith("sdpa-") and "kernel" in str(exc).lower():
                continue
            raise
        diff = (out.double() - expected.double()).abs()
        assert float(diff.max()) <= tol["atol"], (name, float(diff.max()), tol)


# ---- without a GPU: the tiles on the CPU, the plan, the reference --------------------------
@pytest.fixture()
def emulated(monkeypatch):
    """kernel.py imported afresh with its blocks run on the CPU by tile_emulator."""
    from perfloop.contract import kernel_tools
    from perfloop.contract.kernel import import_module
    from tile_emulator import Emulator

    module = import_module(FOLDER, "attention_emulated")
    Emulator().install(module)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: None)
    monkeypatch.setattr(kernel_tools, "sm_count", lambda index: 8)
    return module


def _committed() -> dict:
    return {k: tuple(v) if isinstance(v, list) else v
            for k, v in json.loads((FOLDER / "knobs.json").read_text()).items()}


# Small tiles, so that these shapes cross many tile edges: lengths one past and one short of a
# tile, Sq > Sk (rows that see nothing), Sk - Sq two short of a tile (a causal block's first
# row then sees all of its first key tile but the last key), decode, GQA of 3 and 4, MQA.
EMULATED_SHAPES = [(1, 2, 2, 17, 17, False), (1, 3, 1, 32, 33, True), (2, 4, 2, 33, 16, True),
                   (1, 8, 2, 1, 47, False), (1, 6, 2, 5, 64, True), (1, 4, 4, 31, 31, True),
                   (1, 2, 2, 18, 32, True)]
EMULATED_KNOBS = {
    "plain": {"tile": (16, 16)},
    "diagonal-rows32": {"tile": (32, 16), "diagonal_split": True},
    "persistent": {"tile": (16, 16), "persistent": True, "occupancy": 1},
    "group-split": {"tile": (16, 16), "group_heads": True, "split_kv": 4},
    "all-ieee": {"tile": (32, 16), "group_heads": True, "split_kv": 2, "diagonal_split": True,
                 "persistent": True, "fast_math": False},
}


@by_hand
@pytest.mark.parametrize("label", sorted(EMULATED_KNOBS))
def test_the_kernels_tiles_on_the_cpu_match_within_twice_pytorch(emulated, label):
    knobs = {**_committed(), **EMULATED_KNOBS[label]}
    launch = emulated.build(knobs)
    for i, (b, hq, hkv, sq, sk, causal) in enumerate(EMULATED_SHAPES):
        dtype = "bfloat16" if i % 2 else "float16"
        inputs = _inputs((label, dtype, (b, hq, hkv, sq, sk, 32), causal, "probe" if i == 4
                          else "plain"), i, device="cpu")
        out = torch.full_like(inputs[0], float("nan"))
        launch(inputs, out)
        expected = reference(*inputs)
        tol = tolerance_of(inputs, expected)
        diff = (out.double() - expected.double()).abs()
        assert not torch.isnan(out).any(), (label, i)
        assert float(diff.max()) <= tol["atol"], (label, i, float(diff.max()), tol)
        assert float(diff.norm() / expected.double().norm()) <= tol["max_rel_err"], (label, i)


def test_the_emulated_launches_split_and_combine(emulated):
    """A decode step on 8 SMs with split_kv 2: 2 query tiles x 2 heads of 4 want 4 splits of
    the 64 keys' 4 tiles, then one combine block per output row."""
    emu = emulated.ct
    knobs = {**_committed(), "tile": (16, 16), "split_kv": 2}
    inputs = _inputs(("d", "bfloat16", (1, 2, 2, 20, 64, 32), False, "plain"), 0, device="cpu")
    emulated.build(knobs)(inputs, torch.empty_like(inputs[0]))
    assert emu.launched == [("attention_kernel", (2, 2, 4)), ("combine_kernel", (40, 1, 1))]


def test_the_launch_plan():
    from perfloop.contract.kernel import import_module

    kernel = import_module(FOLDER, "attention_plan")
    knobs = _committed()
    # the sample's 128-row tiles: 32 query tiles x 64 heads, no split
    plan = kernel.plan(knobs, (4, 16, 16, 4096, 4096, 128), 132)
    assert plan["grid"] == (32, 64, 1) and plan["splits"] == 1 and (plan["tg"], plan["ts"]) == (1, 128)
    # decode, 4 query heads a KV head in one 16-row tile: 16 x 8 blocks under 2 a SM on 132
    decode = {**knobs, "tile": (16, 128), "group_heads": True, "split_kv": 2}
    plan = kernel.plan(decode, (16, 32, 8, 1, 8192, 128), 132)
    assert (plan["tg"], plan["ts"], plan["tiles"]) == (4, 4, 1)
    assert plan["splits"] == 3 and plan["split_len"] == 22 * 128 and plan["grid"] == (1, 128, 3)
    # a group of 3 pads to 4 heads; a persistent grid holds SMs x occupancy blocks
    plan = kernel.plan({**knobs, "group_heads": True, "persistent": True, "tile": (64, 128)},
                       (2, 6, 2, 1000, 1000, 64), 132)
    assert (plan["tg"], plan["ts"], plan["tiles"]) == (4, 16, 63) and plan["grid"] == (252, 1, 1)
    # a full grid is not split, however much split_kv asks
    assert kernel.plan({**knobs, "split_kv": 4}, (4, 16, 16, 4096, 4096, 128), 132)["splits"] == 1


def test_the_reference_aligns_causal_to_the_end_as_sdpa_lower_right():
    from perfloop.contract.kernel import import_module

    kernel = import_module(FOLDER, "attention_reference")
    g = torch.Generator().manual_seed(1)
    for sq, sk, hq, hkv in ((7, 19, 4, 2), (19, 19, 3, 1), (1, 9, 2, 2)):
        q, k, v = (torch.randn(2, h, s, 16, generator=g, dtype=torch.float64)
                   for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))
        got = kernel.reference(q, k, v, True)
        assert torch.allclose(got, pytorch(q, k, v, True), atol=1e-12)
        assert torch.allclose(got, reference(q, k, v, True).double(), atol=1e-5)
        assert torch.allclose(kernel.reference(q, k, v, False, 0.3), pytorch(q, k, v, False, 0.3),
                              atol=1e-12)
    # Sq > Sk: the first Sq - Sk rows see no key and are 0, the rest as SDPA's
    q, k, v = (torch.randn(1, 2, s, 8, generator=g, dtype=torch.float64) for s in (9, 4, 4))
    got = kernel.reference(q, k, v, True)
    assert torch.equal(got[:, :, :5], torch.zeros_like(got[:, :, :5]))
    assert torch.allclose(got[:, :, 5:], pytorch(q, k, v, True)[:, :, 5:], atol=1e-12)


def test_the_sdpa_competitors_take_gqa_and_lower_right_causal_on_the_cpu():
    from perfloop.contract.kernel import import_module

    kernel = import_module(FOLDER, "attention_rivals")
    rivals = kernel.sdpa_backends()
    assert {"sdpa-math", "sdpa-flash", "sdpa-efficient"} <= set(rivals)
    inputs = _inputs(("c", "float32", (1, 4, 2, 7, 19, 16), True, "plain"), 0, device="cpu")
    assert torch.allclose(rivals["sdpa-math"](*inputs), reference(*inputs), atol=1e-5)
    one = _inputs(("c", "float32", (1, 4, 2, 1, 19, 16), True, "plain"), 0, device="cpu")
    assert torch.allclose(rivals["sdpa-flash"](*one), reference(*one), atol=1e-5)   # no mask


def test_pairs_traffic_and_tolerance():
    from types import SimpleNamespace

    from perfloop.contract.kernel import import_module

    kernel = import_module(FOLDER, "attention_traffic")
    assert kernel.pairs(4096, 4096, False) == 4096 ** 2
    assert kernel.pairs(4096, 4096, True) == 4096 * 4097 // 2          # the "halved"
    assert kernel.pairs(1, 8192, True) == 8192                           # decode sees all keys
    assert kernel.pairs(9, 4, True) == 1 + 2 + 3 + 4                     # 5 rows see none
    for sq, sk in ((7, 19), (19, 7), (5, 5), (1, 1)):
        mask = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + sk - sq
        assert kernel.pairs(sq, sk, True) == int(mask.sum())
    shape = SimpleNamespace(dims=(4, 16, 16, 4096, 4096, 128), dtype="bfloat16",
                            params={"causal": False})
    work = kernel.traffic(shape)
    assert work["flops"]["tensor.bfloat16"] == 4 * 4 * 16 * 4096 ** 2 * 128   # 4 B H S^2 D
    assert work["bytes"] == 4 * 4 * 16 * 4096 * 128 * 2
    decode = SimpleNamespace(dims=(16, 32, 8, 1, 8192, 128), dtype="bfloat16",
                             params={"causal": True})
    assert kernel.traffic(decode)["bytes"] == (2 * 16 * 32 * 128 + 2 * 16 * 8 * 8192 * 128) * 2
    for dtype in ("bfloat16", "float16"):
        tol = kernel.tolerance(shape, 0, dtype)
        assert tol == {k: 2 * v for k, v in kernel._PYTORCH[dtype].items()}
    assert kernel.tolerance(shape, 0, "float32") is None


def test_buckets_restrict_and_canonical():
    from perfloop.contract.kernel import import_module

    kernel = import_module(FOLDER, "attention_buckets")
    q = torch.empty(2, 8, 1000, 128, dtype=torch.bfloat16)
    k = torch.empty(2, 2, 3000, 128, dtype=torch.bfloat16)
    assert kernel.bucket((q, k, k, True)) == "bfloat16/causal/d<=128/sk<=4096"
    assert kernel.bucket((q, k, k, False)) == "bfloat16/full/d<=128/sk<=4096"
    assert kernel.bucket((q[:, :, :16], k, k, True)) == "bfloat16/decode/d<=128/sk<=4096"
    knobs = _committed()
    assert kernel.restrict(knobs) is None
    assert "spills" in kernel.restrict({**knobs, "tile": (256, 128), "num_ctas": 2})
    assert "128 rows" in kernel.restrict({**knobs, "tile": (64, 128), "num_ctas": 2})
    assert kernel.restrict({**knobs, "tile": (128, 128), "num_ctas": 2}) is None
    no_tma = {**knobs, "load_allow_tma": False}
    assert kernel.restrict(no_tma) is None                               # occupancy 2
    assert "TMA" in kernel.restrict({**no_tma, "occupancy": 3})
    assert "TMA" in kernel.restrict({**no_tma, "tile": (64, 64)})
    assert "TMA" in kernel.restrict({**no_tma, "worker_warps": 8})
    assert kernel.restrict({**no_tma, "tile": (64, 64), "occupancy": 1}) is None
    assert kernel.canonical({**knobs, "num_ctas": 1, "latency": 4}) == \
        {**knobs, "num_ctas": None, "latency": (4, 4)}


def test_the_public_entry_point_refuses_what_it_cannot_run():
    from perfloop.contract.kernel import import_module

    kernel = import_module(FOLDER, "attention_refusals")
    q = torch.empty(1, 4, 8, 128, dtype=torch.bfloat16)
    kv = torch.empty(1, 2, 8, 128, dtype=torch.bfloat16)
    kv3 = torch.empty(1, 3, 8, 128, dtype=torch.bfloat16)
    for bad in ((q[..., :96], kv[..., :96], kv[..., :96]),       # head dim 96
                (q, kv3, kv3),                                     # 4 query heads on 3
                (q.float(), kv.float(), kv.float()),
                (q[0], kv, kv)):
        with pytest.raises(ValueError):
            kernel.attention(*bad)
    with pytest.raises(ValueError):
        kernel.attention(q, kv, kv, scale=-1.0)
