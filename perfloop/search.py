"""Experiments built from what a run has measured, beyond the catalog's one-knob steps:

  dispatch  right after an experiment whose values won on some buckets of shapes (the
            kernel's bucket(inputs) key) but not on all, keep each bucket's winner for that
            bucket only (perfloop.dispatch);
  joint     before the run stops, the product of the values that were best or within
            [search] joint_margin of it in the one-knob steps, plus all measured values of
            knobs known to interact with them, at most [search] joint_max_configs configs.

Pure functions over the record's lines; iteration.py runs what they propose like any change.
"""

from __future__ import annotations

import itertools
import math

from perfloop import decide, dispatch
from perfloop.playbook import CLASSES, Optimization, freeze, thaw

DISPATCH, JOINT = "dispatch", "joint"
MULTI = "*"        # the knob of an optimization whose values are {knob: value} patches
INCUMBENT = "incumbent"
IDS = (DISPATCH, JOINT)


def optimization(opt_id: str, values: tuple) -> Optimization:
    """The catalog-like entry of a search experiment."""
    if opt_id == DISPATCH:
        return Optimization(DISPATCH, "per-shape dispatch", DISPATCH, dispatch.KEY, values,
                            CLASSES, dict.fromkeys(CLASSES, 0),
                            "keep a value only for the buckets of shapes where it won")
    return Optimization(JOINT, "joint search", JOINT, MULTI, values, CLASSES,
                        dict.fromkeys(CLASSES, 0),
                        "the values that mattered in one-knob steps, measured together")


def first_pass(record: dict) -> dict | None:
    """The pass in which every candidate of an experiment was timed against the incumbent."""
    timing = record.get("timing") or {}
    return timing.get("selection") or timing.get("shapes")


def _single_knob(record: dict) -> bool:
    return (record["kind"] == "playbook" and record.get("knob") not in (None, dispatch.KEY, MULTI)
            and record.get("timing") is not None and record.get("correctness") == "PASS")


def dispatch_changes(recs: list[dict], incumbent: str, knobs: dict,
                     rules: decide.DecisionRules) -> tuple[dict, str, str] | None:
    """(the new dispatch table, what it changes, the gains that chose it) from the last
    experiment, when some of its values won on some buckets against what is in force now."""
    if not recs or not _single_knob(recs[-1]):
        return None
    record = recs[-1]
    kept = record["status"] == decide.KEEP
    if (record["commit"] if kept else record["incumbent_before"]) != incumbent:
        return None
    in_force = record["timing"]["chosen"] if kept else INCUMBENT
    values = record["timing"]["labels"]
    winners = decide.bucket_winners(first_pass(record), values, in_force, rules)
    current = dispatch.table(knobs)
    knob = record["knob"]
    changes, said, gains = {}, [], []
    for bucket, (label, gain) in winners.items():
        value = values[label]
        if freeze(current.get(bucket, {}).get(knob)) == freeze(value):
            continue
        changes[bucket] = {knob: value}
        said.append(f"{knob}={show_value(value)} at {bucket}")
        gains.append(f"{100 * gain:.1f}% faster at {bucket}")
    if not changes:
        return None
    table = dispatch.merged(current, changes)
    return table, "; ".join(said), (f"{', '.join(gains)} in iteration {record['iteration']}")


