"""The workload: the family of shapes a kernel serves (kernel.toml's [workload]), and the
buckets of shapes that decisions are taken in.

Two things follow from it, both pure functions of the workload:
  - held-out shapes, drawn from the family with a seed that the run records: timed in every
    decision, never tuned on;
  - a bucket per shape, when the kernel gives no bucket() hook: the dtype where the workload
    has several, and each varying dimension's power-of-two class ("bfloat16/hidden<=4096").
    The parent reads it from a Shape (shape_bucket), a launch from its inputs (inputs_bucket);
    the two agree, so the loop decides per bucket what every launch then runs.

A bucket that no benchmark shape falls in is routed to the nearest one that does (nearest):
same element size first, then the smallest distance in powers of two, then the same dtype.
docs/workload.md documents the syntax for kernel authors.
"""

from __future__ import annotations

import functools
import math
import random
import secrets
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfloop.contract.shape import Shape, pow2
from perfloop.core.values import freeze

DEFAULT_HELD_OUT = 3
MAX_HELD_OUT = 32
UNSEEN = ("nearest", "tune")
MAX_DECLARED = 4   # declared finalists: each costs a compile and a timing at a tuned bucket
TOP_KEYS = {"dims", "dtypes", "held_out", "seed", "buckets", "inputs", "unseen", "params",
            "peers", "family", "shapes", "weight", "name", "finalists"}
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


class WorkloadError(ValueError):
    """What is wrong with [workload], in one line (the manifest names the file)."""


