"""knobs.json's "dispatch" table, {bucket: {knob: value, ...}}: knob values that hold only for
some buckets of inputs, as plain functions over it (perfloop.core.dispatch builds the launch
that routes by it; this module needs nothing else, so every layer may read tables)."""

from __future__ import annotations

from perfloop.core.values import freeze

KEY = "dispatch"


def table(knobs: dict) -> dict:
    return knobs.get(KEY) or {}


def knobs_for(knobs: dict, bucket: str) -> dict:
    """The plain knobs that hold for `bucket` (without the dispatch table itself)."""
    plain = {k: v for k, v in knobs.items() if k != KEY}
    plain.update({k: freeze(v) for k, v in table(knobs).get(bucket, {}).items()})
    return plain


def merged(current: dict, changes: dict) -> dict:
    """The dispatch table `current` with `changes` ({bucket: {knob: value}}) over it; buckets
    and knobs in sorted order, so equal tables have equal text."""
    out = {b: dict(v) for b, v in current.items()}
    for bucket, values in changes.items():
        out.setdefault(bucket, {}).update(values)
    return {b: dict(sorted(out[b].items())) for b in sorted(out)}


def changed_buckets(before: dict, after: dict) -> list[str]:
    return sorted(b for b in set(before) | set(after) if before.get(b) != after.get(b))
