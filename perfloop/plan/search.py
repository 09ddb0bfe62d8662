"""Experiments built from what a run has measured, beyond the catalog's one-knob steps:

  dispatch  right after an experiment whose values won on some buckets of shapes (the
            kernel's bucket(inputs) key) but not on all, keep each bucket's winner for that
            bucket only (perfloop.contract.dispatch);
  joint     before the run stops, the product of the values that were best or within
            [search] joint_margin of it in the one-knob steps, plus all measured values of
            knobs known to interact with them, at most [search] joint_max_configs configs.
  bucket-joint  after that, the same search for each other bucket of shapes, from the
            one-knob ratios at that bucket's benchmark shape, screened there and kept there
            only (its configs are dispatch tables): the wide rows' best config is not the
            headline's (on an H100 RMSNorm's differed in three knobs of four).

Pure functions over the record (perfloop.store.records.Experiment); perfloop.run.experiment
runs what they propose like any change.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from typing import Callable

from perfloop.core import dispatch_table as dispatch
from perfloop.contract import playbook
from perfloop.core.naming import (
    BUCKET_JOINT,
    DISPATCH,
    JOINT,
    SEARCH_IDS,
    show_patch,
)
from perfloop.contract.playbook import CLASSES, Optimization, freeze, thaw
from perfloop.core.stats import compare
from perfloop.core.vocab import INCUMBENT, Correctness, Kind, Outcome, Status
from perfloop.plan import decide
from perfloop.store.records import Experiment, ShapeSummary

MULTI = playbook.MULTI  # the knob of an optimization whose values are {knob: value} patches
IDS = SEARCH_IDS
ALL, TPE, RANKING = "all", "tpe", "product-ranking"   # what chose a joint search's configs


def optimization(opt_id: str, values: tuple) -> Optimization:
    """The catalog-like entry of a search experiment."""
    if opt_id == DISPATCH:
        return Optimization(DISPATCH, "per-shape dispatch", DISPATCH, dispatch.KEY, values,
                            CLASSES, dict.fromkeys(CLASSES, 0),
                            "keep a value only for the buckets of shapes where it won")
    if opt_id == BUCKET_JOINT:
        return Optimization(BUCKET_JOINT, "joint search at one bucket", DISPATCH, dispatch.KEY,
                            values, CLASSES, dict.fromkeys(CLASSES, 0),
                            "the values that mattered at one bucket's shape, measured "
                            "together there and kept there only")
    return Optimization(JOINT, "joint search", JOINT, MULTI, values, CLASSES,
                        dict.fromkeys(CLASSES, 0),
                        "the values that mattered in one-knob steps, measured together")


def first_pass(record: Experiment) -> dict[str, ShapeSummary]:
    """The pass in which every candidate of an experiment was timed against the incumbent
    ({} where nothing was timed)."""
    return record.timing.first_pass if record.timing else {}


def _single_knob(record: Experiment) -> bool:
    return (record.kind == Kind.PLAYBOOK and record.knob not in (None, dispatch.KEY, MULTI)
            and record.timing is not None and record.correctness == Correctness.PASS)


def _dispatchable(record: Experiment) -> bool:
    """A one-knob step or a joint search, judged PASS and timed."""
    return (record.kind == Kind.PLAYBOOK and record.knob not in (None, dispatch.KEY)
            and record.timing is not None and record.correctness == Correctness.PASS)


def bucket_winners(first_pass: dict[str, ShapeSummary], values: dict, in_force: str,
                   rules: decide.DecisionRules) -> dict[str, tuple[str, float]]:
    """{bucket: (label, worst gain)} for buckets where a measured value beats the one in force
    (label `in_force`) with a real gain at every benchmark shape of the bucket. `first_pass` is a
    summarized timing pass in which every label of `values` ({label: knob value}) was timed."""
    buckets: dict[str, list[str]] = {}
    for name, shape in first_pass.items():
        if shape.bucket is not None and not shape.held_back:
            buckets.setdefault(shape.bucket, []).append(name)
    out = {}
    for bucket, names in sorted(buckets.items()):
        best: tuple[str, float] | None = None
        for label in values:
            if label == in_force or any(label not in first_pass[n].variants for n in names):
                continue
            gains = []
            for name in names:
                shape = first_pass[name]
                c = compare(shape.variants[in_force].round_medians_ms,
                            shape.variants[label].round_medians_ms, noise=shape.noise)
                if not decide.real_gain(c, rules.min_gain):
                    break
                gains.append(c.gain)
            else:   # a real gain at every shape of the bucket
                if best is None or min(gains) > best[1]:
                    best = (label, min(gains))
        if best is not None:
            out[bucket] = best
    return out


def dispatch_changes(recs: list[Experiment], incumbent: str, knobs: dict,
                     rules: decide.DecisionRules, headline: str | None = None,
                     same=None) -> tuple[dict, str, str] | None:
    """(the new dispatch table, what it changes, the gains that chose it) from the last
    experiment, when some of its values won on some buckets against what is in force now.
    After a joint search a bucket's entry is every knob its winner ran with there that
    differs from what is in force there (a config good for wide rows is not the headline's)."""
    if not recs or not _dispatchable(recs[-1]):
        return None
    record = recs[-1]
    assert record.timing is not None   # (_dispatchable)
    kept = record.status == Status.KEEP
    if (record.commit if kept else record.incumbent_before) != incumbent:
        return None
    in_force = record.timing.chosen if kept else INCUMBENT
    assert in_force is not None   # (a kept experiment chose a candidate)
    values = record.timing.labels
    winners = bucket_winners(first_pass(record), values, in_force, rules)
    current = dispatch.table(knobs)
    knob = record.knob
    if knob == MULTI:
        before = knobs if not kept else next(
            ({k: freeze(v) for k, v in r.knobs.items()} for r in reversed(recs[:-1])
             if r.commit == record.incumbent_before), None)
        if before is None:
            return None
        where = headline_bucket(recs, headline) if headline else None
    changes, said, gains = {}, [], []
    for bucket, (label, gain) in winners.items():
        if knob == MULTI:
            ran = dispatch.knobs_for(applied_patch(record, before, values[label], where), bucket)
            now = dispatch.knobs_for(knobs, bucket)
            entry = {k: thaw(v) for k, v in ran.items() if freeze(now.get(k)) != freeze(v)}
            if not entry:
                continue
        else:
            if freeze(current.get(bucket, {}).get(knob)) == freeze(values[label]):
                continue
            entry = {knob: values[label]}
        after = {**knobs, dispatch.KEY: dispatch.merged(current, {bucket: entry})}
        if same and same(dispatch.knobs_for(knobs, bucket), dispatch.knobs_for(after, bucket)):
            continue  # builds what runs there now: a win on noise
        changes[bucket] = entry
        said.append(f"{show_patch(entry)} at {bucket}")
        gains.append(f"{100 * gain:.1f}% faster at {bucket}")
    if not changes:
        return None
    table = dispatch.merged(current, changes)
    return table, "; ".join(said), (f"{', '.join(gains)} in iteration {record.iteration}")






def _with_incumbent(recs: list[Experiment], knobs: dict):
    """(record, the incumbent's knobs when it ran) for each record: the baseline's knobs, then
    each kept experiment's; `knobs` before any record that holds them."""
    incumbent = None
    for record in recs:
        yield record, (incumbent if incumbent is not None else knobs)
        if record.status == Status.KEEP:
            incumbent = record.knobs


def _measured(recs: list[Experiment], shape: str) -> dict[str, dict]:
    """{knob: {value: ratio against the value in force before its step}} from the latest
    one-knob step of each knob (its first pass, at `shape`). The value in force at the shape
    is its bucket's entry's where that sets the knob (by the incumbent's knobs in the record);
    a step that ran its values in the plain knobs only ("every_bucket" absent: an earlier
    perfloop's) did not move the knob there, and says nothing about it."""
    bucket = headline_bucket(recs, shape)
    out: dict[str, dict] = {}
    for record, base in _with_incumbent(recs, {}):
        if not _single_knob(record) or "incumbent_value" not in record.extra:
            continue
        assert record.knob is not None and record.timing is not None   # (_single_knob)
        entry = dispatch.table(base).get(bucket or "", {})
        if record.knob in entry and not record.every_bucket:
            continue
        timed = first_pass(record).get(shape)
        if not timed:
            continue
        ratios = {freeze(entry.get(record.knob, record.extra["incumbent_value"])): 1.0}
        for label, value in record.timing.labels.items():
            if label in timed.vs_incumbent:   # (the value in force there stays at 1.0)
                ratios.setdefault(freeze(value), timed.vs_incumbent[label].ratio)
        out[record.knob] = ratios
    return out


def _cliffs(recs: list[Experiment]) -> dict[str, list]:
    """{knob: values dropped as cliffs (outcome slow)} in the latest one-knob step of each
    knob: a value that spills alone may run well beside a knob it interacts with (a large tile
    with num_ctas 2)."""
    out: dict[str, list] = {}
    for record in recs:
        if record.kind == Kind.PLAYBOOK and record.knob not in (None, dispatch.KEY, MULTI):
            out[record.knob] = [freeze(o["value"]) for o in (record.outcomes or {}).values()
                                if o.get("outcome") == Outcome.SLOW]
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


def applied_patch(record: Experiment, knobs: dict, patch: dict, bucket: str | None) -> dict:
    """What a recorded patch ran: a catalog entry's in every bucket ("every_bucket"), a
    joint search's where the headline runs."""
    if record.every_bucket:
        return dispatch.patch_everywhere(knobs, patch)
    return apply_joint(knobs, patch, bucket)


def measured_buckets(recs: list[Experiment], headline: str) -> list[str]:
    """The buckets of the benchmark's shapes, the headline's first: those a dispatch table
    lists (perfloop.core.dispatch_table.complete)."""
    head = headline_bucket(recs, headline)
    return ([head] if head is not None else []) + [b for b, _ in benchmark_buckets(recs, headline)]


def headline_bucket(recs: list[Experiment], headline: str) -> str | None:
    for record in reversed(recs):
        shape = record.timing.shapes.get(headline) if record.timing else None
        if shape is not None and shape.bucket is not None:
            return shape.bucket
    return None


@dataclass(frozen=True)
class JointPlan:
    """The configs a joint experiment measures, and what chose them: "all" (the space holds
    max_configs or fewer, every one measured), "tpe" (Optuna's TPE sampler, for a larger
    space) or "product-ranking" (a larger space without Optuna: the best by the product of
    the one-knob ratios)."""
    patches: list[dict]
    sampler: str = ALL
    space: int = 0            # the configs that move two knobs or more (cliffs, no-ops and
                              # what restrict() rules out filtered)
    told: int = 0             # measured configs the sampler was told (tpe)
    seed: int | None = None   # the sampler's seed (tpe)
    note: str = ""            # why the product ranking stood in, when it did
    filled: int = 0           # configs the product ranking added when the asks ran out (tpe)
    paired: int = 0           # configs moving one interacting pair only, taken before sampling
    shape: str | None = None  # a bucket joint search: the shape it was planned and screened at
    bucket: str | None = None # ... and that shape's bucket, the only one it changes

    def as_record(self) -> dict:
        out = {"name": self.sampler, "space": self.space, "chosen": len(self.patches)}
        if self.shape:
            out.update(shape=self.shape, bucket=self.bucket)
        if self.sampler == TPE:
            out.update(told=self.told, seed=self.seed, filled_by_ranking=self.filled)
        if self.paired:
            out["interacting_pairs"] = self.paired
        if self.note:
            out["note"] = self.note
        return out

    def said(self) -> str:
        if self.sampler == ALL:
            return f"all {self.space} configs"
        pairs = (f"the {self.paired} that move one pair of interacting knobs only, then "
                 if self.paired else "")
        if self.sampler == TPE:
            return (f"{len(self.patches)} of {self.space} configs: {pairs}those Optuna's TPE "
                    f"sampler chose, told the {self.told} configs the record measured at "
                    f"{self.shape or 'the headline'}")
        return (f"{len(self.patches)} of {self.space} configs: {pairs}the best by the product "
                f"of the one-knob ratios ({self.note})")


def joint_space(recs: list[Experiment], knobs: dict, headline: str, margin: float,
                max_configs: int, interactions: list, at: str | None = None) -> list[dict]:
    """joint_plan()'s patches."""
    return joint_plan(recs, knobs, headline, margin, max_configs, interactions, at).patches


def joint_plan(recs: list[Experiment], knobs: dict, headline: str, margin: float,
               max_configs: int, interactions: list, at: str | None = None,
               worth: Callable[[dict], bool] | None = None,
               pair_share: float = 2 / 3) -> JointPlan:
    """Patches {knob: value} over the incumbent's plain knobs that move two knobs or more from
    what is in force at the headline (its bucket's dispatch included), the most promising
    first (by the product of the one-knob ratios), at most max_configs; empty unless two knobs
    or more have a value besides the incumbent's worth measuring together. A value dropped as
    a cliff comes only beside a moved knob it interacts with, and that pair counts as no
    change in the ranking (one-knob ratios say nothing about a pair that interacts).

    A space larger than max_configs is sampled by Optuna's TPE sampler (tpe_choose), rebuilt
    from the record on every call; without Optuna, the product ranking cuts it.

    `at`: plan for another benchmark shape's bucket instead (a bucket joint search): its
    one-knob ratios, the knobs in force there, its measured configs. `worth(patch)`: whether a
    patch is worth measuring (by the kernel's knob space: it builds another kernel, and can
    work); the others are never counted, sampled or proposed. `pair_share`: the share of
    max_configs that configs moving one interacting pair only take first, in a larger space."""
    shape = at or headline
    measured = _measured(recs, shape)
    in_force = dispatch.knobs_for(knobs, headline_bucket(recs, shape) or "")
    cliffs = _cliffs(recs)
    space = _joint_space(measured, in_force, cliffs, margin, interactions)
    where = {"shape": at, "bucket": headline_bucket(recs, at)} if at else {}
    if len(space) < 2 or max_configs <= 0:
        return JointPlan([], **where)
    names = sorted(space)
    changes = _ranked_changes(space, names, measured, in_force, cliffs, interactions, worth)
    if len(changes) <= max_configs:
        return JointPlan(_plain(changes), ALL, len(changes), **where)
    return _sampled(recs, knobs, headline, at, space, names, in_force, changes, max_configs,
                    interactions, pair_share, where)


def _joint_space(measured: dict, in_force: dict, cliffs: dict, margin: float,
                 interactions: list) -> dict[str, list]:
    """{knob: values} worth combining: those within `margin` of the knob's best, every measured
    value of a knob that interacts with one in the space (and its cliffs), and the value in
    force; knobs with fewer than two values are left out."""
    space: dict[str, list] = {}
    for knob, ratios in measured.items():
        best = min(ratios.values())
        space[knob] = [v for v, r in ratios.items() if r <= best * (1 + margin)]
    for a, b in interactions:  # a knob that interacts with one in the space joins with all
        for x, y in ((a, b), (b, a)):  # its measured values, and so do x's cliffs
            if x in space and y in measured and (len(space[x]) > 1 or cliffs.get(x)):
                space[x] = list(dict.fromkeys([*space[x], *cliffs.get(x, [])]))
                space[y] = list(dict.fromkeys([*space.get(y, []), *measured[y]]))
    for knob in list(space):
        if knob not in in_force:
            del space[knob]
            continue
        space[knob] = list(dict.fromkeys([freeze(in_force[knob]), *space[knob]]))
        if len(space[knob]) < 2:
            del space[knob]
    return space


def _ranked_changes(space: dict, names: list, measured: dict, in_force: dict, cliffs: dict,
                    interactions: list, worth) -> list[dict]:
    """Every config moving two knobs or more, worth measuring, by the product of its knobs'
    one-knob ratios (a cliff only beside a knob it interacts with, which voids the product
    for that pair)."""
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
               if len(c) >= 2 and not unpaired_cliff(c)
               and (worth is None or worth({k: thaw(v) for k, v in c.items()}))]
    return sorted(changes, key=predicted)


