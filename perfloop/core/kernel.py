"""The kernel plug-in contract: how perfloop finds a kernel folder and what it reads there.

A kernel folder holds
  kernel.toml  name, the judge (a tracked pytest file outside the folder), benchmark shapes,
               tolerances per output dtype, optional per-knob candidates and tags (the
               playbook's ranking for kinds of kernel), optional held-back shapes (timed
               only to check a per-bucket dispatch; derived from the shapes if absent);
               pinned for a run;
  knobs.json   the tunable values: the file the loop edits and commits;
  kernel.py    build(knobs) -> launch(inputs, out), which experiments change; and the
               benchmark, which a run takes from its base commit: make_inputs(shape, seed,
               device), empty_output(inputs), reference(*inputs), traffic(shape) ->
               {"bytes": B, "flops": {unit: count}} with units tensor.bf16/fp16/tf32/fp8,
               fp32 and sfu (perfloop.core.traffic; the older (bytes, flops) pair counts its
               FLOPs as tensor.bf16), optionally DEVICE and Clock (CPU-timed kernels); optionally
               compile_ahead(knobs, shapes, arch) for `perfloop check`; optionally
               bucket(inputs) -> str, the key of per-shape dispatch (perfloop.core.dispatch);
               optionally competitors() -> {name: fn(*inputs)}, timed by `perfloop bench`;
               optionally (perfloop.core.hooks) INPLACE, the inputs launch updates (restored before
               every launch, checked against reference's extra results), scratch(inputs) ->
               buffers passed as launch(inputs, out, buffers), and tolerance(shape, index,
               dtype), a tolerance per output and shape over kernel.toml's per-dtype one;
               optionally canonical(knobs) -> knobs, with what the kernel ignores set to one
               value (perfloop.core.knobspace: such candidates are never proposed).
README.md ("Writing a kernel") documents it for users.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfloop.core.errors import UserError
from perfloop.core.playbook import candidates_key, freeze, patch_values, read_toml, thaw

SHIPPED = Path(__file__).resolve().parents[2] / "kernels"
MANIFEST, KNOBS, MODULE = "kernel.toml", "knobs.json", "kernel.py"


@dataclass(frozen=True)
class Shape:
    name: str
    dims: tuple[int, ...]
    dtype: str
    headline: bool = False
    held_back: bool = False   # timed only to check that a per-bucket choice generalizes
    param_items: tuple = ()   # (name, value) pairs: the case's named parameters (params)
    dtype_items: tuple = ()   # (tensor name, dtype) pairs: dtypes other than `dtype` (dtypes)

    @property
    def params(self) -> dict:
        """The case's named parameters, e.g. {"M": 128, "eps": 1e-6} (kernel.toml's params)."""
        return dict(self.param_items)

    @property
    def dtypes(self) -> dict:
        """The dtype of each tensor kernel.toml names in `dtypes`, e.g. {"w": "float32"}."""
        return dict(self.dtype_items)

    def dtype_of(self, tensor: str) -> str:
        """The dtype of the named tensor: as `dtypes` gives it, else the case's `dtype`."""
        return self.dtypes.get(tensor, self.dtype)

    def as_dict(self) -> dict:
        """name, dims (a list), dtype, headline, held_back, params, dtypes: the fields a
        kernel's functions may read."""
        return {"name": self.name, "dims": list(self.dims), "dtype": self.dtype,
                "headline": self.headline, "held_back": self.held_back,
                "params": self.params, "dtypes": self.dtypes}

    @classmethod
    def from_dict(cls, raw: dict) -> "Shape":
        return cls(raw["name"], tuple(raw["dims"]), raw["dtype"], bool(raw.get("headline")),
                   bool(raw.get("held_back")), _items(raw.get("params")),
                   _items(raw.get("dtypes")))


def _items(table) -> tuple:
    """A TOML or JSON table as sorted (key, value) pairs, so a Shape stays hashable."""
    return tuple(sorted((table or {}).items()))


def derived_held_back(shape: Shape) -> Shape:
    """A shape the loop never tunes on, in the same bucket as `shape` for kernels that bucket
    by dtype and row width: half as many rows again, plus one (so no row tile divides it)."""
    rows = shape.dims[0] + shape.dims[0] // 2 + 1
    return replace(shape, name=f"held:{shape.name}", dims=(rows, *shape.dims[1:]),
                   headline=False, held_back=True)


