"""The kernel plug-in contract: how perfloop finds a kernel folder and what it reads there.

A kernel folder holds
  kernel.toml  name, the judge (a pytest file outside the folder), benchmark shapes, and
               optional per-knob candidate overrides;
  knobs.json   the tunable values: the one file the loop edits and commits;
  kernel.py    build(knobs) -> launch(inputs, out); make_inputs(shape, seed, device);
               empty_output(inputs); reference(*inputs); traffic(shape) -> (bytes, flops);
               optionally compile_ahead(knobs, shapes, arch) for `perfloop check`, and Clock
               to replace CUDA-event timing (test kernels only).
README.md ("Writing a kernel") documents it for users.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from perfloop.errors import UserError
from perfloop.playbook import freeze, read_toml, thaw

SHIPPED = Path(__file__).resolve().parent.parent / "kernels"
MANIFEST, KNOBS, MODULE = "kernel.toml", "knobs.json", "kernel.py"


@dataclass(frozen=True)
class Shape:
    name: str
    dims: tuple[int, ...]
    dtype: str
    headline: bool = False

    def as_dict(self) -> dict:
        return {"name": self.name, "dims": list(self.dims), "dtype": self.dtype,
                "headline": self.headline}

    @classmethod
    def from_dict(cls, raw: dict) -> "Shape":
        return cls(raw["name"], tuple(raw["dims"]), raw["dtype"], bool(raw.get("headline")))


@dataclass(frozen=True)
class KernelSpec:
    name: str
    folder: Path
    judge: Path
    shapes: tuple[Shape, ...]
    candidates: dict
    requires_gpu: bool

    @property
    def headline(self) -> Shape:
        return next(s for s in self.shapes if s.headline)

    @property
    def knobs_file(self) -> Path:
        return self.folder / KNOBS

    def read_knobs(self, folder: Path | None = None) -> dict:
        return read_knobs((folder or self.folder) / KNOBS)

    def write_knobs(self, knobs: dict) -> None:
        """One knob per line, so an experiment's diff is the one line it changed."""
        lines = [f"  {json.dumps(k)}: {json.dumps(thaw(v))}" for k, v in knobs.items()]
        self.knobs_file.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")


def read_knobs(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} is missing") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path} must hold a JSON object of knob names to values")
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
    shipped = sorted(p.name for p in SHIPPED.iterdir() if (p / MANIFEST).is_file())
    raise UserError(f"unknown kernel '{arg}': no kernels/{arg}/{MANIFEST} "
                    f"(shipped kernels: {', '.join(shipped) or 'none'}; or give a folder path)")


def load_spec(folder: Path, repo_root: Path) -> KernelSpec:
    manifest_path = folder / MANIFEST
    for needed in (MANIFEST, MODULE, KNOBS):
        if not (folder / needed).is_file():
            raise UserError(f"{folder} is not a kernel folder: it has no {needed}")
    manifest = read_toml(manifest_path)
    try:
        shapes = tuple(Shape(s["name"], tuple(int(d) for d in s["dims"]), s["dtype"],
                             bool(s.get("headline", False))) for s in manifest["shapes"])
        judge = (repo_root / manifest["judge"]).resolve()
        name = manifest.get("name", folder.name)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{manifest_path}: needs a judge and [[shapes]] with name, dims and "
                        f"dtype ({exc.__class__.__name__}: {exc})") from None
    if sum(s.headline for s in shapes) != 1:
        raise UserError(f"{manifest_path}: exactly one shape must have headline = true")
    if not judge.is_file():
        raise UserError(f"{manifest_path}: judge {manifest['judge']} does not exist")
    if folder in judge.parents:
        raise UserError(f"{manifest_path}: the judge must live outside the kernel folder, "
                        "since the loop may change everything inside it")
    candidates = {k: tuple(freeze(v) for v in vals)
                  for k, vals in manifest.get("candidates", {}).items()}
    return KernelSpec(name, folder, judge, shapes, candidates,
                      bool(manifest.get("requires_gpu", True)))


def import_module(folder: Path, tag: str):
    """Import folder/kernel.py under a unique name, so two versions can live in one process."""
    name = f"perfloop_kernel_{tag}"
    spec = importlib.util.spec_from_file_location(name, folder / MODULE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