def _plain(changes: list[dict]) -> list[dict]:
    return [{k: thaw(v) for k, v in c.items()} for c in changes]


def _sampled(recs: list[Experiment], knobs: dict, headline: str, at: str | None, space: dict,
             names: list, in_force: dict, changes: list[dict], max_configs: int,
             interactions: list, pair_share: float, where: dict) -> JointPlan:
    """A space larger than the cap: the configs measured before (at any headline time) are not
    proposed again. Two knobs that interact were each measured alone beside the other's value
    in force, so their one-knob ratios say nothing about them moved together (H100 RMSNorm,
    wide rows: occupancy 2 ran 1.7x slower at 2 rows per block and was the best value at 1
    row; TPE, told the former, left out every config with occupancy 2). The configs that move
    one such pair only are taken first (up to pair_share of the cap): each pair whole, the
    pair cut short spread over its values (_whole_pairs); the sampler picks among the rest."""
    told = measured_configs(recs, knobs, headline, at)
    seen = {_key(config, names) for config, _ in told}
    keyed = ((_key({**in_force, **c}, names), c) for c in changes)
    allowed = {key: c for key, c in keyed if key not in seen}   # in the product ranking's order
    pair_knobs = [set(pair) for pair in interactions]
    pair_keys = [key for key, c in allowed.items() if set(c) in pair_knobs]
    pairs = _whole_pairs(pair_keys, allowed, max(max_configs - (len(allowed) - len(pair_keys)),
                                                 int(pair_share * max_configs + 1e-9)))
    rest = {key: c for key, c in allowed.items() if key not in set(pairs)}
    want = min(max_configs - len(pairs), len(rest))
    seed = len(recs)
    # a config measured more than once (each one-knob step's incumbent) is told its latest ratio
    latest = list({_key(c, names): (c, r) for c, r in told if r is not None}.values())
    picked, note = (tpe_choose(names, space, latest, rest, want, seed) if want else
                    (None, "the interacting pairs fill the cap" if rest
                     else "nothing is left to sample beside the interacting pairs"))
    head = [allowed[key] for key in pairs]
    if picked is None:
        return JointPlan(_plain(head + list(rest.values())[:want]), RANKING, len(changes),
                         note=note, paired=len(pairs), **where)
    chosen = [rest[key] for key in picked]
    filled = [c for key, c in rest.items() if key not in set(picked)][:want - len(chosen)]
    return JointPlan(_plain(head + chosen + filled), TPE, len(changes), told=len(latest),
                     seed=seed, filled=len(filled), paired=len(pairs), **where)


