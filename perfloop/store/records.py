"""sandbox/<kernel>/experiments.jsonl: the full, machine-readable record of every experiment,
and the one-process confirmations of a run's result (kind "confirmation", no table row).

One JSON object per line. The file is rewritten atomically on every append, so a kill at any
moment leaves either the old file or the new one, never a torn line; any line that does not
parse, or lacks what the commands read, is therefore corruption, and is reported rather than
guessed at.

Each line is read into an Experiment or a Confirmation, and written from one, by the one pair
from_dict / to_dict: the fields the commands read are typed and checked, down to the timing
inside a line (TimingDetail: each shape's ShapeSummary, each variant's VariantStats and its
comparison with the incumbent); every other key (the timing's raw samples, the judge's cases,
what a later perfloop adds) is kept in `extra` untouched, so a line read and written back is
the same line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from perfloop.core.atomic import dumps, write_text
from perfloop.core.errors import CorruptRecord
from perfloop.core.stats import Comparison
from perfloop.core.vocab import Correctness, Kind, Status
from perfloop.store import preflight

SCHEMA = 1
CONFIRMATION = Kind.CONFIRMATION
NUMBER = (int, float)
ANY = (object,)


class _Record:
    """from_dict / to_dict over a dataclass whose fields say their JSON types in metadata:
    `types` (a tuple), `enum` (a StrEnum the value must belong to), `required`, `nulls`
    (whether None is written, default NULLS_WRITTEN), `nan` (a number written as null, as
    perfloop.core.atomic.dumps writes a NaN or an infinity, reads as NaN), and, for a value
    that is itself a record, `record` (its class) or `each` (a JSON object of them, by name)."""

    # an optional field that is None: written as null (every experiment line has always
    # held every field), or left out (a confirmation's fields that only some lines have)
    NULLS_WRITTEN: ClassVar[bool]

    @classmethod
    def from_dict(cls, raw: Any, at: str = ""):
        """The record of one parsed object; CorruptRecord saying what is wrong, in a few words
        (`at`: where a nested record lies in its line, e.g. "timing.shapes.head.")."""
        if not isinstance(raw, dict):
            raise CorruptRecord(f"{at[:-1]} is not a JSON object" if at else "not a JSON object")
        typed, extra = {}, dict(raw)
        for f in fields(cls):
            if f.name == "extra":
                continue
            meta, name = f.metadata, at + f.name
            if f.name not in raw:
                if meta["required"]:
                    raise CorruptRecord(f"missing {name}")
                continue
            value = raw[f.name]
            if value is None and meta["nan"]:
                value = math.nan
            elif value is None and not meta["required"]:
                if not cls._nulls(meta):
                    continue  # (stays in extra: written back as it was)
            elif not isinstance(value, meta["types"]) or (  # (JSON's true is no number)
                    isinstance(value, bool) and int in meta["types"]):
                raise CorruptRecord(f"{name} has the wrong type")
            elif meta["enum"]:
                try:
                    value = meta["enum"](value)
                except ValueError:
                    known = ", ".join(repr(m.value) for m in meta["enum"])
                    raise CorruptRecord(f"{name} '{value}' is not one of {known}") from None
            elif meta["record"]:
                value = meta["record"].from_dict(value, name + ".")
            elif meta["each"]:
                value = {k: meta["each"].from_dict(v, f"{name}.{k}.") for k, v in value.items()}
            typed[f.name] = value
            del extra[f.name]
        record = cls(**typed, extra=extra)
        record._check()
        return record

    @classmethod
    def _nulls(cls, meta) -> bool:
        return cls.NULLS_WRITTEN if meta["nulls"] is None else meta["nulls"]

    def _check(self) -> None:
        """What the field types cannot say."""

    def to_dict(self) -> dict:
        """The object it was read from: every key, each typed field as it is now."""
        out = dict(self.extra)
        for f in fields(self):
            value, meta = getattr(self, f.name), f.metadata
            if f.name == "extra" or value is None and not (meta["required"]
                                                          or self._nulls(meta)):
                continue
            if value is not None and meta["enum"]:
                value = value.value
            elif value is not None and meta["record"]:
                value = value.to_dict()
            elif value is not None and meta["each"]:
                value = {k: v.to_dict() for k, v in value.items()}
            out[f.name] = value
        return out


def _f(*types, enum=None, required=True, default=None, nulls=None, nan=False, record=None,
       each=None):
    meta = {"types": types, "enum": enum, "required": required, "nulls": nulls, "nan": nan,
            "record": record, "each": each}
    return field(metadata=meta) if required else field(default=default, metadata=meta)


def _number(required=True):
    """A float that the writer may have written as null (a NaN or an infinity)."""
    return _f(*NUMBER, required=required, nan=True)


# ---- a timing pass, as the record holds it (perfloop.measure.phases.summarize_pass) --------
@dataclass(frozen=True, kw_only=True)
class VariantStats(_Record):
    """One variant's times at one shape in one timing pass; its raw samples, host times and
    what a later perfloop adds stay in `extra`."""

    NULLS_WRITTEN = False

    median_ms: float = _number()
    ci_low_ms: float = _number()
    ci_high_ms: float = _number()
    n: int = _f(int)
    round_medians_ms: list = _f(list)   # one per round: what paired comparisons pair
    share_of_floor: float | None = _f(*NUMBER, required=False)   # where a floor is known
    gbps: float | None = _f(*NUMBER, required=False)
    tflops: float | None = _f(*NUMBER, required=False)   # a kernel counting tensor FLOPs
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Versus(_Record):
    """A variant against the incumbent at one shape: perfloop.core.stats.Comparison's fields."""

    NULLS_WRITTEN = False

    ratio: float = _number()
    ci_low: float = _number()
    ci_high: float = _number()
    noise: float | None = _f(*NUMBER, required=False, nan=True)
    extra: dict = field(default_factory=dict)

    @property
    def comparison(self) -> Comparison:
        return Comparison(self.ratio, self.ci_low, self.ci_high,
                          0.0 if self.noise is None else self.noise)


