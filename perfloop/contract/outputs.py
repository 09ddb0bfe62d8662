"""Checking a kernel's output against a reference, shared by the judge helpers and the timing
worker: poison an output, compare it with a float64 reference within a tolerance.

Outputs and inputs may be a tensor, a tuple or list of them, or (for CPU test kernels) a
list of numbers; every helper walks that structure the same way.
"""

from __future__ import annotations

import math

# rtol/atol per element, max_rel_err for the whole output (||out - ref|| / ||ref||). A kernel
# declares its own in kernel.toml [tolerance.<dtype>]; these are used for dtypes it omits.
DEFAULT_TOLERANCE = {
    "bfloat16": {"rtol": 1.6e-2, "atol": 1e-5, "max_rel_err": 8e-3},
    "float16": {"rtol": 2e-3, "atol": 1e-5, "max_rel_err": 1e-3},
    "float32": {"rtol": 1e-5, "atol": 1e-6, "max_rel_err": 1e-5},
    "float64": {"rtol": 1e-12, "atol": 1e-14, "max_rel_err": 1e-12},
}
EXACT = {"rtol": 0.0, "atol": 0.0, "max_rel_err": 0.0}


def _is_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "dtype") and hasattr(x, "fill_")


def _numbers(x) -> bool:
    """A list of numbers (judged by its first element: these lists are long)."""
    return isinstance(x, list) and (not x or isinstance(x[0], (int, float)))


def leaves(x) -> list:
    """The tensors (or number lists) of an input/output structure, in order."""
    if _is_tensor(x) or _numbers(x):
        return [x]
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in leaves(item)]
    return []


def dtype_name(x, fallback: str) -> str:
    return str(x.dtype).removeprefix("torch.") if _is_tensor(x) else fallback


POISONS = ("nan", "noise", "zeros")


def poison(out, rng=None) -> None:
    """Overwrite every element: NaN for floating outputs, the largest value for integers, so an
    element the kernel does not write cannot pass. With `rng` (the timer's), a floating output
    gets NaN, noise of a large spread or zeros, drawn each time: a kernel that does its work
    only when it finds NaN there (as every launch perfloop checked used to) is wrong where a
    user's output holds anything else, and a check sees it."""
    kind = rng.choice(POISONS) if rng is not None else "nan"
    for leaf in leaves(out):
        if _is_tensor(leaf):
            import torch

            if (leaf.is_floating_point() or leaf.is_complex()) and kind == "noise":
                g = torch.Generator(device=leaf.device).manual_seed(rng.randrange(1 << 62))
                leaf.normal_(0.0, 1000.0, generator=g)
            elif (leaf.is_floating_point() or leaf.is_complex()) and kind == "zeros":
                leaf.zero_()
            elif leaf.is_floating_point() or leaf.is_complex():
                leaf.fill_(float("nan"))
            elif leaf.dtype == torch.bool:
                leaf.fill_(True)
            else:
                leaf.fill_(torch.iinfo(leaf.dtype).max)
        else:
            leaf[:] = [math.nan] * len(leaf)


def refill(dst, src) -> None:
    """Copy src's values into dst's buffers in place (same structure), so a kernel that keys a
    cache on buffer addresses sees new data at the same addresses."""
    for d, s in zip(leaves(dst), leaves(src), strict=True):
        if _is_tensor(d):
            d.copy_(s)
        else:
            d[:] = s


def same_memory(a, b) -> bool:
    """Whether two leaves overlap in memory (tensors: their spans of one device's memory;
    number lists: one list)."""
    if _is_tensor(a) and _is_tensor(b):
        if a.device != b.device or not a.numel() or not b.numel():
            return False
        (a0, a1), (b0, b1) = _span(a), _span(b)
        return a0 < b1 and b0 < a1
    return a is b