def _whole_pairs(keys: list, configs: dict, cap: int) -> list:
    """At most `cap` of `keys` (configs that move one interacting pair, in the product
    ranking's order): each pair's configs whole, the pair whose best config ranks first
    first, and the first pair that does not fit whole spread over its values (_spread). A
    pair's best config can be a needle its one-knob ratios do not predict (H100 RMSNorm: 2 rows
    per block alone 1.78x slower than 8 rows; with occupancy 2 1.1x, with 8 3.9x, with 4 0.97x),
    so a pair is measured in full rather than each value once across all pairs."""
    groups: dict = {}
    for key in keys:
        groups.setdefault(frozenset(configs[key]), []).append(key)
    out: list = []
    for group in groups.values():
        if len(out) + len(group) > cap:
            return out + _spread(group, configs)[:cap - len(out)]
        out += group
    return out


def _spread(keys: list, configs: dict) -> list:
    """`keys` reordered so that each (knob, value) their configs move comes once before any
    comes twice: each next the first in order that moves the most values not yet taken."""
    left, out = list(keys), []
    taken: set = set()
    while left:
        new = [len(set(configs[k].items()) - taken) for k in left]
        if not max(new):
            taken = set()
            continue
        key = left.pop(new.index(max(new)))
        out.append(key)
        taken |= set(configs[key].items())
    return out


