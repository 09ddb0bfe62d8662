"""Per-shape dispatch: knob values that hold only for some buckets of inputs.

knobs.json may hold a "dispatch" table: {bucket: {knob: value, ...}}. A bucket is what the
kernel's own `bucket(inputs)` says (e.g. "bfloat16/n<=4096"), or, without one, the workload's
bucket of the inputs (perfloop.contract.workload: "bfloat16/hidden<=4096"); the knobs for a call are
the plain knobs with that bucket's values over them. Kernels route every launch through
`build`, so the judge, the timer and the kernel's public entry point dispatch the same way.

A launch in a bucket that no benchmark shape fell in runs as the nearest measured bucket (by
element size, then size), or, with the workload's buckets where kernel.toml's [workload] says
unseen = "tune", tunes once among the finalists (perfloop.contract.tuneonce) and says so.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Callable

from perfloop.contract import tuneonce, workload
from perfloop.core.dispatch_table import (  # noqa: F401  (kernels and judges read them here)
    KEY,
    as_itself,
    changed_buckets,
    config,
    declared_name,
    knobs_for,
    may_route,
    merged,
    patch_everywhere,
    set_everywhere,
    table,
)
from perfloop.core.dispatch_table import declared as declared_finalists
from perfloop.core.values import thaw


def build(knobs: dict, build_one: Callable[[dict], Callable],
          bucket: Callable | None = None, *, folder: Path | None = None,
          routes_itself: bool = False) -> Callable:
    """launch(inputs, out) that runs build_one(knobs_for(knobs, bucket(inputs))). Without a
    dispatch table it is build_one's own launch, so dispatch costs nothing until it is used,
    unless the workload's launches tune (unseen = "tune" with declared finalists): then a
    bucket no benchmark shape measured tunes among them from the start. A finalist's launch,
    built from knobs with an empty table (as_itself), never routes again.

    `bucket`: the kernel's own key; the table lists the measured buckets (an empty entry where
    the plain knobs hold), and a bucket not in it runs as the nearest one that is (by element
    size, then size: perfloop.contract.workload.distance).
    None: the workload's buckets, read from the kernel.toml beside build_one (or in
    `folder`), where a bucket without an entry runs as the nearest measured one (or is tuned
    once, where the workload says unseen = "tune"). Either launch's `routes` says where each
    unmeasured bucket went. `routes_itself`: build_one is a kernel's own build, which routes
    again unless its knobs say not to (as_itself)."""
    overrides = table(knobs)
    if bucket is None and may_route(knobs):
        where = Path(folder) if folder else _folder_of(build_one)
        wl = workload.load(where)
        # without a table, routing pays only where unmeasured buckets tune among finalists
        if overrides or (_tunes(wl, build_one) and wl.finalists):
            return _routed(knobs, build_one, where, wl, routes_itself)
    if not overrides:
        return build_one(knobs_for(knobs, ""))
    launches = {b: build_one(knobs_for(knobs, b)) for b in overrides}
    routes = Routes()

    def launch(inputs, out, *extra):
        b = bucket(inputs)
        if b not in launches:
            near = workload.nearest(b, overrides)
            routes[b] = (near, "nearest measured bucket")
            launches[b] = launches[near]
        return launches[b](inputs, out, *extra)

    launch.routes = routes
    return launch


def launcher(module, knobs: dict, folder: Path | None = None) -> Callable:
    """The launch a kernel module's knobs give, routed by bucket as the loop decided: the
    module's own build where it has a bucket() hook (it dispatches itself), else its build
    per bucket of the workload beside it (`folder`: the module's). What the timer, the
    warmers and the judge's helpers call, so that a kernel whose build ignores the dispatch
    table still runs each bucket's knobs."""
    if hasattr(module, "bucket"):
        return module.build(knobs)
    return build(knobs, module.build, folder=folder or Path(module.__file__).parent,
                 routes_itself=True)


def workload_bucket(file) -> Callable:
    """bucket(inputs) by the workload of the kernel.toml beside `file` (a kernel's __file__),
    the buckets build() routes by without a bucket: a kernel that sets `bucket =
    dispatch.workload_bucket(__file__)` lets the timer see them, so a change of one bucket's
    entry is timed only at the shapes that run it."""
    folder = Path(file).resolve().parent
    loaded: list = []

    def bucket(inputs) -> str:
        if not loaded:
            loaded.append(workload.load(folder))
        return workload.inputs_bucket(loaded[0], inputs)

    return bucket


def _tunes(wl, build_one: Callable) -> bool:
    """Whether launches in unmeasured buckets tune once (never for a kernel that writes its
    inputs: timing finalists on them would change them)."""
    return (wl is not None and wl.unseen == "tune"
            and not getattr(inspect.getmodule(build_one), "INPLACE", ()))


def _folder_of(build_one: Callable) -> Path:
    fn = inspect.unwrap(getattr(build_one, "func", build_one))
    return Path(inspect.getfile(fn)).resolve().parent


class Routes(dict):
    """{bucket: (the bucket whose knobs it runs, how chosen)} of one routed launch, filled as
    launches come (a kernel's public function may report them)."""


def _routed(knobs: dict, build_one: Callable, folder: Path, wl, routes_itself: bool
            ) -> Callable:
    if wl is None:
        raise ValueError(f"perfloop.dispatch: knobs.json has a dispatch table but {folder} has "
                         "no kernel.toml to read the buckets from; pass bucket= or folder=")
    overrides = table(knobs)
    places = wl.measured() + [b for b in overrides if b not in wl.measured()]
    launches: dict[str, Callable] = {}
    routes = Routes()
    tune = _tunes(wl, build_one)
    declared = declared_finalists(wl.finalists) if tune else {}

    def runs(target: str) -> Callable:
        if target not in launches:
            chosen = config(knobs, target, declared)
            launches[target] = build_one(as_itself(chosen) if routes_itself else chosen)
        return launches[target]

    def route(b: str, inputs, out, extra) -> str:
        if b in overrides or b in places or not places:
            return b
        if tune:
            finalists = _finalists(knobs, b, places, declared)
            if len(finalists) > 1:
                ident = tuneonce.identity(folder, knobs, b, list(finalists), inputs)
                best, how = tuneonce.choose(b, {f: runs(f) for f in finalists}, inputs, out,
                                            extra, ident)
                routes[b] = (best, how)
                return best
        near = workload.nearest(b, places)
        routes[b] = (near, "nearest measured bucket")
        return near

    def launch(inputs, out, *extra):
        b = workload.inputs_bucket(wl, inputs)
        target = routes[b][0] if b in routes else route(b, inputs, out, extra)
        return runs(target)(inputs, out, *extra)

    launch.routes = routes
    return launch


def _finalists(knobs: dict, bucket: str, places: list[str], declared: dict) -> list[str]:
    """The measured buckets whose knobs differ from each other's, nearest to `bucket` first
    (at most tuneonce.MAX_MEASURED), then the declared finalists that differ from them, at
    most tuneonce.MAX_FINALISTS in all."""
    out: list = []
    seen: list = []
    nearest = sorted(places, key=lambda p: workload.distance(bucket, p))
    for name in nearest + list(declared):
        if len(out) == tuneonce.MAX_MEASURED and name not in declared:
            continue
        # by JSON, not ==: 1.0 and True are not the 1 a kernel would be given
        text = json.dumps({k: thaw(v) for k, v in config(knobs, name, declared).items()},
                          sort_keys=True, default=str)
        if text not in seen:
            seen.append(text)
            out.append(name)
    return out[:tuneonce.MAX_FINALISTS]


def row_bucket(inputs) -> str:
    """A bucket for row-wise kernels: the first input's dtype and its row width rounded up to a
    power of two, e.g. "bfloat16/n<=4096"."""
    return f"{str(inputs[0].dtype).removeprefix('torch.')}/n<={workload.pow2(inputs[0].shape[-1])}"
