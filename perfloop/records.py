"""sandbox/<kernel>/experiments.jsonl: the full, machine-readable record of every experiment,
and the one-process confirmations of a run's result (kind "confirmation", no table row).

One JSON object per line. The file is rewritten atomically on every append, so a kill at any
moment leaves either the old file or the new one, never a torn line; any line that does not
parse, or lacks what the commands read, is therefore corruption, and is reported rather than
guessed at.
"""

from __future__ import annotations

import json
from pathlib import Path

from perfloop.atomic import dumps, write_text
from perfloop.errors import CorruptRecord
from perfloop.vocab import Kind

SCHEMA = 1
CONFIRMATION = Kind.CONFIRMATION
# field -> the types it may have
EXPERIMENT_FIELDS = {
    "schema": (int,), "iteration": (int,), "kind": (str,), "optimization": (str,),
    "status": (str,), "correctness": (str,), "commit": (str,), "ref": (str,),
    "decision": (dict,), "knobs": (dict,), "phases_s": (dict,),
    "latency_ms": (int, float, type(None)), "started_at": (int, float),
    "finished_at": (int, float),
}
CONFIRMATION_FIELDS = {"schema": (int,), "kind": (str,), "after_iteration": (int,),
                       "baseline": (str,), "incumbent": (str,), "shapes": (dict,)}


def _problem(record) -> str | None:
    if not isinstance(record, dict):
        return "not a JSON object"
    fields = CONFIRMATION_FIELDS if record.get("kind") == CONFIRMATION else EXPERIMENT_FIELDS
    for name, types in fields.items():
        if name not in record:
            return f"missing {name}"
        if not isinstance(record[name], types) or isinstance(record[name], bool):
            return f"{name} has the wrong type"
    if fields is EXPERIMENT_FIELDS and not isinstance(record["decision"].get("reason"), str):
        return "missing decision.reason"
    return None


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorruptRecord(f"{path}: line {number} is not valid JSON ({exc.__class__.__name__}); "
                                "restore the file or move it aside") from None
        problem = _problem(record)
        if problem:
            raise CorruptRecord(f"{path}: line {number} is not an experiment record ({problem}); "
                                "restore the file or move it aside")
        records.append(record)
    return records


def append(path: Path, record: dict) -> None:
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    write_text(path, existing + dumps(record, sort_keys=True) + "\n")