def _key(config: dict, names: list) -> tuple:
    """A config's identity over the knobs of the space (values frozen, then as JSON text)."""
    return tuple(_text(config.get(k)) for k in names)


def _text(value) -> str:
    return json.dumps(thaw(freeze(value)), sort_keys=True)


def measured_configs(recs: list[Experiment], knobs: dict, headline: str,
                     at: str | None = None) -> list[tuple[dict, float | None]]:
    """(the knobs in force at the headline, the headline time ratio against the incumbent of
    its experiment, or None where the record holds none) for every config the record measured
    there: each one-knob step's and dispatch's incumbent (1.0) and candidates, and each joint
    candidate (the first full pass's ratio, else the screening pass's for one screened out).
    The incumbent of each experiment is followed through the record (the baseline's knobs,
    then each kept experiment's); a record without a baseline starts from `knobs`. `at`: the
    same at another benchmark shape, in its bucket.

    The ratio is against the incumbent of the config's own experiment, not today's: it is the
    best comparable figure the record holds (experiments ran in different processes, and
    their absolute times are not comparable), and it ranks configs well as long as the
    incumbent moved little, which it does within one joint search's reach."""
    shape_name = at or headline
    routed = headline_bucket(recs, headline)        # where a joint patch was applied
    bucket = headline_bucket(recs, shape_name) or ""   # where its config is read
    out: list[tuple[dict, float | None]] = []
    for record, base in _with_incumbent(recs, knobs):
        knob = record.knob
        if record.kind != Kind.PLAYBOOK or knob is None:
            continue
        timed = first_pass(record).get(shape_name)
        shape = timed.vs_incumbent if timed else {}
        patches = {label: (o.get("value") if "value" in o else None)
                   for label, o in (record.outcomes or {}).items()}
        patches.update(record.timing.labels if record.timing else {})
        screening = record.screening or {}
        screened = screening.get("ratios", {}) if screening.get("shape") == shape_name else {}
        if knob != MULTI and (shape or screened):
            incumbent = (base if knob == dispatch.KEY
                         else {**base, knob: freeze(record.extra.get("incumbent_value"))})
            out.append((dispatch.knobs_for(incumbent, bucket), 1.0))
        for label, value in patches.items():
            if knob in (MULTI, dispatch.KEY) and not isinstance(value, dict):
                continue
            applied = (applied_patch(record, base, value, routed) if knob == MULTI
                       else {**base, knob: value} if knob == dispatch.KEY
                       else dispatch.set_everywhere(base, knob, freeze(value))
                       if record.every_bucket else {**base, knob: freeze(value)})
            ratio = shape[label].ratio if label in shape else screened.get(label)
            out.append((dispatch.knobs_for(applied, bucket), ratio))
    return out


