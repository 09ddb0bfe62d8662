"""sandbox/<kernel>/experiments.jsonl: the full, machine-readable record of every experiment.

One JSON object per line. The file is rewritten atomically on every append, so a kill at any
moment leaves either the old file or the new one, never a torn line; any line that does not
parse is therefore corruption, and is reported rather than guessed at.
"""

from __future__ import annotations

import json
from pathlib import Path

from perfloop.atomic import write_text
from perfloop.errors import CorruptRecord

SCHEMA = 1
REQUIRED = ("schema", "iteration", "optimization", "status", "correctness", "commit")


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
            missing = [key for key in REQUIRED if key not in record]
        except (json.JSONDecodeError, TypeError) as exc:
            raise CorruptRecord(f"{path}: line {number} is not valid JSON ({exc.__class__.__name__}); "
                                "restore the file or move it aside") from None
        if missing or not isinstance(record.get("iteration"), int):
            raise CorruptRecord(f"{path}: line {number} is not an experiment record "
                                f"(missing {', '.join(missing) or 'an integer iteration'})")
        records.append(record)
    return records


def append(path: Path, record: dict) -> None:
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    write_text(path, existing + json.dumps(record, sort_keys=True) + "\n")