@dataclass(frozen=True, kw_only=True)
class ShapeSummary(_Record):
    """One shape in one timing pass: each variant's statistics and its comparison with the
    incumbent, the A/A noise, the bucket whose knobs ran there and the physical floor; its
    bytes and FLOPs (perfloop.contract.traffic.from_record reads them) stay in `extra`."""

    NULLS_WRITTEN = False

    variants: dict[str, VariantStats] = _f(dict, each=VariantStats)
    vs_incumbent: dict[str, Versus] = _f(dict, each=Versus)   # every label but the incumbent
    noise: float = _number()            # what the incumbent timed twice differs by
    bucket: str | None = _f(str, type(None))
    held_back: bool = _f(bool)          # guards a keep; never chooses
    floor_ms: float | None = _f(*NUMBER, type(None))   # None: no floor known (a CPU clock)
    tuned: bool | None = _f(bool, required=False)     # runs whichever finalist is fastest
    routed_from: str | None = _f(str, required=False)  # its own bucket, where it runs as another
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TimingDetail(_Record):
    """An experiment's timing as recorded: the deciding pass (`shapes`), the first pass where
    a selection pass chose among several candidates first, the label chosen, and each
    candidate's value."""

    NULLS_WRITTEN = False

    shapes: dict[str, ShapeSummary] = _f(dict, each=ShapeSummary)
    selection: dict[str, ShapeSummary] | None = _f(dict, required=False, each=ShapeSummary)
    chosen: str | None = _f(str, type(None))
    labels: dict = _f(dict)             # candidate label -> the value it tried (playbook)
    method: dict | None = _f(dict, required=False)
    ceilings: dict | None = _f(dict, required=False)
    extra: dict = field(default_factory=dict)

    @property
    def first_pass(self) -> dict[str, ShapeSummary]:
        """The pass in which every candidate was timed against the incumbent."""
        return self.selection or self.shapes


@dataclass(frozen=True, kw_only=True)
class Experiment(_Record):
    """One experiment: one table row (README, "The record", lists every key)."""

    NULLS_WRITTEN = True

    schema: int = _f(int)
    iteration: int = _f(int)
    kind: Kind = _f(str, enum=Kind)
    optimization: str = _f(str)
    status: Status = _f(str, enum=Status)
    correctness: Correctness = _f(str, enum=Correctness)
    commit: str = _f(str)       # for the baseline, the commit the run started from
    ref: str = _f(str)
    decision: dict = _f(dict)   # decide.Verdict's fields; `reason` always
    knobs: dict = _f(dict)
    phases_s: dict = _f(dict)
    latency_ms: float | None = _f(int, float, type(None))
    started_at: float = _f(*NUMBER)
    finished_at: float = _f(*NUMBER)
    describe: str | None = _f(str, required=False)
    family: str | None = _f(str, required=False)
    knob: str | None = _f(str, required=False)
    value: Any = _f(*ANY, required=False)
    outcomes: dict | None = _f(dict, required=False)    # label -> {value, outcome, reason}
    timing: TimingDetail | None = _f(dict, required=False, record=TimingDetail)  # None: untimed
    environment: dict | None = _f(dict, required=False)
    # keys that some lines hold and others not (a later perfloop's, or an experiment's kind's):
    # left out where absent. (incumbent_value stays in `extra`: its absence says the line was
    # written before perfloop recorded it, which a null, the knob unset, does not.)
    incumbent_before: str | None = _f(str, required=False, nulls=False)
    every_bucket: bool | None = _f(bool, required=False, nulls=False)  # values ran in every
                                                                       # bucket's entry too
    sampler: dict | None = _f(dict, required=False, nulls=False)    # search.JointPlan's record
    screening: dict | None = _f(dict, required=False, nulls=False)  # {shape, ratios}
    extra: dict = field(default_factory=dict)

    def _check(self) -> None:
        if self.kind == Kind.CONFIRMATION:
            raise CorruptRecord("kind confirmation has the fields of an experiment")
        if not isinstance(self.decision.get("reason"), str):
            raise CorruptRecord("missing decision.reason")

    @property
    def reason(self) -> str:
        return self.decision["reason"]

    @property
    def gain(self) -> float | None:
        return self.decision.get("gain")

    @property
    def impossible(self) -> bool:
        """A time no clock gives (0 ms or less, or not a number): recorded before perfloop
        refused such times (a clamp to zero once kept identical code as 100% faster)."""
        return self.latency_ms is not None and not self.latency_ms > 0


