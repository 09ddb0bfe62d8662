"""The kernel plug-in contract: how perfloop finds a kernel folder and what it reads there.

A kernel folder holds
  kernel.toml  name, the judge (a tracked pytest file outside the folder), benchmark shapes,
               tolerances per output dtype, optional per-knob candidates and tags (the
               playbook's ranking for kinds of kernel), optional held-back shapes (timed
               only to check a per-bucket dispatch; derived from the shapes if absent);
               optional [workload], the family of shapes it serves (perfloop.contract.workload:
               held-out shapes drawn from it, and the buckets decisions are taken in);
               optional [rules], settings over the playbook's (perfloop.contract.settings);
               pinned for a run;
  knobs.json   the tunable values: the file the loop edits and commits;
  kernel.py    build(knobs) -> launch(inputs, out), which experiments change; and the
               benchmark, which a run takes from its base commit: make_inputs(shape, seed,
               device), empty_output(inputs), reference(*inputs), traffic(shape) ->
               {"bytes": B, "flops": {unit: count}} with units tensor.bf16/fp16/tf32/fp8,
               fp32 and sfu (perfloop.contract.traffic; the older (bytes, flops) pair counts its
               FLOPs as tensor.bf16), optionally DEVICE ("cpu": CPU-timed kernels); optionally
               compile_ahead(knobs, shapes, arch) for `perfloop check`; optionally
               bucket(inputs) -> str, the key of per-shape dispatch (perfloop.contract.dispatch;
               without it, the workload's buckets: perfloop.contract.workload);
               optionally competitors() -> {name: fn(*inputs)}, timed by `perfloop bench`;
               optionally (perfloop.contract.hooks) INPLACE, the inputs launch updates (restored before
               every launch, checked against reference's extra results), scratch(inputs) ->
               buffers passed as launch(inputs, out, buffers), and tolerance(shape, index,
               dtype), a tolerance per output and shape over kernel.toml's per-dtype one;
               optionally canonical(knobs) -> knobs, with what the kernel ignores set to one
               value (perfloop.contract.knobspace: such candidates are never proposed).
kernel.toml is read by perfloop.contract.manifest (load_spec; public as perfloop.kernel.load_spec);
docs/writing-a-kernel.md documents the contract for users.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perfloop.core import plainfile
from perfloop.core.errors import UserError, first_line
from perfloop.contract.shape import Shape, _items, pow2  # noqa: F401  (the contract's)
from perfloop.core.source import compile_error
from perfloop.core.values import freeze, thaw

SHIPPED = Path(__file__).resolve().parents[2] / "kernels"
MANIFEST, KNOBS, MODULE = "kernel.toml", "knobs.json", "kernel.py"
TOLERANCE_KEYS = ("rtol", "atol", "max_rel_err")


def derived_held_back(shape: Shape, bucket_of=None) -> Shape:
    """A shape the loop never tunes on, in `shape`'s bucket (`bucket_of(shape)`: the
    workload's; by the row width, or by the power of two of the rows, as a workload derived
    from the benchmark keys it): half as many rows again plus one (so no row tile divides it),
    or where that leaves the bucket, a quarter fewer plus one, or one more or fewer. Rows are
    the first dimension, or the second behind a small batch (2 x 2048 x 5000: a workload folds
    it to batch x rows, so doubling the batch doubles the rows); another leading dimension is
    changed where those cannot be, and each change keeps its dimension's power-of-two class
    and that of the leading dimensions' product."""
    dims = shape.dims
    lead = list(range(max(len(dims) - 1, 1)))
    if len(dims) >= 3 and dims[0] <= 8:
        lead.remove(1)
        lead.insert(0, 1)
    for i in lead:
        n, rest = dims[i], math.prod(dims[:-1] or dims) // max(dims[i], 1)
        for rows in (n + n // 2 + 1, n - n // 4 + 1, n + 1, n - 1):
            held = _held(shape, dims[:i] + (rows,) + dims[i + 1:])
            if rows > 0 and rows != n and pow2(rows) == pow2(n) \
                    and pow2(rows * rest) == pow2(n * rest) \
                    and (bucket_of is None or bucket_of(held) == bucket_of(shape)):
                return held
    n = dims[0]   # (no change keeps the bucket: the first dimension, as before)
    rows = n + n // 2 + 1
    if rows > pow2(n) and n > 8:
        rows = n - n // 4 + 1
    return _held(shape, (rows, *dims[1:]))


def _held(shape: Shape, dims: tuple) -> Shape:
    return replace(shape, name=f"held:{shape.name}", dims=tuple(dims), headline=False,
                   held_back=True)


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
    held_back: tuple = ()                           # [[held_back]], or derived without a workload
    workload: Any = None                            # perfloop.contract.workload.Workload
    held_back_derived: bool = False                 # no [[held_back]]: one per benchmark shape
    rules: dict = field(default_factory=dict)       # [rules]: settings over rules.toml's
    plain: dict | None = None                       # [plain]: the naive start (run --from plain)

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
        text = plainfile.read_text(path)
    except FileNotFoundError:
        raise UserError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else exc
        raise UserError(f"{path} is unreadable: {why}") from None
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


def import_module(folder: Path, tag: str, file: str = MODULE):
    """Import folder/kernel.py (or another file of the folder) under a unique name, so two
    versions can live in one process."""
    name = f"perfloop_kernel_{tag}"
    spec = importlib.util.spec_from_file_location(name, Path(folder) / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_module(folder: Path, tag: str, where: str, file: str = MODULE):
    """import_module in perfloop's own process: a file that does not compile, or that raises
    while it is imported, is refused in one line naming `where` (the kernel's mistake, not
    perfloop's)."""
    path = Path(folder) / file
    why = compile_error(plainfile.read_text(path), str(path))
    if why:
        raise UserError(f"{where} does not compile ({why}); fix it, then run the command again")
    try:
        return import_module(folder, tag, file)
    except Exception as exc:  # kernel code: its failure in one line, not a traceback
        raise UserError(f"{where} failed while imported ({type(exc).__name__}: "
                        f"{first_line(exc)}); fix it, then run the command again") from None


def triton_competitor(folder: Path, file: str, function: str) -> dict:
    """What a kernel's competitors() returns for a Triton kernel of its own, `function` in
    folder/file: {"triton": that function}, or {} where Triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        return {}
    return {"triton": getattr(import_module(folder, f"competitor_{function}", file), function)}


def code_digest(folder: Path) -> str:
    """The digest of a kernel folder's code: every file but knobs.json (variants that differ
    only in knobs share it, and with it their compile cache)."""
    h = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if path.name == KNOBS or "__pycache__" in path.parts:
            continue
        name = str(path.relative_to(folder)).encode() + b"\0"
        if path.is_symlink():  # (its target's name: reading it could follow it anywhere)
            h.update(name + b"link\0" + os.readlink(path).encode())
        elif path.is_file():   # (a FIFO or a device is no file: is_file says False)
            h.update(name + plainfile.read_bytes(path))
    return h.hexdigest()[:16]
