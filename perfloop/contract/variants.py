"""Which knob combinations the playbook can produce for a kernel, for `perfloop check`."""

from __future__ import annotations

import itertools
import random
from typing import Callable

from perfloop.contract.playbook import Playbook


def domains(playbook: Playbook, knobs: dict, overrides: dict,
            tags: tuple = ()) -> dict[str, list]:
    """Every value each knob can take: the committed one and every candidate touching it
    (an entry that moves several knobs together gives each of them its values). An entry
    for tagged kernels alone (no applies_to) touches only kernels with one of its tags."""
    out = {name: [value] for name, value in knobs.items()}
    for opt in playbook.optimizations:
        if not all(k in out for k in opt.moves) or not opt.offered_to(tags):
            continue
        for value in overrides.get(opt.key, opt.values):
            for knob, v in (value.items() if opt.knobs else [(opt.knob, value)]):
                if v not in out[knob]:
                    out[knob].append(v)
    return out


def pairwise(domains: dict[str, list], allowed: Callable[[dict], bool] | None = None
             ) -> tuple[list[dict], int]:
    """A small set of combinations in which every pair of values of every two knobs occurs
    (greedy covering array), and how many pairs no combination `allowed` lets run was found
    for (the kernel's restrict(): a pair it rules out, or one that needs other knobs moved
    too). The first row is the committed one."""
    names = list(domains)
    sizes = [len(domains[n]) for n in names]
    if len(names) < 2:
        each = [{names[0]: v} for v in domains[names[0]]] if names else [{}]
        kept = [r for r in each[1:] if allowed is None or allowed(r)]
        return each[:1] + kept, len(each) - 1 - len(kept)

    def knobs(row: list[int]) -> dict:
        return {names[k]: domains[names[k]][v] for k, v in enumerate(row)}

    def runs(row: list[int]) -> bool:
        return allowed is None or allowed(knobs(row))

    todo = {(i, a, j, b) for i, j in itertools.combinations(range(len(names)), 2)
            for a in range(sizes[i]) for b in range(sizes[j])}
    rows, dropped = [[0] * len(names)], 0
    _cover(rows[0], todo)
    while todo:
        i, a, j, b = min(todo)
        row = {i: a, j: b}
        for k in range(len(names)):
            if k not in row:
                row[k] = max(range(sizes[k]), key=lambda v: sum(
                    ((min(k, m), v if k < m else w, max(k, m), w if k < m else v) in todo)
                    for m, w in row.items()))
        found = _runnable([row[k] for k in range(len(names))], (i, j), sizes, runs)
        if found is None:
            todo.discard((i, a, j, b))
            dropped += 1
            continue
        rows.append(found)
        _cover(found, todo)
    return [knobs(r) for r in rows], dropped


def _runnable(row: list[int], fixed: tuple, sizes: list[int], runs) -> list[int] | None:
    """`row`, or the first row that differs from it in one knob outside `fixed` and runs;
    None if there is neither."""
    if runs(row):
        return row
    for k in range(len(row)):
        if k in fixed:
            continue
        for v in range(sizes[k]):
            other = row[:k] + [v] + row[k + 1:]
            if v != row[k] and runs(other):
                return other
    return None


def _cover(row: list[int], todo: set) -> None:
    for i, j in itertools.combinations(range(len(row)), 2):
        todo.discard((i, row[i], j, row[j]))


def exhaustive(domains: dict[str, list], allowed: Callable[[dict], bool] | None = None
               ) -> tuple[list[dict], int]:
    """Every combination `allowed` lets run (the committed one always), and how many it
    ruled out."""
    names = list(domains)
    rows = [dict(zip(names, combo)) for combo in itertools.product(*domains.values())]
    kept = [r for r in rows[1:] if allowed is None or allowed(r)]
    return rows[:1] + kept, len(rows) - 1 - len(kept)


def sample(rows: list[dict], extra: int, seed: int) -> list[dict]:
    """A subset of `rows` (a pairwise set: its first row the committed one) for a quick check:
    the first row, then greedily the rows that hold values no row taken yet holds, until
    every value the rows hold is in, then `extra` more of the rest drawn at random (seeded,
    so a CI log names the same variants every time). Kept in `rows`' order."""
    taken, seen = {0}, _values(rows[:1])
    every = _values(rows)
    while seen != every:
        best = max(range(len(rows)), key=lambda r: (len(_values([rows[r]]) - seen), -r))
        taken.add(best)
        seen |= _values([rows[best]])
    rest = [r for r in range(len(rows)) if r not in taken]
    taken |= set(random.Random(seed).sample(rest, min(extra, len(rest))))
    return [rows[r] for r in sorted(taken)]


def pairs_covered(rows: list[dict]) -> set:
    """The (knob, value, knob, value) pairs that some row holds."""
    return {(a, row[a], b, row[b]) for row in rows
            for a, b in itertools.combinations(sorted(row), 2)}


def _values(rows: list[dict]) -> set:
    return {(k, v) for row in rows for k, v in row.items()}