def _span(t) -> tuple[int, int]:
    """The addresses from a tensor's first element to past its last (torch strides are >= 0);
    views that interleave count as overlapping."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def unchanged(now, before) -> bool:
    """Whether every leaf of `now` holds the values of `before` (NaN equal to NaN)."""
    for a, b in zip(leaves(now), leaves(before), strict=True):
        if _is_tensor(a):
            if not (a.shape == b.shape and (a.equal(b) or bool(
                    ((a == b) | (a != a) & (b != b)).all()))):
                return False
        elif a != b and not all(x == y or x != x and y != y for x, y in zip(a, b, strict=True)):
            return False
    return True


def clone(x):
    """A deep copy of an output structure (tensors cloned)."""
    if _is_tensor(x):
        return x.clone()
    if _numbers(x):
        return list(x)
    if isinstance(x, (tuple, list)):
        return type(x)(clone(v) for v in x)
    return x


def upcast(x):
    """Floating tensors as float64, so the reference is computed in double precision."""
    if _is_tensor(x):
        return x.double() if x.is_floating_point() else x
    if isinstance(x, tuple):
        return tuple(upcast(v) for v in x)
    if isinstance(x, list) and not _numbers(x):
        return [upcast(v) for v in x]
    return x


def tolerance_for(dtype: str, declared: dict) -> dict:
    if dtype in declared:
        return declared[dtype]
    if dtype in DEFAULT_TOLERANCE:
        return DEFAULT_TOLERANCE[dtype]
    return EXACT  # integers, bools: exact


def compare(out, ref, declared: dict, fallback_dtype: str, fixed: dict | None = None,
            each: list | None = None) -> dict:
    """Every output leaf against its reference leaf; passed only if all are within tolerance:
    `fixed` for every leaf, `each[i]` for leaf i, or the declared one for each leaf's dtype
    (`fallback_dtype` for number lists)."""
    outs, refs = leaves(out), leaves(ref)
    if len(outs) != len(refs):
        return {"passed": False, "error": f"{len(outs)} outputs but {len(refs)} references"}
    worst: dict = {"passed": True, "non_finite": 0, "outside_tolerance": 0, "rel_err": 0.0,
                   "max_abs_err": 0.0}
    for i, (o, r) in enumerate(zip(outs, refs)):
        tol = fixed or (each[i] if each else tolerance_for(dtype_name(o, fallback_dtype),
                                                           declared))
        one = _compare_leaf(o, r, tol)
        for key in ("non_finite", "outside_tolerance"):
            worst[key] += one[key]
        for key in ("rel_err", "max_abs_err"):
            worst[key] = max(worst[key], one[key]) if not math.isnan(one[key]) else math.nan
        if worst["passed"]:  # the tolerance reported is the first failing output's
            worst.update({k: one[k] for k in ("rtol", "atol", "max_rel_err")})
            if not one["passed"]:
                worst.update({"passed": False, **({"output": i} if len(outs) > 1 else {}),
                              **({"error": one["error"]} if "error" in one else {})})
    return worst


def _compare_numbers(out: list, ref: list, tol: dict) -> dict:
    """The same check for number lists (CPU test kernels), without importing torch."""
    if len(out) != len(ref):
        return {"passed": False, "non_finite": 0, "outside_tolerance": len(out),
                "rel_err": math.nan, "max_abs_err": math.nan, **tol,
                "error": f"{len(out)} elements but the reference has {len(ref)}"}
    bad = sum(1 for g, w in zip(out, ref) if not math.isfinite(g) and g != w)
    diffs = [abs(g - w) if math.isfinite(g) and math.isfinite(w) else (0.0 if g == w else math.inf)
             for g, w in zip(out, ref)]
    outside = sum(1 for d, w in zip(diffs, ref)
                  if not d <= tol["atol"] + tol["rtol"] * (abs(w) if math.isfinite(w) else 0.0))
    if bad:
        rel = max_abs = math.nan
    else:
        norm = math.sqrt(sum(w * w for w in ref if math.isfinite(w)))
        rel = math.sqrt(sum(d * d for d in diffs if math.isfinite(d))) / max(norm, 1e-30)
        max_abs = max(diffs, default=0.0)
    return {"passed": bad == 0 and rel <= tol["max_rel_err"] and outside == 0, "non_finite": bad,
            "outside_tolerance": outside, "rel_err": rel, "max_abs_err": max_abs, **tol}


def _compare_leaf(out, ref, tol: dict) -> dict:
    if _numbers(out) and _numbers(ref):
        return _compare_numbers(out, ref, tol)
    import torch

    got = torch.as_tensor(out).detach().double() if _is_tensor(out) else torch.tensor(out, dtype=torch.float64)
    want = (torch.as_tensor(ref).detach().double() if _is_tensor(ref)
            else torch.tensor(ref, dtype=torch.float64)).to(got.device)
    if got.shape != want.shape:
        return {"passed": False, "non_finite": 0, "outside_tolerance": got.numel(),
                "rel_err": math.nan, "max_abs_err": math.nan, **tol,
                "error": f"shape {tuple(got.shape)} but the reference has {tuple(want.shape)}"}
    finite = torch.isfinite(got) | ~torch.isfinite(want) & (got == want)
    bad = int((~finite).sum())
    diff = (got - want).abs().nan_to_num(0.0)
    both_inf = ~torch.isfinite(want) & (got == want)
    within = (diff <= tol["atol"] + tol["rtol"] * want.abs().nan_to_num(0.0)) | both_inf
    if bad:
        rel = max_abs = math.nan
    else:
        mask = torch.isfinite(want)
        rel = float(diff[mask].norm() / want[mask].norm().clamp_min(1e-30)) if mask.any() else 0.0
        max_abs = float(diff.max()) if diff.numel() else 0.0
    passed = bad == 0 and rel <= tol["max_rel_err"] and bool(within.all())
    return {"passed": passed, "non_finite": bad, "outside_tolerance": int((~within).sum()),
            "rel_err": rel, "max_abs_err": max_abs, **tol}
