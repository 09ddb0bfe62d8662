"""The playbook as data: the optimization catalog, the decision rules, the autotune spaces."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from perfloop.errors import UserError

CLASSES = ("memory-bound", "balanced", "compute-bound")
SHIPPED = Path(__file__).resolve().parent.parent / "playbook"


@dataclass(frozen=True)
class Optimization:
    id: str
    title: str
    family: str
    knob: str
    values: tuple
    applies_to: tuple[str, ...]
    priority: dict
    why: str


@dataclass(frozen=True)
class Decision:
    keep_gain: float
    minor_gain: float
    regression_tolerance: float
    family_penalty: int
    floor_tolerance: float


@dataclass(frozen=True)
class Stop:
    no_improvement_streak: int
    max_iterations: int


@dataclass(frozen=True)
class Measure:
    rounds: int
    round_ms: float
    warmup_ms: float
    min_reps: int
    max_reps: int


@dataclass(frozen=True)
class Rules:
    decision: Decision
    stop: Stop
    iteration_timeout_s: float
    measure: Measure


@dataclass(frozen=True)
class Playbook:
    path: Path
    optimizations: tuple[Optimization, ...]
    rules: Rules
    autotune: dict

    def get(self, opt_id: str) -> Optimization:
        for opt in self.optimizations:
            if opt.id == opt_id:
                return opt
        known = ", ".join(o.id for o in self.optimizations)
        raise UserError(f"unknown optimization '{opt_id}' (known: {known})")


def resolve_dir(explicit: str | None, repo_root: Path | None) -> Path:
    """--playbook, then $PERFLOOP_PLAYBOOK, then the kernel repo's playbook/, then perfloop's."""
    for candidate in (explicit, os.environ.get("PERFLOOP_PLAYBOOK")):
        if candidate:
            path = Path(candidate)
            if not (path / "catalog.toml").is_file():
                raise UserError(f"playbook directory {path} has no catalog.toml")
            return path
    if repo_root is not None and (repo_root / "playbook" / "catalog.toml").is_file():
        return repo_root / "playbook"
    return SHIPPED


def read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"playbook file {path} is missing") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"playbook file {path} is not valid TOML: {exc}") from None


def _section(data: dict, name: str, cls, path: Path):
    raw = data.get(name, {})
    try:
        return cls(**raw)
    except TypeError as exc:
        raise UserError(f"{path}: section [{name}]: {exc}") from None


def _optimization(raw: dict, path: Path) -> Optimization:
    try:
        opt = Optimization(
            id=raw["id"], title=raw["title"], family=raw["family"], knob=raw["knob"],
            values=tuple(freeze(v) for v in raw["values"]),
            applies_to=tuple(raw["applies_to"]), priority=dict(raw["priority"]),
            why=raw.get("why", ""),
        )
    except KeyError as exc:
        raise UserError(f"{path}: optimization {raw.get('id', '?')} lacks {exc}") from None
    bad = [c for c in opt.applies_to if c not in CLASSES or c not in opt.priority]
    if bad or not opt.values:
        raise UserError(f"{path}: optimization {opt.id}: every class in applies_to needs a "
                        f"priority and values must not be empty (check {bad or 'values'})")
    return opt


def freeze(value):
    """JSON and TOML arrays become tuples, so knob values can be compared and hashed."""
    return tuple(freeze(v) for v in value) if isinstance(value, list) else value


def thaw(value):
    """The inverse of freeze, for JSON."""
    return [thaw(v) for v in value] if isinstance(value, tuple) else value


def load(directory: Path) -> Playbook:
    catalog_path = directory / "catalog.toml"
    rules_path = directory / "rules.toml"
    catalog = read_toml(catalog_path)
    rules = read_toml(rules_path)
    opts = tuple(_optimization(raw, catalog_path) for raw in catalog.get("optimization", []))
    ids = [o.id for o in opts]
    if len(set(ids)) != len(ids):
        raise UserError(f"{catalog_path}: optimization ids must be unique")
    limits = rules.get("limits", {})
    parsed = Rules(
        decision=_section(rules, "decision", Decision, rules_path),
        stop=_section(rules, "stop", Stop, rules_path),
        iteration_timeout_s=float(limits.get("iteration_timeout_s", 600)),
        measure=_section(rules, "measure", Measure, rules_path),
    )
    autotune_path = directory / "autotune.toml"
    autotune = read_toml(autotune_path) if autotune_path.exists() else {}
    return Playbook(path=directory, optimizations=opts, rules=parsed, autotune=autotune)
