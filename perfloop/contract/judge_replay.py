"""The judge's cases as data the trusted timer can replay (perfloop.referee.replay).

The kernel pass runs pytest beside kernel code, which can tell it is judged. So the reference
pass (no kernel code) records each case the judge's `run()` makes, and the timer replays it in
the variant's launcher, where no pytest runs. In the reference pass module_for's stand-in
builds a RecordingLauncher; `capture` calls run() (safe: the stand-in runs nothing, it only
remembers what it was called with). A case is replayable when run() launched exactly once, as
launch(inputs, out) with a launcher built for the variant being checked, and returned that
same `out`: a dense tensor, with inputs that are plain data (dense tensors, strings, numbers,
tuples and lists of them). Anything else is recorded as not replayable and never fails.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from perfloop.contract import judging
from perfloop.core.values import freeze

CAP_BYTES = 64 << 20   # inputs and expected values written, shared evenly by the variants
VERSION = 1
SCALARS = (str, int, float, bool, type(None))

_calls: list | None = None   # what the stand-in saw while capture() runs a run()


class NotData(Exception):
    """An input or output the case file cannot hold as plain data."""


class RecordingLauncher:
    """What the stand-in's build() returns: remembers each launch made while a run() is
    recorded (a launch outside one, e.g. a judge's own warm-up, is ignored)."""

    def __init__(self, folder: str, knobs):
        self.folder, self.knobs = str(folder), knobs

    def __call__(self, *args, **kwargs):
        if _calls is not None:
            _calls.append((self, args, kwargs, _copy_inputs(args[0]) if args else None))


def other_call(name: str) -> None:
    """The stand-in was asked for something other than build() and a launch: while a run()
    is recorded, that run() is not replayable."""
    if _calls is not None:
        _calls.append(("other", name))


def _is_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "stride")


def _dense(t, copy=None) -> bool:
    """Non-overlapping and dense: a copy of it (torch keeps the strides of such a tensor) has
    its strides, but for dimensions of size 1. A view with gaps or aliasing is not replayed."""
    copy = t.detach().clone() if copy is None else copy
    return all(a == b for n, a, b in zip(t.shape, t.stride(), copy.stride()) if n > 1)


def _copy_inputs(inputs):
    """The inputs as they were at the launch, on the CPU; None when they are not plain data."""
    try:
        return _data(inputs)
    except NotData:
        return None


def _data(x):
    if _is_tensor(x):
        if x.device.type not in ("cpu", "cuda"):
            raise NotData(f"a tensor on {x.device.type}")
        copy = x.detach().to("cpu", copy=True)
        if not _dense(x, copy):
            raise NotData("a tensor that is not dense (a view with gaps or aliasing)")
        return {"tensor": copy, "device": x.device.type}
    if isinstance(x, SCALARS):
        return {"value": x}
    if isinstance(x, (tuple, list)):
        return {"tuple" if isinstance(x, tuple) else "list": [_data(v) for v in x]}
    raise NotData(f"a {type(x).__name__}")


def _nbytes(x) -> int:
    if _is_tensor(x):
        return x.numel() * x.element_size()
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    return 0


# ---- the reference pass -----------------------------------------------------------------------
CASES: dict = {}         # (label, case) -> {"inputs", "out"}, the replayable ones
NOT_REPLAYABLE: dict = {}  # label -> {"count", "why"} (the first reason)


def capture(label: str, case: str, run) -> None:
    """Run the judge's run() with the stand-in and keep the case if it is replayable."""
    global _calls
    _calls, returned = [], None
    try:
        returned = run()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # (pytest's outcomes too): the judge's affair, not replay's
        returned = exc
    finally:
        calls, _calls = _calls, None
    key = (label, case)
    CASES.pop(key, None)
    try:
        CASES[key] = replayable(label, calls, returned)
    except NotData as exc:
        mine = NOT_REPLAYABLE.setdefault(label, {"count": 0, "why": str(exc)})
        mine["count"] += 1


def replayable(label: str, calls: list, returned) -> dict:
    """The case of one recorded run(), or NotData saying why it cannot be replayed."""
    if isinstance(returned, BaseException):
        raise NotData(f"run() raised {type(returned).__name__} without kernel code")
    launches = [c for c in calls if isinstance(c[0], RecordingLauncher)]
    if len(calls) != 1 or len(launches) != 1:
        raise NotData(f"run() made {len(launches)} launches and {len(calls) - len(launches)} "
                      "other calls of the kernel module, not exactly one launch")
    launcher, args, kwargs, inputs = launches[0]
    if len(args) != 2 or kwargs or args[1] is not returned:
        raise NotData("run() did not launch as launch(inputs, out) and return that out")
    if not _built_for(label, launcher):
        raise NotData("its launcher was built for other knobs or another folder than the "
                      "variant's")
    if inputs is None:
        raise NotData("its inputs are not plain data (dense tensors, strings, numbers)")
    out = returned
    if not _is_tensor(out) or not _dense(out) or out.device.type not in ("cpu", "cuda"):
        raise NotData("its output is not one dense tensor")
    return {"inputs": inputs, "out": {"shape": list(out.shape), "stride": list(out.stride()),
                                      "dtype": str(out.dtype).removeprefix("torch."),
                                      "device": out.device.type}}


def _built_for(label: str, launcher: RecordingLauncher) -> bool:
    for v in (judging.REQUEST or {}).get("variants", ()):
        if v["label"] == label:
            knobs = {k: freeze(x) for k, x in v["knobs"].items()}
            mine = {k: freeze(x) for k, x in dict(launcher.knobs).items()}
            return mine == knobs and Path(launcher.folder).resolve() == Path(v["folder"]).resolve()
    return False


def knobs_key(knobs: dict) -> str:
    """How a variant's knobs are compared between the judge's request and the timer's spec."""
    return json.dumps({k: _thaw(v) for k, v in knobs.items()}, sort_keys=True)


def _thaw(v):
    return [_thaw(x) for x in v] if isinstance(v, (tuple, list)) else v


def case_file(expected: dict, order: list, cap: int = CAP_BYTES) -> tuple[bytes, dict]:
    """The bytes of the case file (torch.save: plain data only) and its summary. Each variant
    gets an even share of `cap`; a case past its variant's share is left out and counted."""
    import torch

    variants = (judging.REQUEST or {}).get("variants", ())
    share = cap // max(1, len(variants))
    used: dict = {}
    cases: list = []
    skipped: dict = {}
    for key in order:
        if key not in CASES or key not in expected:
            continue
        label, case = key
        entry = {"label": label, "case": case, **CASES[key], **expected[key]}
        size = _nbytes(entry)
        if used.get(label, 0) + size > share:
            skipped[label] = skipped.get(label, 0) + 1
            continue
        used[label] = used.get(label, 0) + size
        cases.append(entry)
    body = {"version": VERSION, "cases": cases,
            "variants": {v["label"]: {"knobs": knobs_key(v["knobs"]), "folder": str(v["folder"])}
                         for v in variants}}
    buffer = io.BytesIO()
    torch.save(body, buffer)
    summary = {"cases": len(cases), "skipped": skipped, "bytes": sum(used.values()),
               "not_replayable": {k: dict(v) for k, v in NOT_REPLAYABLE.items()}}
    return buffer.getvalue(), summary