@dataclass(frozen=True)
class Values:
    """What one dimension (or several drawn together, `names`) takes: a list of values
    (tuples when several), optionally weighted, or a range [low, high] drawn log-uniformly."""

    names: tuple[str, ...]
    values: tuple = ()
    weights: tuple = ()
    low: int = 0
    high: int = 0
    multiple_of: int = 1

    def draw(self, rng: random.Random) -> tuple[int, ...]:
        if self.values:
            return rng.choices(self.values, weights=self.weights or None)[0]
        x = int(math.exp(rng.uniform(math.log(self.low), math.log(self.high + 1))))
        step = self.multiple_of
        x = max(self.low, min(self.high, x))
        if step > 1:  # the nearest multiple inside the range (the range holds one: step <= high)
            x = min(max(step, round(x / step) * step), self.high // step * step)
        return (x,)

    def seen(self) -> list[tuple[int, ...]]:
        """The values it takes, a range by its ends."""
        return list(self.values) or [(self.low,), (self.high,)]


@dataclass(frozen=True)
class Family:
    """One part of the workload: values per dimension and dtypes, or a list of shapes."""

    name: str
    values: tuple[Values, ...] = ()
    dtypes: tuple[str, ...] = ()
    dtype_weights: tuple = ()
    shapes: tuple[Shape, ...] = ()
    shape_weights: tuple = ()
    weight: float = 1.0
    params: tuple = ()   # (name, value) pairs: the drawn shapes' params


@dataclass(frozen=True)
class Workload:
    names: tuple[str, ...]              # a shape's dims, in order
    families: tuple[Family, ...]
    bucket_keys: tuple[str, ...]        # "dtype" and the dims whose class keys a bucket
    held_out: int = DEFAULT_HELD_OUT
    seed: int | None = None
    inputs: tuple = ()                  # (dim, input index, axis): where a launch reads a dim
    unseen: str = "nearest"
    peers: tuple[str, ...] = ()
    declared: bool = False              # kernel.toml has [workload]; else the benchmark's shapes
    finalists: tuple = ()               # patches over the plain knobs that tuning also times
    benchmark: tuple[Shape, ...] = field(default=(), compare=False)

    def measured(self) -> list[str]:
        """The buckets of the benchmark shapes, in their order (each once)."""
        return list(dict.fromkeys(shape_bucket(self, s) for s in self.benchmark))


# ---- reading [workload] ---------------------------------------------------------------------
def parse(raw, benchmark: tuple[Shape, ...]) -> Workload:
    """The workload of kernel.toml's [workload] table (None: the benchmark shapes themselves,
    with buckets by what varies among them). WorkloadError names what is wrong."""
    if raw is None:
        return _default(benchmark)
    if not isinstance(raw, dict):
        raise WorkloadError("[workload] must be a table")
    names = _names(raw, benchmark)
    unknown = sorted(k for k in raw if k not in TOP_KEYS and not _dim_key(names, k))
    if unknown:
        raise WorkloadError(f"[workload] has no setting '{unknown[0]}' (a dimension's values "
                            f"go under its name in dims = [{', '.join(names)}])")
    held = _int(raw.get("held_out", DEFAULT_HELD_OUT), "held_out", 0, MAX_HELD_OUT)
    seed = raw.get("seed")
    if seed is not None:
        seed = _int(seed, "seed", 0, 2 ** 63)
    unseen = raw.get("unseen", "nearest")
    if unseen not in UNSEEN:
        raise WorkloadError(f"[workload] unseen must be one of {', '.join(UNSEEN)}, "
                            f"not {unseen!r}")
    wl = Workload(names, _families(raw, names), (), held, seed,
                  _inputs(raw.get("inputs"), names), unseen,
                  _strings(raw.get("peers", []), "peers"), True,
                  _finalists(raw.get("finalists"), unseen), tuple(benchmark))
    return replace(wl, bucket_keys=_bucket_keys(raw.get("buckets"), wl))


def _finalists(raw, unseen: str) -> tuple:
    """finalists = [{knob = value, ...}, ...]: configs (patches over the plain knobs) that a
    tuned launch times beside the measured buckets' knobs, as ((knob, value), ...) each."""
    if raw is None:
        return ()
    if unseen != "tune":
        raise WorkloadError('[workload] finalists are timed only where unseen = "tune"')
    if not isinstance(raw, list) or not raw or len(raw) > MAX_DECLARED or \
            not all(isinstance(p, dict) and p for p in raw):
        raise WorkloadError(f"[workload] finalists must be a list of 1 to {MAX_DECLARED} "
                            "non-empty tables of knob values")
    return tuple(tuple(sorted((k, freeze(v)) for k, v in p.items())) for p in raw)


def _dim_key(names: tuple, key: str) -> bool:
    """Whether `key` names dimensions ("hidden", or "N,K" for values drawn together)."""
    return all(k in names for k in key.split(","))


def _names(raw: dict, benchmark) -> tuple[str, ...]:
    names = raw.get("dims")
    if names is None:
        rank = min((len(s.dims) for s in benchmark), default=1)
        return tuple(f"d{i}" for i in range(rank))
    if not (isinstance(names, list) and names and all(
            isinstance(n, str) and n.isidentifier() and n != "dtype" for n in names)
            and len(set(names)) == len(names)):
        raise WorkloadError("[workload] dims must list distinct names of the shape's "
                            'dimensions, e.g. dims = ["rows", "hidden"]')
    return tuple(names)


def _int(value, what: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise WorkloadError(f"[workload] {what} must be an integer from {low} to {high}, "
                            f"not {value!r}")
    return value


def _strings(value, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise WorkloadError(f"[workload] {what} must be a list of names")
    return tuple(value)


def _families(raw: dict, names: tuple) -> tuple[Family, ...]:
    parts = raw.get("family", [])
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise WorkloadError("[[workload.family]] must be tables")
    own = "shapes" in raw or any(_dim_key(names, k) for k in raw)
    families = [_family(raw, names, "[workload]")] if own or not parts else []
    shared = {k: v for k, v in raw.items() if k in ("dtypes", "params")}
    for i, part in enumerate(parts):
        label = f"[[workload.family]] {part.get('name') or i + 1}"
        unknown = sorted(k for k in part if k not in ("name", "weight", "dtypes", "params",
                                                       "shapes") and not _dim_key(names, k))
        if unknown:
            raise WorkloadError(f"{label} has no setting '{unknown[0]}'")
        families.append(_family({**shared, **part}, names, label))
    return tuple(families)


def _family(raw: dict, names: tuple, label: str) -> Family:
    weight = raw.get("weight", 1.0)
    if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight <= 0:
        raise WorkloadError(f"{label}: weight must be a positive number")
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise WorkloadError(f"{label}: params must be a table, e.g. params = {{ eps = 1e-6 }}")
    specs = [(k, v) for k, v in raw.items() if _dim_key(names, k)]
    if "shapes" in raw:
        if specs:
            raise WorkloadError(f"{label}: give either values per dimension or a list of "
                                "shapes, not both")
        shapes, weights = _listed(raw["shapes"], names, label)
        return Family(label, shapes=shapes, shape_weights=weights, weight=float(weight))
    given = [n for k, _ in specs for n in k.split(",")]
    missing = [n for n in names if n not in given]
    twice = sorted({n for n in given if given.count(n) > 1})
    if missing or twice:
        raise WorkloadError(f"{label}: give each dimension its values once "
                            f"({'no values for ' + missing[0] if missing else twice[0] + ' twice'})")
    dtypes, dweights = _choices(raw.get("dtypes"), f"{label} dtypes", str)
    values = tuple(_values(tuple(k.split(",")), v, f"{label} {k}") for k, v in specs)
    return Family(label, values, tuple(dtypes), dweights, weight=float(weight),
                  params=tuple(sorted(params.items())))


def _choices(spec, what: str, kind) -> tuple[tuple, tuple]:
    """A list, or {values = [...], weights = [...]}: (values, weights or ())."""
    weights = ()
    if isinstance(spec, dict):
        if set(spec) - {"values", "weights"}:
            raise WorkloadError(f"{what}: a table holds values and weights only")
        weights = spec.get("weights", ())
        spec = spec.get("values")
    if not isinstance(spec, list) or not spec or not all(isinstance(v, kind) for v in spec):
        raise WorkloadError(f"{what} must be a non-empty list"
                            + (" of dtype names" if kind is str else ""))
    if weights and (not isinstance(weights, list) or len(weights) != len(spec) or not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in weights)
            or not sum(weights)):
        raise WorkloadError(f"{what}: weights must be one number >= 0 per value")
    return tuple(spec), tuple(weights)


def _values(names: tuple, spec, what: str) -> Values:
    if isinstance(spec, dict) and ("min" in spec or "max" in spec):
        if len(names) > 1 or set(spec) - {"min", "max", "multiple_of"}:
            raise WorkloadError(f"{what}: a range is {{ min = ..., max = ... }} "
                                "(optionally multiple_of), for one dimension")
        low, high = spec.get("min"), spec.get("max")
        step = spec.get("multiple_of", 1)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                   for x in (low, high, step)) or low > high or step > high:
            raise WorkloadError(f"{what}: min, max (and multiple_of) must be "
                                "positive integers, min <= max")
        return Values(names, low=low, high=high, multiple_of=step)
    kind = list if len(names) > 1 else int
    values, weights = _choices(spec, what, kind)
    rows = [tuple(v) if isinstance(v, list) else (v,) for v in values]
    if not all(len(r) == len(names) and all(isinstance(x, int) and not isinstance(x, bool)
                                            and x > 0 for x in r) for r in rows):
        raise WorkloadError(f"{what}: values must be positive integers"
                            + (f", {len(names)} per entry" if len(names) > 1 else ""))
    return Values(names, tuple(rows), weights)


def _listed(raw, names: tuple, label: str) -> tuple[tuple[Shape, ...], tuple]:
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) for s in raw):
        raise WorkloadError(f"{label}: shapes must be [[workload.shapes]] tables "
                            "with dims and dtype")
    shapes, weights = [], []
    for i, s in enumerate(raw):
        dims, dtype, weight = s.get("dims"), s.get("dtype"), s.get("weight", 1)
        if not (isinstance(dims, list) and dims and all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)
                and isinstance(dtype, str) and isinstance(weight, (int, float)) and weight > 0):
            raise WorkloadError(f"{label}: shape {i + 1} needs dims (positive "
                                "integers), dtype and optionally a positive weight")
        if len(dims) < len(names):
            raise WorkloadError(f"{label}: shape {i + 1} has fewer dims than "
                                f"dims names ({len(names)})")
        shapes.append(Shape(s.get("name") or _name(tuple(dims), dtype), tuple(dims), dtype,
                            held_back=True, param_items=tuple(sorted((s.get("params") or {})
                                                                     .items()))))
        weights.append(float(weight))
    return tuple(shapes), tuple(weights)


