"""sandbox/<kernel>/perf_results.md: seed 002's five-column table, one row per iteration,
appended and never rewritten (except whole, from the record, when it no longer matches it)."""

from __future__ import annotations

import math
from pathlib import Path

from perfloop.core.atomic import write_text

OPT_WIDTH = 40  # fixed, so a later, longer name never forces earlier rows to be re-padded
HEADER = (f"| iteration | {'optimization':<{OPT_WIDTH}} | latency_ms | correctness | status |\n"
          f"|----------:|:{'-' * (OPT_WIDTH + 1)}|-----------:|:------------|-------:|\n")


def format_row(iteration: int, optimization: str, latency_ms: float | None,
               correctness: str, status: str) -> str:
    """One row. latency is blank when nothing was timed (a crash, a failed correctness test)."""
    name = " ".join(optimization.replace("|", "/").split())
    latency = "" if latency_ms is None or math.isnan(latency_ms) else f"{latency_ms:.6f}"
    return (f"| {iteration:<9} | {name:<{OPT_WIDTH}} | {latency:>10} | {correctness:<11} "
            f"| {status:<6} |\n")


def read_rows(path: Path) -> list[list[str]]:
    """The table's data rows as lists of stripped cells."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()[2:]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines if line]


def append_row(path: Path, row: str) -> None:
    """Append one row; the existing bytes are kept exactly. Atomic: never a half row."""
    existing = path.read_text(encoding="utf-8") if path.exists() else HEADER
    write_text(path, existing + row)



def rewrite(path: Path, rows: list[str]) -> None:
    """The whole table from its rows (the record's), atomically."""
    write_text(path, HEADER + "".join(rows))