def show_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return "x".join(str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def show_patch(patch: dict) -> str:
    return ", ".join(f"{k}={show_value(v)}" for k, v in patch.items())


def _measured(recs: list[dict], headline: str) -> dict[str, dict]:
    """{knob: {value: ratio against the value in force before its step}} from the latest
    one-knob step of each knob (its first pass, at the headline)."""
    out: dict[str, dict] = {}
    for record in recs:
        if not _single_knob(record) or "incumbent_value" not in record:
            continue
        shape = (first_pass(record) or {}).get(headline)
        if not shape:
            continue
        ratios = {freeze(record["incumbent_value"]): 1.0}
        for label, value in record["timing"]["labels"].items():
            if label in shape["vs_incumbent"]:
                ratios[freeze(value)] = shape["vs_incumbent"][label]["ratio"]
        out[record["knob"]] = ratios
    return out


def _cliffs(recs: list[dict]) -> dict[str, list]:
    """{knob: values dropped as cliffs (outcome slow)} in the latest one-knob step of each
    knob: a value that spills alone may run well beside a knob it interacts with (a large tile
    with num_ctas 2)."""
    out: dict[str, list] = {}
    for record in recs:
        if record["kind"] == "playbook" and record.get("knob") not in (None, dispatch.KEY, MULTI):
            out[record["knob"]] = [freeze(o["value"]) for o in (record.get("outcomes") or {}).values()
                                   if o.get("outcome") == "slow"]
    return out


def apply_joint(knobs: dict, patch: dict, bucket: str | None) -> dict:
    """The knobs with a joint patch in force at the headline: a knob that the headline's bucket
    dispatches is patched in that bucket's entry (the plain value would not reach it), any
    other in the plain knobs."""
    table = dispatch.table(knobs)
    entry = table.get(bucket or "", {})
    plain = {k: freeze(v) for k, v in patch.items() if k not in entry}
    routed = {k: thaw(v) for k, v in patch.items() if k in entry}
    out = {**knobs, **plain}
    if routed:
        out[dispatch.KEY] = dispatch.merged(table, {bucket: routed})
    return out


def headline_bucket(recs: list[dict], headline: str) -> str | None:
    for record in reversed(recs):
        shape = ((record.get("timing") or {}).get("shapes") or {}).get(headline) or {}
        if shape.get("bucket") is not None:
            return shape["bucket"]
    return None


def joint_space(recs: list[dict], knobs: dict, headline: str, margin: float,
                max_configs: int, interactions: list) -> list[dict]:
    """Patches {knob: value} over the incumbent's plain knobs that move two knobs or more from
    what is in force at the headline (its bucket's dispatch included), the most promising
    first (by the product of the one-knob ratios), at most max_configs; empty unless two knobs
    or more have a value besides the incumbent's worth measuring together. A value dropped as
    a cliff comes only beside a moved knob it interacts with, and that pair counts as no
    change in the ranking (one-knob ratios say nothing about a pair that interacts)."""
    measured = _measured(recs, headline)
    in_force = dispatch.knobs_for(knobs, headline_bucket(recs, headline) or "")
    space: dict[str, list] = {}
    for knob, ratios in measured.items():
        best = min(ratios.values())
        near = [v for v, r in ratios.items() if r <= best * (1 + margin)]
        space[knob] = near
    cliffs = _cliffs(recs)
    for a, b in interactions:  # a knob that interacts with one in the space joins with all
        for x, y in ((a, b), (b, a)):  # its measured values, and so do x's cliffs
            if x in space and y in measured and (len(space[x]) > 1 or cliffs.get(x)):
                space[x] = list(dict.fromkeys([*space[x], *cliffs.get(x, [])]))
                space[y] = list(dict.fromkeys([*space.get(y, []), *measured[y]]))
    for knob in list(space):
        if knob not in in_force:
            del space[knob]
            continue
        current = freeze(in_force[knob])
        space[knob] = list(dict.fromkeys([current, *space[knob]]))
        if len(space[knob]) < 2:
            del space[knob]
    if len(space) < 2:
        return []
    names = sorted(space)
    partners = {n: {y for a, b in interactions for x, y in ((a, b), (b, a)) if x == n}
                for n in names}

    def moved(combo) -> dict:
        return {k: v for k, v in zip(names, combo) if v != freeze(in_force[k])}

    def unpaired_cliff(change: dict) -> bool:
        return any(v in cliffs.get(k, ()) and not partners[k] & set(change)
                   for k, v in change.items())

    def predicted(change: dict) -> float:
        paired = {p for k, v in change.items() if v in cliffs.get(k, ())
                  for p in partners[k] & set(change)}
        return math.prod(measured[k].get(v, 1.0) / measured[k].get(freeze(in_force[k]), 1.0)
                         for k, v in change.items() if k not in paired)

    # one knob moved alone was measured by its own step: only combinations are new
    changes = [c for c in map(moved, itertools.product(*(space[k] for k in names)))
               if len(c) >= 2 and not unpaired_cliff(c)]
    changes.sort(key=predicted)
    return [{k: thaw(v) for k, v in c.items()} for c in changes[:max_configs]]


def joint_tried_since_keep(recs: list[dict]) -> bool:
    for record in reversed(recs):
        if record["optimization"] == JOINT:
            return True
        if record["status"] == decide.KEEP:
            return False
    return False