@dataclass(frozen=True)
class KernelSpec:
    name: str
    folder: Path
    judge: Path
    shapes: tuple[Shape, ...]
    candidates: dict
    requires_gpu: bool
    tolerance: dict = field(default_factory=dict)   # dtype -> {rtol, atol, max_rel_err}
    judge_rel: str = ""                             # the judge, relative to the repository root
    manifest_text: str = ""
    tags: tuple = ()                                # e.g. ("reduction",): the playbook ranks by them
    held_back: tuple = ()                           # shapes timed only in dispatch experiments

    @property
    def headline(self) -> Shape:
        return next(s for s in self.shapes if s.headline)

    def read_knobs(self, folder: Path | None = None) -> dict:
        return read_knobs((folder or self.folder) / KNOBS)


def knobs_text(knobs: dict) -> str:
    """One knob per line, so an experiment's diff is the one line it changed."""
    lines = [f"  {json.dumps(k)}: {json.dumps(thaw(v))}" for k, v in knobs.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def read_knobs(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path} is missing") from None
    return parse_knobs(text, str(path))


def parse_knobs(text: str, where: str) -> dict:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{where} must hold a JSON object of knob names to values")
    return {k: freeze(v) for k, v in raw.items()}


def find_folder(arg: str, repo_root: Path | None) -> Path:
    """A path to a folder, or the name of a folder under <repo>/kernels/ or perfloop's kernels/."""
    path = Path(arg).expanduser()
    if "/" in arg or arg in (".", "..") or path.is_dir() and (path / MANIFEST).exists():
        if not path.is_dir():
            raise UserError(f"kernel folder {arg} does not exist")
        return path.resolve()
    places = [root / arg for root in ((repo_root / "kernels") if repo_root else None, SHIPPED)
              if root is not None]
    for place in places:
        if (place / MANIFEST).is_file():
            return place.resolve()
    if SHIPPED.is_dir():
        shipped = sorted(p.name for p in SHIPPED.iterdir() if (p / MANIFEST).is_file())
        others = f"shipped kernels: {', '.join(shipped) or 'none'}"
    else:  # an installed perfloop: the example kernels live in its source repository
        others = "perfloop's example kernels are in its source repository"
    raise UserError(f"unknown kernel '{arg}': no kernels/{arg}/{MANIFEST} in this repository "
                    f"({others}; or give a folder path)")


TOLERANCE_KEYS = ("rtol", "atol", "max_rel_err")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_spec(folder: Path, repo_root: Path, text: str | None = None) -> KernelSpec:
    """The kernel's manifest: from `text` (a run's pinned copy) or the folder's kernel.toml."""
    manifest_path = folder / MANIFEST
    for needed in (MANIFEST, MODULE, KNOBS):
        if not (folder / needed).is_file():
            raise UserError(f"{folder} is not a kernel folder: it has no {needed}")
    if text is None:
        manifest = read_toml(manifest_path, "kernel manifest")
        text = manifest_path.read_text(encoding="utf-8")
    else:
        try:
            manifest = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"kernel manifest {manifest_path} is not valid TOML: {exc}") from None

    def bad(what: str) -> UserError:
        return UserError(f"{manifest_path}: {what}")

    try:
        shapes = tuple(_shape(s) for s in manifest["shapes"])
        judge_rel = manifest["judge"]
        name = manifest.get("name", folder.name)
    except _BadTable as exc:
        raise bad(str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(f"needs a judge and [[shapes]] with name, dims and dtype "
                  f"({exc.__class__.__name__}: {exc})") from None
    if not isinstance(name, str) or not name or "/" in name:
        raise bad("name must be a non-empty string without '/'")
    if not isinstance(judge_rel, str):
        raise bad("judge must be a path string")
    def check(s: Shape) -> None:
        if not isinstance(s.name, str) or not isinstance(s.dtype, str):
            raise bad(f"shape {s.name!r}: name and dtype must be strings")
        if not s.dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                 for d in s.dims):
            raise bad(f"shape {s.name}: dims must be a list of positive integers")
        if not isinstance(s.headline, bool):
            raise bad(f"shape {s.name}: headline must be true or false")
        if not all(isinstance(k, str) and isinstance(v, (bool, int, float, str))
                   for k, v in s.param_items):
            raise bad(f"shape {s.name}: params maps names to numbers, strings or booleans")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in s.dtype_items):
            raise bad(f"shape {s.name}: dtypes maps tensor names to dtype names, e.g. "
                      '{ w = "float32" }')

    for s in shapes:
        check(s)
    held = manifest.get("held_back")
    try:
        held_back = (tuple(derived_held_back(s) for s in shapes) if held is None else
                     tuple(_shape(s, held_back=True) for s in held))
    except _BadTable as exc:
        raise bad(str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(f"each [[held_back]] shape needs name, dims and dtype "
                  f"({exc.__class__.__name__}: {exc})") from None
    for s in held_back:
        check(s)
    names = [s.name for s in shapes + held_back]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise bad(f"shape names must be unique ({', '.join(duplicates)} is used twice)")
    if sum(s.headline for s in shapes) != 1:
        raise bad("exactly one shape must have headline = true")
    requires_gpu = manifest.get("requires_gpu", True)
    if not isinstance(requires_gpu, bool):
        raise bad(f"requires_gpu must be true or false, not {requires_gpu!r}")
    tolerance = manifest.get("tolerance", {})
    if not isinstance(tolerance, dict) or not all(
            isinstance(t, dict) and set(t) == set(TOLERANCE_KEYS) and all(map(_number, t.values()))
            for t in tolerance.values()):
        raise bad("each [tolerance.<dtype>] table needs numbers rtol, atol and max_rel_err")
    candidates = manifest.get("candidates", {})
    if not isinstance(candidates, dict) or not all(isinstance(v, list) and v
                                                   for v in candidates.values()):
        raise bad("[candidates] maps knob names to non-empty lists of values")
    tags = manifest.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise bad("tags must be a list of names, e.g. [\"reduction\"]")
    judge = (repo_root / judge_rel).resolve()
    if not judge.is_file():
        raise bad(f"judge {judge_rel} does not exist")
    if folder in judge.parents:
        raise bad("the judge must live outside the kernel folder, since the loop may change "
                  "everything inside it")
    frozen = {}
    knobs_path = folder / KNOBS
    known = read_knobs(knobs_path) if knobs_path.is_file() else None
    for key, vals in candidates.items():  # "a+b": an entry's values moving a and b together
        together = tuple(key.split("+")) if "+" in key else ()
        unknown = [k for k in together or (key,) if known is not None and k not in known]
        if unknown:
            raise bad(f"[candidates] {key}: {KNOBS} has no knob '{unknown[0]}'")
        try:
            frozen[candidates_key(together) if together else key] = (
                patch_values(vals, together, f"[candidates] {key}") if together
                else tuple(freeze(v) for v in vals))
        except UserError as exc:
            raise bad(str(exc)) from None
    return KernelSpec(name, folder, judge, shapes, frozen,
                      requires_gpu, tolerance, judge_rel, text, tuple(tags), held_back)


class _BadTable(Exception):
    """A shape's params or dtypes is no table: said as such, not as a missing field."""


def _shape(raw: dict, held_back: bool = False) -> Shape:
    """A [[shapes]] or [[held_back]] table of kernel.toml."""
    for table in ("params", "dtypes"):
        if not isinstance(raw.get(table, {}), dict):
            raise _BadTable(f"shape {raw.get('name')}: {table} must be a table, e.g. "
                            f"{table} = {{ ... }}")
    return Shape(raw["name"], tuple(raw["dims"]), raw["dtype"],
                 False if held_back else raw.get("headline", False), held_back,
                 _items(raw.get("params")), _items(raw.get("dtypes")))


def import_module(folder: Path, tag: str, file: str = MODULE):
    """Import folder/kernel.py (or another file of the folder) under a unique name, so two
    versions can live in one process."""
    name = f"perfloop_kernel_{tag}"
    spec = importlib.util.spec_from_file_location(name, Path(folder) / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def triton_competitor(folder: Path, file: str, function: str) -> dict:
    """What a kernel's competitors() returns for a Triton kernel of its own, `function` in
    folder/file: {"triton": that function}, or {} where Triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        return {}
    return {"triton": getattr(import_module(folder, f"competitor_{function}", file), function)}