def _inputs(raw, names: tuple) -> tuple:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not all(
            k in names and isinstance(v, list) and len(v) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
            for k, v in raw.items()):
        raise WorkloadError("[workload] inputs maps each dimension to [input, axis], where a "
                            "launch reads it: e.g. inputs = { M = [0, 0], K = [0, 1] }")
    return tuple((k, v[0], v[1]) for k, v in raw.items())


def _bucket_keys(raw, wl: Workload) -> tuple[str, ...]:
    if raw is None:
        keys = (("dtype",) if len(_dtypes(wl)) > 1 else ()) + tuple(
            n for n in wl.names if len(_seen(wl, n)) > 1)
    else:
        keys = _strings(raw, "buckets")
        bad = [k for k in keys if k != "dtype" and k not in wl.names]
        if bad:
            raise WorkloadError(f"[workload] buckets names '{bad[0]}', which is neither "
                                f"\"dtype\" nor one of dims ({', '.join(wl.names)})")
    absent = [k for k in keys if k != "dtype" and wl.inputs
              and k not in {d for d, _, _ in wl.inputs}]
    if absent:
        raise WorkloadError(f"[workload] inputs does not say where a launch reads '{absent[0]}', "
                            "which keys the buckets (name it in inputs, or set buckets)")
    return keys


