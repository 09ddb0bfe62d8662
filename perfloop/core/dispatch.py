"""Per-shape dispatch: knob values that hold only for some buckets of inputs.

knobs.json may hold a "dispatch" table: {bucket: {knob: value, ...}}. A bucket is what the
kernel's own `bucket(inputs)` says (e.g. "bfloat16/n4096": dtype and row-width class); the
knobs for a call are the plain knobs with that bucket's values over them. Kernels route every
launch through `build`, so the judge, the timer and the kernel's public entry point dispatch
the same way.
"""

from __future__ import annotations

from typing import Callable

from perfloop.core.values import freeze

KEY = "dispatch"


def table(knobs: dict) -> dict:
    return knobs.get(KEY) or {}


def knobs_for(knobs: dict, bucket: str) -> dict:
    """The plain knobs that hold for `bucket` (without the dispatch table itself)."""
    plain = {k: v for k, v in knobs.items() if k != KEY}
    plain.update({k: freeze(v) for k, v in table(knobs).get(bucket, {}).items()})
    return plain


def build(knobs: dict, build_one: Callable[[dict], Callable], bucket: Callable) -> Callable:
    """launch(inputs, out) that runs build_one(knobs_for(knobs, bucket(inputs))). Without a
    dispatch table it is build_one's own launch, so dispatch costs nothing until it is used."""
    overrides = table(knobs)
    if not overrides:
        return build_one(knobs_for(knobs, ""))
    default = build_one(knobs_for(knobs, ""))
    launches = {b: build_one(knobs_for(knobs, b)) for b in overrides}

    def launch(inputs, out):
        return launches.get(bucket(inputs), default)(inputs, out)

    return launch


def row_bucket(inputs) -> str:
    """A bucket for row-wise kernels: the first input's dtype and its row width rounded up to a
    power of two, e.g. "bfloat16/n4096"."""
    n = inputs[0].shape[-1]
    return f"{str(inputs[0].dtype).removeprefix('torch.')}/n{1 << max(n - 1, 0).bit_length()}"


def merged(current: dict, changes: dict) -> dict:
    """The dispatch table `current` with `changes` ({bucket: {knob: value}}) over it; buckets
    and knobs in sorted order, so equal tables have equal text."""
    out = {b: dict(v) for b, v in current.items()}
    for bucket, values in changes.items():
        out.setdefault(bucket, {}).update(values)
    return {b: dict(sorted(out[b].items())) for b in sorted(out)}


def changed_buckets(before: dict, after: dict) -> list[str]:
    return sorted(b for b in set(before) | set(after) if before.get(b) != after.get(b))
