"""How experiments and knob settings are named where people read them: the table's optimization
column, commit messages, reports. One place, so a row, its commit and its report line agree."""

from __future__ import annotations

import json

from perfloop.core import dispatch_table as dispatch
from perfloop.core.values import freeze, thaw
from perfloop.core.vocab import MULTI

# the experiments built from the record rather than the catalog (perfloop.plan.search)
DISPATCH, JOINT, BUCKET_JOINT = "dispatch", "joint", "bucket-joint"
SEARCH_IDS = (DISPATCH, JOINT, BUCKET_JOINT)


def show_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return "x".join(str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def read_value(text: str):
    """A knob value as a person types it: JSON (8, true, [1, 2048]), a list as show_value
    writes it (1x2048, 128x0; None or null for an empty column), or else the bare word."""
    try:
        return freeze(json.loads(text))
    except json.JSONDecodeError:
        pass
    parts = text.split("x")
    if len(parts) > 1:
        try:
            return tuple(_column(part) for part in parts)
        except ValueError:
            pass
    return text


def _column(text: str):
    """One number of a list written 1x2048 (a bare word is no column: ValueError)."""
    if text == "None":
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(text) from None
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(text)
    return value


def show_patch(patch: dict) -> str:
    """knob=value, ... in the knobs' order (as a record, whose keys are sorted, gives them)."""
    return ", ".join(f"{k}={show_value(v)}" for k, v in sorted(patch.items()))


def setting(knob: str, value) -> str:
    """knob=value, or for a patch of several knobs (joint search) each of them."""
    if knob == MULTI:
        return show_patch(value)
    return f"{knob}={show_value(value)}"


def bucket_entry_change(before: dict | None, after: dict) -> tuple[str, dict]:
    """(the bucket, the knobs whose values differ in its entry) between two dispatch tables
    that differ in one bucket: what a bucket joint search's row says it kept or tried."""
    before = before or {}
    bucket = next(iter(dispatch.changed_buckets(before, after)), "")
    old, new = before.get(bucket, {}), after.get(bucket, {})
    return bucket, {k: v for k, v in new.items() if k not in old or freeze(old[k]) != freeze(v)}


def bucket_joint_row(before: dict | None, after: dict) -> str:
    """What a bucket joint search's row says: the bucket and the knobs its config moved."""
    bucket, patch = bucket_entry_change(thaw(before), thaw(after))
    return f"joint at {bucket}: {show_patch(patch)}"


def experiment(record) -> str:
    """An experiment (perfloop.store.records.Experiment) as its table row names it."""
    if record.kind == "baseline":
        return "baseline"
    if record.kind == "agent":
        return record.describe
    if record.optimization == DISPATCH:
        dropped = record.decision.get("dropped_buckets")
        return f"dispatch: {dispatch_kept(record.describe, dropped)}"
    if record.optimization == BUCKET_JOINT:
        return bucket_joint_row(record.extra.get("incumbent_value"), record.value)
    return f"{record.optimization}: {setting(record.knob, record.value)}"


def dispatch_kept(describe: str, dropped) -> str:
    """A dispatch change's description ("X at bucket; ..."), without the buckets it was not
    kept in, which it names."""
    if not dropped:
        return describe
    kept = [part for part in describe.split("; ")
            if not any(part.endswith(f" at {bucket}") for bucket in dropped)]
    return f"{'; '.join(kept)} (not at {', '.join(dropped)})"
