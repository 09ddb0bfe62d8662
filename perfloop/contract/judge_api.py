"""Helpers for judges: the pytest files in tests/ that decide whether a kernel is correct.

The judge owns its inputs, its reference and (or, through `tolerance`, the kernel's declared)
tolerances; the loop only tells it which variants to judge (through the perfloop.child.judge_plugin
plugin) and reads back what `check` or `log_case` logged.
"""

from __future__ import annotations

import json
from pathlib import Path

from perfloop.contract import hooks, judge_replay, judging, outputs
from perfloop.contract.kernel import Shape, import_module
from perfloop.contract.playbook import freeze, read_toml


def requested_variants() -> list[dict] | None:
    """The variants the loop asked for: [{label, folder, knobs}] with knob lists as tuples (as
    build() takes them), or None outside the loop."""
    if not judging.REQUEST:
        return None
    return [{**v, "knobs": {k: freeze(x) for k, x in v["knobs"].items()}}
            for v in judging.REQUEST["variants"]]


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
    from perfloop.contract import playbook, variants
    from perfloop.contract.kernel import read_knobs

    folder = Path(folder)
    committed = read_knobs(folder / "knobs.json")
    manifest = read_toml(folder / "kernel.toml", "kernel manifest")
    candidates = {k: [freeze(v) for v in vals]
                  for k, vals in manifest.get("candidates", {}).items()}
    out = [{"label": "committed", "knobs": committed}]
    book = playbook.load(playbook.resolve_dir(None, folder.parent.parent))
    for knob, values in variants.domains(book, committed, candidates,
                                         tuple(manifest.get("tags", ()))).items():
        for value in extremes([v for v in values if v != committed[knob]]):
            out.append({"label": f"{knob}={value}", "knobs": {**committed, knob: value}})
    for label, change in (combos or {}).items():
        out.append({"label": label, "knobs": {**committed, **{k: freeze(v) for k, v in
                                                               change.items()}}})
    return [{**v, "folder": str(folder)} for v in out]


_modules: dict[str, object] = {}


class _StandIn:
    """What module_for gives in the reference pass, where no kernel code may run: every
    attribute is a function returning a launcher that does nothing. A judge computes its
    expected values from its own inputs, never from the kernel module. build(knobs) returns a
    launcher that records how check's run() launched it (perfloop.contract.judge_replay), so the
    timer can replay the case where no pytest runs."""

    def __init__(self, folder):
        self._folder = str(folder)

    def __getattr__(self, name):
        def stand_in(*args, **kwargs):
            if name == "build" and len(args) == 1 and not kwargs:
                return judge_replay.RecordingLauncher(self._folder, args[0])
            judge_replay.other_call(name)
            return lambda *a, **k: judge_replay.other_call(name)
        return stand_in


def module_for(folder: str):
    """One import per kernel folder per process; variants differ by knobs, not by module."""
    if judging.MODE == judging.REFERENCE and not _is_contract_copy(folder):
        return _StandIn(folder)
    if folder not in _modules:
        _modules[folder] = import_module(Path(folder), f"judge{len(_modules)}")
    return _modules[folder]


def _is_contract_copy(folder) -> bool:
    """The run's pinned copy of the kernel (its tolerance hook is the contract's, read by the
    reference pass too)."""
    contract = (judging.REQUEST or {}).get("contract")
    return bool(contract) and Path(folder).resolve() == Path(contract["copy"]).resolve()


def tolerance(folder, dtype: str, *, dims=None, index: int = 0) -> dict:
    """The tolerance the timer checks timed outputs with: with `dims` (this case's shape), the
    kernel's own `tolerance(shape, index, dtype)` for its output `index` if kernel.py has one
    and it answers; else kernel.toml's [tolerance.<dtype>], else perfloop's default. Under the
    loop the hook is read from the run's pinned copy of the kernel, so an experiment that
    edits it changes nothing."""
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
    contract = (judging.REQUEST or {}).get("contract")
    if contract and Path(folder).resolve() == Path(contract["folder"]).resolve():
        return contract["copy"]
    return str(folder)


def log_case(label: str, case: str, passed: bool, **detail) -> None:
    """Tell the loop how one case of one variant went (a no-op outside the kernel pass). Under
    the loop a case logged as failed fails its variant; one logged as passed proves nothing by
    itself (it was decided beside kernel code): only `check`'s outputs, compared by the
    reference pass, make a variant pass."""
    if judging.MODE == judging.KERNEL:
        _log({"label": label, "case": case, "passed": bool(passed), **detail})


def _log(entry: dict) -> None:
    with open(judging.REQUEST["log"], "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def check(label: str, case: str, run, reference, *, rtol: float, atol: float,
          max_rel_err: float) -> None:
    """Run `run()`, which must poison its output (NaN), launch, and return the output, and
    compare it with the float64 `reference` within the tolerance; fail the test on a mismatch.
    Under the loop the kernel pass delivers the output and the reference pass the reference,
    and the reference pass compares them. A run() that builds with module_for's module and
    launches once as launch(inputs, out), returning that out, is also replayed by the timer
    outside pytest (perfloop.contract.judge_replay)."""
    tol = {"rtol": rtol, "atol": atol, "max_rel_err": max_rel_err}
    if judging.MODE == judging.REFERENCE:
        key = (label, case)
        if key not in judging.EXPECTED:
            judging.ORDER.append(key)
        judging.EXPECTED[key] = {"expected": plain(reference), "tolerance": tol}
        judge_replay.capture(label, case, run)  # (the stand-in runs no kernel code)
        return
    try:
        out = run()
        if getattr(out, "is_cuda", False):
            import torch

            torch.cuda.synchronize()
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if judging.MODE == judging.KERNEL:
            _deliver(label, case, None, error)
        raise
    if judging.MODE == judging.KERNEL:
        _deliver(label, case, out, None)
        return
    entry = outputs.compare(out, reference, {}, "", fixed=tol)
    assert entry["passed"], (f"{label} {case}: {entry['non_finite']} non-finite elements, "
                             f"relative error {entry['rel_err']:.3e} (limit {max_rel_err:.1e}), "
                             f"{entry['outside_tolerance']} elements outside atol={atol} rtol={rtol}")


def plain(x):
    """A case's output or reference as data on the CPU: tensors (detached copies), lists,
    tuples and numbers, what torch.save writes and torch.load(weights_only=True) reads."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        return x.detach().cpu().clone()
    if isinstance(x, (list, tuple)):
        return type(x)(plain(v) for v in x)
    return x


_delivered = [0]


def _deliver(label: str, case: str, out, error: str | None) -> None:
    """Write one case's output where the reference pass reads it."""
    import torch

    _delivered[0] += 1
    path = Path(judging.REQUEST["outputs"]) / f"{_delivered[0]:06d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save({"label": label, "case": case, "output": plain(out), "error": error}, tmp)
    tmp.replace(path)
    _log({"label": label, "case": case, "delivered": True, **({"error": error} if error else {})})