def tpe_choose(names: list, space: dict, told: list, allowed: dict, n: int,
               seed: int) -> tuple[list | None, str]:
    """Up to n keys of `allowed` (configs by _key) that Optuna's TPE sampler asks for, told
    every (config, headline ratio) of `told` as a completed trial (minimized); (None, why)
    when Optuna cannot be imported. The study lives only here: rebuilt from the record on
    every call, with a seed from it, so a resumed run and `perfloop next` get the same
    configs. Asks that are not allowed (one knob moved, measured before, an unpaired cliff,
    a value outside the space, already chosen) stay unanswered; the constant liar makes
    later asks move away from them. At most 20 asks per config wanted."""
    try:
        import optuna
    except ImportError as exc:
        return None, f"Optuna could not be imported: {exc}"
    import warnings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    choices = {k: list(dict.fromkeys([*(_text(v) for v in space[k]),
                                      *(_text(c.get(k)) for c, _ in told)])) for k in names}
    dists = {k: optuna.distributions.CategoricalDistribution(choices[k]) for k in names}
    with warnings.catch_warnings():  # multivariate and the constant liar are experimental
        warnings.simplefilter("ignore")
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
        study = optuna.create_study(direction="minimize", sampler=sampler)
        for config, ratio in told:
            study.add_trial(optuna.trial.create_trial(
                params={k: _text(config.get(k)) for k in names}, distributions=dists,
                value=float(ratio)))
        picked: list = []
        for _ in range(20 * n):  # (n is at most the configs allowed)
            trial = study.ask(dists)
            key = tuple(trial.params[k] for k in names)
            if key in allowed and key not in picked:
                picked.append(key)
                if len(picked) == n:
                    break
    return picked, ""


