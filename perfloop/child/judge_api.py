"""Helpers for judges: the pytest files in tests/ that decide whether a kernel is correct.

The judge owns its inputs, its reference and (or, through `tolerance`, the kernel's declared)
tolerances; the loop only tells it which variants to judge (through the perfloop.child.judge_plugin
plugin) and reads back what `check` or `log_case` logged.
"""

from __future__ import annotations

import json
from pathlib import Path

from perfloop.child import judge_plugin
from perfloop.core import hooks, outputs
from perfloop.core.kernel import Shape, import_module
from perfloop.core.playbook import freeze, read_toml


def requested_variants() -> list[dict] | None:
    """The variants the loop asked for: [{label, folder, knobs}] with knob lists as tuples (as
    build() takes them), or None outside the loop."""
    if not judge_plugin.REQUEST:
        return None
    return [{**v, "knobs": {k: freeze(x) for k, x in v["knobs"].items()}}
            for v in judge_plugin.REQUEST["variants"]]


def extremes(values: list) -> list:
    """The two ends of a knob's range; the smallest, largest and tallest of tiles; every value
    of a categorical knob."""
    numbers = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    tiles = [v for v in values if isinstance(v, tuple)]
    if numbers:
        return sorted({min(numbers), max(numbers)})
    if tiles:
        def area(t):
            return (t[0] * (t[1] or 1 << 30), t[0])  # a 0 or null column: the whole row
        by_area = sorted(tiles, key=area)
        return list(dict.fromkeys([by_area[0], by_area[-1], max(tiles, key=lambda t: t[0])]))
    return values


def default_variants(folder, combos: dict | None = None) -> list[dict]:
    """What a judge run by hand checks: the committed knobs, each knob moved alone to the ends
    of the values the playbook (and kernel.toml's [candidates]) can give it, and `combos`
    {label: {knob: value}} applied over the committed knobs."""
    from perfloop.core import playbook, variants
    from perfloop.core.kernel import read_knobs

    folder = Path(folder)
    committed = read_knobs(folder / "knobs.json")
    declared = read_toml(folder / "kernel.toml", "kernel manifest").get("candidates", {})
    candidates = {k: [freeze(v) for v in vals] for k, vals in declared.items()}
    out = [{"label": "committed", "knobs": committed}]
    book = playbook.load(playbook.resolve_dir(None, folder.parent.parent))
    for knob, values in variants.domains(book, committed, candidates).items():
        for value in extremes([v for v in values if v != committed[knob]]):
            out.append({"label": f"{knob}={value}", "knobs": {**committed, knob: value}})
    for label, change in (combos or {}).items():
        out.append({"label": label, "knobs": {**committed, **{k: freeze(v) for k, v in
                                                               change.items()}}})
    return [{**v, "folder": str(folder)} for v in out]


_modules: dict[str, object] = {}


def module_for(folder: str):
    """One import per kernel folder per process; variants differ by knobs, not by module."""
    if folder not in _modules:
        _modules[folder] = import_module(Path(folder), f"judge{len(_modules)}")
    return _modules[folder]


def tolerance(folder, dtype: str, *, dims=None, index: int = 0) -> dict:
    """The tolerance the timing worker checks timed outputs with: with `dims` (this case's
    shape), the kernel's own `tolerance(shape, index, dtype)` for its output `index` if
    kernel.py has one and it answers; else kernel.toml's [tolerance.<dtype>], else perfloop's
    default. Under the loop the hook is read from the run's pinned copy of the kernel (like the
    worker's), so an experiment that edits it changes nothing."""
    if dims is not None:
        module = module_for(_pinned(folder))
        hook = hooks.Hooks.of(module).tolerance
        mine = hook(Shape("judge", tuple(dims), dtype), index, dtype) if hook else None
        if mine is not None:
            return dict(hooks.valid(mine, f"{folder}/kernel.py: tolerance"))
    declared = read_toml(Path(folder) / "kernel.toml", "kernel manifest").get("tolerance", {})
    return outputs.tolerance_for(dtype, declared)


def _pinned(folder) -> str:
    """The run's base-commit copy of `folder` when the loop runs this judge, else `folder`."""
    contract = (judge_plugin.REQUEST or {}).get("contract")
    if contract and Path(folder).resolve() == Path(contract["folder"]).resolve():
        return contract["copy"]
    return str(folder)


def log_case(label: str, case: str, passed: bool, **detail) -> None:
    """Tell the loop how one case of one variant went (a no-op outside the loop)."""
    if judge_plugin.REQUEST:
        with open(judge_plugin.REQUEST["log"], "a", encoding="utf-8") as f:
            f.write(json.dumps({"label": label, "case": case, "passed": passed, **detail}) + "\n")


def check(label: str, case: str, run, reference, *, rtol: float, atol: float,
          max_rel_err: float) -> None:
    """Run `run()`, which must poison its output (NaN), launch, and return the output; compare
    it with the float64 `reference`; log the case and fail the test on any mismatch."""
    entry = {"passed": False}
    try:
        out = run()
        if getattr(out, "is_cuda", False):
            import torch

            torch.cuda.synchronize()
        tol = {"rtol": rtol, "atol": atol, "max_rel_err": max_rel_err}
        entry.update(outputs.compare(out, reference, {}, "", fixed=tol))
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log_case(label, case, **entry)
        raise
    log_case(label, case, **entry)
    assert entry["passed"], (f"{label} {case}: {entry['non_finite']} non-finite elements, "
                             f"relative error {entry['rel_err']:.3e} (limit {max_rel_err:.1e}), "
                             f"{entry['outside_tolerance']} elements outside atol={atol} rtol={rtol}")