@dataclass(frozen=True, kw_only=True)
class Confirmation(_Record):
    """The baseline and the final incumbent timed in one process (confirm.py)."""

    NULLS_WRITTEN = False

    schema: int = _f(int)
    kind: Kind = _f(str, enum=Kind)
    after_iteration: int = _f(int)
    baseline: str = _f(str)
    incumbent: str = _f(str)
    shapes: dict = _f(dict)     # shape -> {speedup, speedup_ci, ratio, ...}; {} when it failed
    wall_s: float | None = _f(*NUMBER, required=False)
    error: str | None = _f(str, required=False)
    extra: dict = field(default_factory=dict)

    @property
    def nothing_kept(self) -> bool:
        """The final incumbent is the baseline: its speedup is 1 by definition, not timed."""
        return self.baseline == self.incumbent


Record = Experiment | Confirmation


def from_dict(raw: Any) -> Record:
    """An experiment or a confirmation, by its kind."""
    is_confirmation = isinstance(raw, dict) and raw.get("kind") == CONFIRMATION
    return (Confirmation if is_confirmation else Experiment).from_dict(raw)


def load(path: Path) -> list[Record]:
    if not path.exists():
        return []
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorruptRecord(f"{path}: line {number} is not valid JSON ({exc.__class__.__name__}); "
                                "restore the file or move it aside") from None
        try:
            out.append(from_dict(raw))
        except CorruptRecord as exc:
            raise CorruptRecord(f"{path}: line {number} is not an experiment record ({exc}); "
                                "restore the file or move it aside") from None
    return out


def append(path: Path, record: Record) -> None:
    """Append one line (the point of no return of an experiment). A crash is not written
    while the machine lacks room beside the record: the candidate may have died of that."""
    if isinstance(record, Experiment) and record.status == Status.CRASH:
        preflight.require_room_for_a_crash(path.parent)
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    write_text(path, existing + dumps(record.to_dict(), sort_keys=True) + "\n")


# ---- queries over the record ------------------------------------------------------
def summary(timed_pass: dict) -> dict[str, ShapeSummary]:
    """A summarized timing pass (perfloop.measure.phases.summarize_pass) as the record types it."""
    return {name: ShapeSummary.from_dict(shape, f"{name}.") for name, shape in timed_pass.items()}


def shape_timed(record: Experiment | None, shape: str) -> ShapeSummary | None:
    """`shape` in the record's deciding pass (None where it was not timed)."""
    return record.timing.shapes.get(shape) if record and record.timing else None


def shape_stats(record: Experiment | None, shape: str,
                label: str | None = None) -> VariantStats | None:
    """The variant's statistics at `shape` in the record's deciding pass (default: the chosen
    variant)."""
    entry = shape_timed(record, shape)
    if entry is None:
        return None
    assert record is not None and record.timing is not None   # (shape_timed found it)
    label = label or record.timing.chosen
    return entry.variants.get(label) if label is not None else None


def incumbent_timed(recs: list[Experiment], incumbent: str, shape: str
                    ) -> tuple[Experiment | None, VariantStats | None]:
    """The incumbent's statistics at `shape` and the experiment they come from: the one that
    made it the incumbent, or, where that one did not time the shape (a dispatch change times
    only the buckets it touches, and the headline), the kept experiment before it, and so on
    back: a dispatch change leaves the other buckets' code as it was."""
    by_commit = {r.commit: r for r in recs if r.status == Status.KEEP and r.timing}
    record = by_commit.get(incumbent)
    while record is not None:
        stats = shape_stats(record, shape)
        if stats is not None:
            return record, stats
        before = record.incumbent_before
        record = by_commit.get(before) if before != record.commit else None
    return None, None