def joint_tried_since_keep(recs: list[Experiment]) -> bool:
    """Whether a joint search ran since the last kept change (a bucket joint search's keep
    does not count: it changes no bucket the headline's joint search measures). A sampled
    joint search (TPE) that was itself kept counts as not tried: sampling pays there, so the
    next one samples again, told everything measured so far."""
    for record in reversed(recs):
        if record.optimization == JOINT:
            return not (record.status == Status.KEEP
                        and (record.sampler or {}).get("name") == TPE)
        if record.status == Status.KEEP and record.optimization != BUCKET_JOINT:
            return False
    return False


def bucket_joint_tried(recs: list[Experiment], bucket: str) -> bool:
    """Whether a joint search at `bucket` ran since the last kept change other than a bucket
    joint search (each bucket's is measured once, unless the catalog moves the kernel on)."""
    for record in reversed(recs):
        if (record.optimization == BUCKET_JOINT
                and (record.sampler or {}).get("bucket") == bucket):
            return True
        if record.status == Status.KEEP and record.optimization != BUCKET_JOINT:
            return False
    return False


def benchmark_buckets(recs: list[Experiment], headline: str) -> list[tuple[str, str]]:
    """(bucket, its first benchmark shape) for each bucket other than the headline's, in the
    order the record first timed them (the baseline times every shape, in the kernel's order)."""
    head = headline_bucket(recs, headline)
    out: dict[str, str] = {}
    for record in recs:
        for name, shape in (record.timing.shapes if record.timing else {}).items():
            if shape.bucket is not None and shape.bucket != head and not shape.held_back:
                out.setdefault(shape.bucket, name)
    return list(out.items())


