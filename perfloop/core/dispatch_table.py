"""knobs.json's "dispatch" table, {bucket: {knob: value, ...}}: knob values that hold only for
some buckets of inputs, as plain functions over it (perfloop.contract.dispatch builds the launch
that routes by it; this module needs nothing else, so every layer may read tables). An empty
entry marks a measured bucket that runs the plain knobs: unmeasured buckets run as the nearest
bucket in the table."""

from __future__ import annotations

import json
import operator

from perfloop.core.values import freeze, thaw

KEY = "dispatch"


def table(knobs: dict) -> dict:
    return knobs.get(KEY) or {}


def may_route(knobs: dict) -> bool:
    """Whether a launch of these knobs may run other knobs in some bucket: with a table, or
    with no table key at all (where the workload says unseen = "tune" and declares
    finalists, a bucket no benchmark shape measured tunes among them). An explicitly empty
    table is a config run as itself everywhere: a finalist's (config)."""
    return bool(table(knobs)) or KEY not in knobs


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
    """The buckets whose entries differ (an empty entry is no entry: both run the plain
    knobs)."""
    return sorted(b for b in set(before) | set(after)
                  if (before.get(b) or {}) != (after.get(b) or {}))


def complete(table: dict, measured) -> dict:
    """`table` with an entry, empty where it has none, for every measured bucket: a launch in a
    bucket not in the table runs as the nearest one in it (perfloop.contract.dispatch), so the
    table's buckets must be the measured ones, those that run the plain knobs too. An empty
    table stays empty (every launch runs the plain knobs)."""
    if not table:
        return table
    return merged(table, {b: {} for b in measured if b not in table})


def moves_anywhere(knobs: dict, changed: dict, same=operator.eq) -> bool:
    """Whether `changed` runs other knobs than `knobs` in some bucket of its table (the plain
    knobs' included), by `same` (a kernel's canonical equality: perfloop.contract.knobspace)."""
    return any(not same(knobs_for(knobs, b), knobs_for(changed, b))
               for b in ("", *table(changed)))


def set_everywhere(knobs: dict, knob: str, value) -> dict:
    """The knobs with `knob` at `value` in the plain knobs and in every entry that sets it: a
    one-knob step then runs its value in every bucket, so a bucket whose entry an earlier run
    wrote is measured again, not kept for ever (H100 softmax: 64 rows per block at 512
    columns, 0.58 of torch.compile, which no later step could reach)."""
    out = {**knobs, knob: value}
    entries = table(knobs)
    if any(knob in e for e in entries.values()):
        out[KEY] = {b: ({**e, knob: thaw(value)} if knob in e else dict(e))
                    for b, e in entries.items()}
    return out


def patch_everywhere(knobs: dict, patch: dict) -> dict:
    """The knobs with each of a catalog entry's knobs set everywhere (set_everywhere): an
    entry that moves several knobs runs in every bucket as a one-knob step does."""
    for knob, value in patch.items():   # (frozen: a patch read back from state.json has lists)
        knobs = set_everywhere(knobs, knob, freeze(value))
    return knobs


def declared_name(patch: tuple) -> str:
    """How a finalist kernel.toml's [workload] declares ((knob, value) pairs) is named in
    routes, warnings, the tuning cache and the judge's labels: by its values, exactly, so no
    two differ only in the spelling of a value and a change of them is another finalist."""
    return "finalist " + json.dumps({k: thaw(v) for k, v in patch}, sort_keys=True)


def declared(patches) -> dict:
    """{name: patch} of a workload's declared finalists."""
    return {declared_name(p): p for p in patches}


def config(knobs: dict, target: str, finalists: dict) -> dict:
    """The knobs a finalist runs: a measured bucket's, or a declared patch over the plain
    knobs (without the table; as_itself for a build that would route them)."""
    if target in finalists:
        return {**knobs_for(knobs, ""), **dict(finalists[target])}
    return knobs_for(knobs, target)


def as_itself(knobs: dict) -> dict:
    """The knobs with an explicitly empty table: a kernel's build that routes (through
    perfloop.contract.dispatch) runs them as they are in every bucket, never tuning again."""
    return {**knobs, KEY: {}}