def _default(benchmark: tuple[Shape, ...]) -> Workload:
    rank = min((len(s.dims) for s in benchmark), default=1)
    names = tuple(f"d{i}" for i in range(rank))
    family = Family("benchmark", shapes=tuple(benchmark),
                    shape_weights=tuple(1.0 for _ in benchmark))
    wl = Workload(names, (family,), (), 0, benchmark=tuple(benchmark))
    return replace(wl, bucket_keys=_bucket_keys(None, wl))


def _dtypes(wl: Workload) -> set[str]:
    return {d for f in wl.families for d in f.dtypes} | {
        s.dtype for f in wl.families for s in f.shapes}


def _seen(wl: Workload, name: str) -> set[int]:
    """Every value the workload gives dimension `name` (a range by its two ends)."""
    i = wl.names.index(name)
    out = {_fold(s.dims, len(wl.names))[i] for f in wl.families for s in f.shapes}
    for f in wl.families:
        for v in f.values:
            if name in v.names:
                out |= {row[v.names.index(name)] for row in v.seen()}
    return out


# ---- buckets ------------------------------------------------------------------------------
def _fold(dims, rank: int) -> tuple[int, ...]:
    """`dims` as `rank` dimensions: extra leading ones multiplied into the first (a batch of
    rows is rows), missing leading ones as 1."""
    dims = tuple(dims)
    if len(dims) > rank:
        return (math.prod(dims[:len(dims) - rank + 1]), *dims[len(dims) - rank + 1:])
    return (1,) * (rank - len(dims)) + dims


def key(wl: Workload, dtype: str | None, dims: dict[str, int]) -> str:
    """The bucket of a dtype and named dims: e.g. "bfloat16/hidden<=4096"."""
    parts = [(dtype or "?") if k == "dtype" else f"{k}<={pow2(dims[k])}"
             for k in wl.bucket_keys]
    return "/".join(parts) or "all"


def shape_bucket(wl: Workload, shape: Shape) -> str:
    """The bucket of a benchmark, held-out or workload shape (the parent's side)."""
    return key(wl, shape.dtype, dict(zip(wl.names, _fold(shape.dims, len(wl.names)))))


def _size(x) -> tuple[int, ...] | None:
    if hasattr(x, "shape"):
        return tuple(x.shape)
    if isinstance(x, (list, tuple)) and not isinstance(x, str):
        return (len(x),)
    return None


