"""kernel.toml, the manifest of a kernel folder, read into a KernelSpec: every field checked,
and each mistake said in one line naming the file and the field."""

from __future__ import annotations

import tomllib
from pathlib import Path

from perfloop.contract import settings, workload
from perfloop.core.errors import UserError
from perfloop.contract.kernel import (
    KNOBS,
    MANIFEST,
    MODULE,
    TOLERANCE_KEYS,
    KernelSpec,
    Shape,
    _items,
    derived_held_back,
    read_knobs,
)
from perfloop.contract.playbook import candidates_key, freeze, patch_values, read_toml


class _BadTable(Exception):
    """A shape's params or dtypes is no table: said as such, not as a missing field."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_spec(folder: Path, repo_root: Path, text: str | None = None) -> KernelSpec:
    """The kernel's manifest: from `text` (a run's pinned copy) or the folder's kernel.toml."""
    path = folder / MANIFEST
    for needed in (MANIFEST, MODULE, KNOBS):
        if not (folder / needed).is_file():
            raise UserError(f"{folder} is not a kernel folder: it has no {needed}")
    manifest, text = _read(path, text)

    def bad(what: str) -> UserError:
        return UserError(f"{path}: {what}")

    try:
        name, judge_rel = _identity(manifest, folder)
        shapes = _shapes(manifest)
        known = read_knobs(folder / KNOBS)   # (the knobs [candidates] and finalists name)
        family = _workload(manifest, shapes, known)
        held_back = _held_back(manifest, shapes, family)
        _check_shapes(shapes, held_back)
        judge = _judge(repo_root, judge_rel, folder)
        spec = KernelSpec(name, folder, judge, shapes, _candidates(manifest, known),
                          _flag(manifest, "requires_gpu", True), _tolerance(manifest),
                          judge_rel, text, _tags(manifest), held_back, family,
                          "held_back" not in manifest,
                          settings.from_table(manifest.get("rules", {}), str(path)),
                          _plain(manifest, known))
    except _Bad as exc:
        raise bad(str(exc)) from None
    return spec


def _plain(manifest: dict, known: dict) -> dict | None:
    """[plain]: the knobs the kernel started from, before any tuning (`perfloop run --from
    plain` starts there): those it names at their values, every other knob null (TOML has no
    null), no dispatch table; None where the kernel declares none."""
    if "plain" not in manifest:
        return None
    plain = manifest["plain"]
    knobs = [k for k in known if k != "dispatch"]
    extra = sorted(set(plain) - set(knobs)) if isinstance(plain, dict) else []
    if not isinstance(plain, dict) or extra:
        raise _Bad(f"[plain] names knobs and their values as the kernel started; "
                   f"{', '.join(extra) or 'it is not a table'} is no knob of knobs.json")
    return {k: freeze(plain.get(k)) for k in knobs}


class _Bad(Exception):
    """What is wrong with the manifest, said after its path."""


def _read(path: Path, text: str | None) -> tuple[dict, str]:
    if text is None:
        return read_toml(path, "kernel manifest"), path.read_text(encoding="utf-8")
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"kernel manifest {path} is not valid TOML: {exc}") from None


def _identity(manifest: dict, folder: Path) -> tuple[str, str]:
    if "judge" not in manifest or "shapes" not in manifest:
        raise _Bad("needs a judge and [[shapes]] with name, dims and dtype "
                   f"(KeyError: '{'judge' if 'judge' not in manifest else 'shapes'}')")
    name, judge_rel = manifest.get("name", folder.name), manifest["judge"]
    if not isinstance(name, str) or not name or "/" in name:
        raise _Bad("name must be a non-empty string without '/'")
    if not isinstance(judge_rel, str):
        raise _Bad("judge must be a path string")
    return name, judge_rel


def _shape(raw: dict, held_back: bool = False) -> Shape:
    """A [[shapes]] or [[held_back]] table of kernel.toml."""
    for table in ("params", "dtypes"):
        if not isinstance(raw.get(table, {}), dict):
            raise _BadTable(f"shape {raw.get('name')}: {table} must be a table, e.g. "
                            f"{table} = {{ ... }}")
    return Shape(raw["name"], tuple(raw["dims"]), raw["dtype"],
                 False if held_back else raw.get("headline", False), held_back,
                 _items(raw.get("params")), _items(raw.get("dtypes")))


