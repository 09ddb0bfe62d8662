"""sandbox/<kernel>/experiments.jsonl: the full, machine-readable record of every experiment,
and the one-process confirmations of a run's result (kind "confirmation", no table row).

One JSON object per line. The file is rewritten atomically on every append, so a kill at any
moment leaves either the old file or the new one, never a torn line; any line that does not
parse, or lacks what the commands read, is therefore corruption, and is reported rather than
guessed at.

Each line is read into an Experiment or a Confirmation, and written from one, by the one pair
from_dict / to_dict: the fields the commands read are typed and checked; every other key of
the line (the timing's raw samples, the sampler, the screening, what a later perfloop adds)
is kept in `extra` untouched, so a line read and written back is the same line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from perfloop.core.atomic import dumps, write_text
from perfloop.core.errors import CorruptRecord
from perfloop.core.vocab import Correctness, Kind, Status
from perfloop.store import preflight

SCHEMA = 1
CONFIRMATION = Kind.CONFIRMATION
NUMBER = (int, float)
ANY = (object,)


class _Record:
    """from_dict / to_dict over a dataclass whose fields say their JSON types in metadata:
    `types` (a tuple), `enum` (a StrEnum the value must belong to), `required`, `nulls`
    (whether None is written, default NULLS_WRITTEN)."""

    # an optional field that is None: written as null (every experiment line has always
    # held every field), or left out (a confirmation's fields that only some lines have)
    NULLS_WRITTEN: ClassVar[bool]

    @classmethod
    def from_dict(cls, raw: Any):
        """The record of one parsed line; CorruptRecord saying what is wrong, in a few words."""
        if not isinstance(raw, dict):
            raise CorruptRecord("not a JSON object")
        typed, extra = {}, dict(raw)
        for f in fields(cls):
            if f.name == "extra":
                continue
            meta = f.metadata
            if f.name not in raw:
                if meta["required"]:
                    raise CorruptRecord(f"missing {f.name}")
                continue
            value = raw[f.name]
            if value is None and not meta["required"]:
                if not cls._nulls(meta):
                    continue  # (stays in extra: written back as it was)
            elif not isinstance(value, meta["types"]) or (  # (JSON's true is no number)
                    isinstance(value, bool) and int in meta["types"]):
                raise CorruptRecord(f"{f.name} has the wrong type")
            elif meta.get("enum"):
                try:
                    value = meta["enum"](value)
                except ValueError:
                    known = ", ".join(repr(m.value) for m in meta["enum"])
                    raise CorruptRecord(f"{f.name} '{value}' is not one of {known}") from None
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
        """The line's object: every key it was read from, each typed field as it is now."""
        out = dict(self.extra)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or value is None and not (
                    f.metadata["required"] or self._nulls(f.metadata)):
                continue
            out[f.name] = value.value if f.metadata.get("enum") else value
        return out


def _f(*types, enum=None, required=True, default=None, nulls=None):
    meta = {"types": types, "enum": enum, "required": required, "nulls": nulls}
    return field(metadata=meta) if required else field(default=default, metadata=meta)


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
    timing: dict | None = _f(dict, required=False)      # None when nothing was timed
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


def plain(recs: list[Experiment]) -> list[dict]:
    """The records as the line's objects, for the pure functions that read them so (search)."""
    return [r.to_dict() for r in recs]


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
def shape_stats(record: Experiment | None, shape: str, label: str | None = None) -> dict | None:
    """The variant's statistics at `shape` in the record's deciding pass (default: the chosen
    variant), with the shape's floor."""
    timing = (record.timing if record else None) or {}
    entry = (timing.get("shapes") or {}).get(shape)
    label = label or timing.get("chosen")
    if entry is None or label not in entry["variants"]:
        return None
    return {**entry["variants"][label], "floor_ms": entry.get("floor_ms")}

def incumbent_timed(recs: list[Experiment], incumbent: str, shape: str
                    ) -> tuple[Experiment | None, dict | None]:
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
