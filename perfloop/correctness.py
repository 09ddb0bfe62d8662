"""Helpers for judges: the pytest files in tests/ that decide whether a kernel is correct.

The judge owns its reference, inputs and tolerances; the loop only tells it which variants
to judge (PERFLOOP_VARIANTS) and reads back what `check` logged (PERFLOOP_CORRECTNESS_LOG).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from perfloop.kernel import import_module

VARIANTS_ENV = "PERFLOOP_VARIANTS"
LOG_ENV = "PERFLOOP_CORRECTNESS_LOG"


def requested_variants() -> list[dict] | None:
    """The variants the loop asked for: [{label, folder, knobs}], or None outside the loop."""
    raw = os.environ.get(VARIANTS_ENV)
    return json.loads(raw) if raw else None


_modules: dict[str, object] = {}


def module_for(folder: str):
    """One import per kernel folder per process; variants differ by knobs, not by module."""
    if folder not in _modules:
        _modules[folder] = import_module(Path(folder), f"judge{len(_modules)}")
    return _modules[folder]


def log_case(label: str, case: str, passed: bool, **detail) -> None:
    """Tell the loop how one case of one variant went (a no-op outside the loop)."""
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"label": label, "case": case, "passed": passed, **detail}) + "\n")


def check(label: str, case: str, run, reference, *, rtol: float, atol: float,
          max_rel_err: float) -> None:
    """Run `run()` (which poisons its output with NaN, launches, returns the output) and compare
    with the float64 `reference`; log the case and fail the test on any mismatch."""
    import torch

    entry = {"passed": False}
    try:
        out = run()
        if out.is_cuda:
            torch.cuda.synchronize()
        got, ref = out.double(), reference.double().to(out.device)
        bad = int((~torch.isfinite(got)).sum())
        diff = (got - ref).abs()
        within = diff <= atol + rtol * ref.abs()
        rel = float(diff.norm() / ref.norm().clamp_min(1e-30)) if bad == 0 else float("nan")
        entry.update(non_finite=bad, rel_err=rel, max_abs_err=float(diff.max()) if bad == 0
                     else float("nan"), outside_tolerance=int((~within).sum()),
                     rtol=rtol, atol=atol, max_rel_err=max_rel_err)
        entry["passed"] = bad == 0 and rel <= max_rel_err and bool(within.all())
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log_case(label, case, **entry)
        raise
    log_case(label, case, **entry)
    assert entry["passed"], (f"{label} {case}: {entry['non_finite']} non-finite elements, "
                             f"relative error {entry['rel_err']:.3e} (limit {max_rel_err:.1e}), "
                             f"{entry['outside_tolerance']} elements outside atol={atol} rtol={rtol}")