def _shape_list(raw, held_back: bool, what: str) -> tuple[Shape, ...]:
    try:
        return tuple(_shape(s, held_back) for s in raw)
    except _BadTable as exc:
        raise _Bad(str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise _Bad(f"{what} ({exc.__class__.__name__}: {exc})") from None


def _shapes(manifest: dict) -> tuple[Shape, ...]:
    shapes = _shape_list(manifest["shapes"], False,
                         "needs a judge and [[shapes]] with name, dims and dtype")
    for s in shapes:
        _check_shape(s)
    if sum(s.headline for s in shapes) != 1:
        raise _Bad("exactly one shape must have headline = true")
    return shapes


def _workload(manifest: dict, shapes: tuple, known: dict) -> workload.Workload:
    try:
        wl = workload.parse(manifest.get("workload"), shapes)
    except workload.WorkloadError as exc:
        raise _Bad(str(exc)) from None
    plain = {k for k in known if k != "dispatch"}   # (a finalist is plain knobs, never a table)
    for patch in wl.finalists:
        _knobs_known([k for k, _ in patch], plain, "[workload] finalists")
    return wl


def _knobs_known(names, known, where: str) -> None:
    unknown = [k for k in names if k not in known]
    if unknown:
        raise _Bad(f"{where}: {KNOBS} has no knob '{unknown[0]}'")


def _held_back(manifest: dict, shapes: tuple, family: workload.Workload) -> tuple[Shape, ...]:
    """[[held_back]]; without it, one derived per benchmark shape, in its bucket. Also where a
    workload is declared: its drawn held-out shapes (perfloop.contract.workload.held_out) may all
    run as one bucket, and a bucket no held-back shape checks can keep nothing."""
    held = manifest.get("held_back")
    if held is None:
        return tuple(derived_held_back(s, lambda h: workload.shape_bucket(family, h))
                     for s in shapes)
    out = _shape_list(held, True, "each [[held_back]] shape needs name, dims and dtype")
    for s in out:
        _check_shape(s)
    return out


def _check_shape(s: Shape) -> None:
    if not isinstance(s.name, str) or not isinstance(s.dtype, str):
        raise _Bad(f"shape {s.name!r}: name and dtype must be strings")
    if not s.dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                             for d in s.dims):
        raise _Bad(f"shape {s.name}: dims must be a list of positive integers")
    if not isinstance(s.headline, bool):
        raise _Bad(f"shape {s.name}: headline must be true or false")
    if not all(isinstance(k, str) and isinstance(v, (bool, int, float, str))
               for k, v in s.param_items):
        raise _Bad(f"shape {s.name}: params maps names to numbers, strings or booleans")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in s.dtype_items):
        raise _Bad(f"shape {s.name}: dtypes maps tensor names to dtype names, e.g. "
                   '{ w = "float32" }')


def _check_shapes(shapes: tuple, held_back: tuple) -> None:
    names = [s.name for s in shapes + held_back]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise _Bad(f"shape names must be unique ({', '.join(duplicates)} is used twice)")


def _flag(manifest: dict, key: str, default: bool) -> bool:
    value = manifest.get(key, default)
    if not isinstance(value, bool):
        raise _Bad(f"{key} must be true or false, not {value!r}")
    return value


def _tolerance(manifest: dict) -> dict:
    tolerance = manifest.get("tolerance", {})
    if not isinstance(tolerance, dict) or not all(
            isinstance(t, dict) and set(t) == set(TOLERANCE_KEYS) and all(map(_number, t.values()))
            for t in tolerance.values()):
        raise _Bad("each [tolerance.<dtype>] table needs numbers rtol, atol and max_rel_err")
    return tolerance


def _tags(manifest: dict) -> tuple:
    tags = manifest.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise _Bad("tags must be a list of names, e.g. [\"reduction\"]")
    return tuple(tags)


def _judge(repo_root: Path, judge_rel: str, folder: Path) -> Path:
    judge = (repo_root / judge_rel).resolve()
    if not judge.is_file():
        raise _Bad(f"judge {judge_rel} does not exist")
    if folder in judge.parents:
        raise _Bad("the judge must live outside the kernel folder, since the loop may change "
                   "everything inside it")
    return judge


def _candidates(manifest: dict, known: dict) -> dict:
    """[candidates]: per knob its values; "a+b": an entry's patches moving a and b together."""
    candidates = manifest.get("candidates", {})
    if not isinstance(candidates, dict) or not all(isinstance(v, list) and v
                                                   for v in candidates.values()):
        raise _Bad("[candidates] maps knob names to non-empty lists of values")
    frozen = {}
    for key, vals in candidates.items():
        together = tuple(key.split("+")) if "+" in key else ()
        _knobs_known(together or (key,), known, f"[candidates] {key}")
        try:
            frozen[candidates_key(together) if together else key] = (
                patch_values(vals, together, f"[candidates] {key}") if together
                else tuple(freeze(v) for v in vals))
        except UserError as exc:
            raise _Bad(str(exc)) from None
    return frozen
