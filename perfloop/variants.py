"""Which knob combinations the playbook can produce for a kernel, for `perfloop check`."""

from __future__ import annotations

import itertools

from perfloop.playbook import Playbook


def domains(playbook: Playbook, knobs: dict, overrides: dict) -> dict[str, list]:
    """Every value each knob can take: the committed one and every candidate touching it."""
    out = {name: [value] for name, value in knobs.items()}
    for opt in playbook.optimizations:
        if opt.knob in out:
            for value in overrides.get(opt.knob, opt.values):
                if value not in out[opt.knob]:
                    out[opt.knob].append(value)
    return out


def pairwise(domains: dict[str, list]) -> list[dict]:
    """A small set of combinations in which every pair of values of every two knobs occurs
    (greedy covering array). The first row is the committed one."""
    names = list(domains)
    sizes = [len(domains[n]) for n in names]
    if len(names) < 2:
        return [{names[0]: v} for v in domains[names[0]]] if names else [{}]
    todo = {(i, a, j, b) for i, j in itertools.combinations(range(len(names)), 2)
            for a in range(sizes[i]) for b in range(sizes[j])}
    rows = [[0] * len(names)]
    while True:
        _cover(rows[-1], todo)
        if not todo:
            break
        i, a, j, b = min(todo)
        row = {i: a, j: b}
        for k in range(len(names)):
            if k not in row:
                row[k] = max(range(sizes[k]), key=lambda v: sum(
                    ((min(k, m), v if k < m else w, max(k, m), w if k < m else v) in todo)
                    for m, w in row.items()))
        rows.append([row[k] for k in range(len(names))])
    return [{names[k]: domains[names[k]][v] for k, v in enumerate(r)} for r in rows]


def _cover(row: list[int], todo: set) -> None:
    for i, j in itertools.combinations(range(len(row)), 2):
        todo.discard((i, row[i], j, row[j]))


def exhaustive(domains: dict[str, list]) -> list[dict]:
    names = list(domains)
    return [dict(zip(names, combo)) for combo in itertools.product(*domains.values())]