def inputs_bucket(wl: Workload, inputs) -> str:
    """The bucket of a launch's inputs (the launch's side): the first tensor's dtype, and each
    dim read where `inputs` says, else from the first input that has a shape (a list: its
    length), folded as a shape's dims are."""
    dtype = next((str(x.dtype).removeprefix("torch.") for x in inputs if hasattr(x, "dtype")),
                 None)
    if wl.inputs:
        dims = {name: int(inputs[i].shape[axis]) for name, i, axis in wl.inputs}
    else:
        size = next((s for s in map(_size, inputs) if s is not None), ())
        dims = dict(zip(wl.names, _fold(size, len(wl.names))))
    return key(wl, dtype, dims)


def parse_key(bucket: str) -> tuple[str | None, dict[str, int], tuple[str, ...]]:
    """(the dtype part, {dim: class}, the other labels) of a bucket: "name<=value" parts are
    dims, the first other part the dtype, any after it labels (a kernel's own "small-m")."""
    dtype, dims, labels = None, {}, []
    for part in bucket.split("/"):
        name, sep, value = part.partition("<=")
        if sep and value.isdigit():
            dims[name] = int(value)
        elif part != "all" and dtype is None:
            dtype = part
        elif part != "all":
            labels.append(part)
    return dtype, dims, tuple(labels)


ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int8": 1,
                 "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "float8_e4m3fn": 1,
                 "float8_e5m2": 1}


def distance(a: str, b: str) -> tuple[int, int, float, int]:
    """How far bucket b is from a: another element size first (another dtype where either is
    unknown), then other labels, then powers of two apart, then another dtype of the same size.
    bf16 and fp16 move the same bytes and run the same tensor-core rate, so the config for the
    same width in the other one fits better than that of another width in the same one (H100
    softmax: fp16 rows of 512 ran as the fp16 bucket of 32768-wide rows, 32 rows per block)."""
    (da, xa, la), (db, xb, lb) = parse_key(a), parse_key(b)
    size = sum(abs(math.log2(xa[n]) - math.log2(xb[n])) if n in xb else 64.0 for n in xa)
    wa, wb = ELEMENT_BYTES.get(da or ""), ELEMENT_BYTES.get(db or "")
    other_width = wa != wb if wa and wb else da != db
    return (int(other_width), len(set(la) ^ set(lb)),
            size + 64.0 * len(set(xb) - set(xa)), int(da != db))


def nearest(bucket: str, measured) -> str | None:
    """The measured bucket a launch in `bucket` runs as: itself if measured, else the nearest
    (by element size, then labels, then size, then dtype: distance; ties to the first by
    name); None when nothing was measured."""
    measured = list(measured)
    if bucket in measured or not measured:
        return bucket if bucket in measured else None
    return min(sorted(measured), key=lambda m: distance(bucket, m))


# ---- held-out shapes ------------------------------------------------------------------------
def _name(dims: tuple, dtype: str) -> str:
    return f"held:{SHORT.get(dtype, dtype)}:{'x'.join(map(str, dims))}"


def choose_seed(wl: Workload) -> int:
    """The seed a new run draws its held-out shapes with: kernel.toml's, else a random one."""
    return wl.seed if wl.seed is not None else secrets.randbelow(2 ** 31)


def draw(wl: Workload, seed: int, taken: tuple[Shape, ...] = ()) -> tuple[Shape, ...]:
    """wl.held_out shapes drawn from the families (by weight) with `seed`, none equal to a
    shape in `taken` (dims and dtype) or to another; fewer when the family holds fewer."""
    rng = random.Random(seed)
    seen = {(tuple(s.dims), s.dtype) for s in taken}
    names = {s.name for s in taken}
    out: list[Shape] = []
    for _ in range(40 * wl.held_out):
        if len(out) == wl.held_out:
            break
        family = rng.choices(wl.families, weights=[f.weight for f in wl.families])[0]
        shape = _one(family, wl.names, rng)
        if (shape.dims, shape.dtype) in seen or shape.name in names:
            continue
        seen.add((shape.dims, shape.dtype))
        names.add(shape.name)
        out.append(shape)
    return tuple(out)