def bucket_joint_plans(recs: list[Experiment], knobs: dict, headline: str, margin: float,
                       max_configs: int, interactions: list,
                       worth: Callable[[dict, str], bool] | None = None,
                       pair_share: float = 2 / 3) -> list[tuple[list[dict], JointPlan]]:
    """For each bucket not tried since the last kept change: (the dispatch tables to measure,
    each the kept table with one joint patch in that bucket's entry; the plan), planned from
    the one-knob ratios at the bucket's benchmark shape. `worth(table, bucket)`: whether a
    table is worth measuring (joint_plan's `worth`)."""
    out, current = [], dispatch.table(knobs)
    for bucket, shape in benchmark_buckets(recs, headline):
        if bucket_joint_tried(recs, bucket):
            continue

        def table_of(patch: dict, bucket=bucket) -> dict:
            return dispatch.merged(current, {bucket: patch})

        plan = joint_plan(recs, knobs, headline, margin, max_configs, interactions, at=shape,
                          # (the ignore: mypy cannot infer a lambda whose argument has a default)
                          worth=worth and (lambda p, b=bucket: worth(table_of(p), b)),  # type: ignore[misc]
                          pair_share=pair_share)
        if plan.patches:
            out.append(([table_of(p) for p in plan.patches], plan))
    return out






def by_headroom(joints: list, shares: dict[str, float] | None, headline: str) -> list:
    """Joint search suggestions: the headline's first, then the buckets', the one at the shape
    whose incumbent runs at the smallest share of its physical floor first (as offered when no
    floor is known), since the time budget may leave room for one only. The headline decides
    keep or revert, and its joint search moves the plain knobs that every bucket without its
    own entry runs, which voids the bucket searches done before it (they are offered again);
    a share of the floor also ranks a shape whose floor nothing reaches first for ever (H100
    RMSNorm's fp32 tail: torch.compile at 0.68 of it), so it cannot put a bucket ahead."""
    head = [sg for sg in joints if not (sg.sampler or {}).get("shape")]
    rest = [sg for sg in joints if (sg.sampler or {}).get("shape")]
    if shares:
        rest.sort(key=lambda sg: shares.get(sg.sampler["shape"], 1.0))
    return head + rest