def _one(family: Family, names: tuple, rng: random.Random) -> Shape:
    if family.shapes:
        listed = rng.choices(family.shapes, weights=family.shape_weights or None)[0]
        return replace(listed, name=_name(listed.dims, listed.dtype), headline=False,
                       held_back=True)
    dims: dict[str, int] = {}
    for v in family.values:
        dims.update(zip(v.names, v.draw(rng)))
    dtype = rng.choices(family.dtypes, weights=family.dtype_weights or None)[0]
    shape = tuple(dims[n] for n in names)
    return Shape(_name(shape, dtype), shape, dtype, held_back=True,
                 param_items=family.params)


def held_out(spec, seed: int | None) -> tuple[Shape, ...]:
    """The shapes a run times beside its benchmark and never tunes on: kernel.toml's
    [[held_back]] shapes (without them, those derived from the benchmark's, one per bucket
    that no drawn shape falls in), and those drawn from a declared workload with the run's
    `seed` (None: kernel.toml's, else 0)."""
    wl = spec.workload
    if wl is None or not wl.declared:
        return tuple(spec.held_back)
    seed = seed if seed is not None else (wl.seed or 0)
    drawn = draw(wl, seed, tuple(spec.shapes) + tuple(spec.held_back))
    return _needed(spec, wl, drawn) + drawn


def _needed(spec, wl: Workload, drawn: tuple[Shape, ...]) -> tuple[Shape, ...]:
    """The held-back shapes a run times: a derived one checks its benchmark shape's bucket,
    so where a drawn shape already falls in that bucket it adds a timing (about 2 s a shape
    an experiment on the H100) and no check. [[held_back]] shapes are the user's: all kept."""
    if not spec.held_back_derived:
        return tuple(spec.held_back)
    checked = {shape_bucket(wl, s) for s in drawn}
    return tuple(h for h in spec.held_back if shape_bucket(wl, h) not in checked)


def timer_shapes(spec, shapes=None) -> list[dict]:
    """Shape dicts for a timer (default: the kernel spec's benchmark shapes), each with the
    workload's bucket whose knobs it runs: the buckets decisions are taken in where kernel.py
    has no bucket() hook."""
    shapes = spec.shapes if shapes is None else shapes
    if spec.workload is None:
        return [s.as_dict() for s in shapes]
    return with_buckets(shapes, spec.workload)


def with_buckets(shapes, wl: Workload) -> list[dict]:
    """Shape dicts for the timer, each with the bucket whose knobs it runs: its own, or, for a
    shape in a bucket no benchmark shape fell in (a held-out one), the nearest measured bucket,
    as a launch routes it (perfloop.contract.dispatch), with its own as "routed_from". Decisions
    about a bucket so count the held-out shapes that run as it. With unseen = "tune" such a
    launch runs whichever finalist (a measured bucket's knobs, or one kernel.toml declares)
    was fastest there: "tuned" says so, and the bucket it counts in is only the nearest."""
    measured, out = wl.measured(), []
    for s in shapes:
        own = shape_bucket(wl, s)
        runs = nearest(own, measured) or own   # (None: nothing measured)
        routed = {"routed_from": own, **({"tuned": True} if wl.unseen == "tune" else {})}
        out.append({**s.as_dict(), "bucket": runs, **(routed if runs != own else {})})
    return out


# ---- beside a kernel (a launch's side) ------------------------------------------------------
def load(folder: Path) -> Workload | None:
    """The workload of the kernel.toml in `folder` (None where there is none), for a launch:
    read once per version of the file."""
    path = Path(folder) / "kernel.toml"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    return _from_text(text)


@functools.lru_cache(maxsize=64)
def _from_text(text: str) -> Workload:
    manifest = tomllib.loads(text)
    shapes = tuple(Shape(str(s.get("name")), tuple(s["dims"]), s["dtype"],
                         bool(s.get("headline"))) for s in manifest.get("shapes", []))
    return parse(manifest.get("workload"), shapes)
