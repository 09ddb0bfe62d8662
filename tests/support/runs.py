"""Runs of the scripted kernel: the gains a script gives, and what a run's files must agree on."""

import json
import re

from conftest import git

from perfloop.store import table

ROW = re.compile(r"^\| \d+ {0,8} \| .{40,} \| {0,10}(\d+\.\d{6})? \| (PASS|FAIL) {7} \| "
                 r"(keep|revert|crash) *\|$")
GAINS = [{"when": {"fast_math": True}, "factor": {"*": 0.8}},
         {"when": {"tile": [1, 2048]}, "factor": {"*": 0.97}},
         {"when": {"occupancy": 8}, "factor": {"head": 0.99}}]


def assert_consistent(scratch, iterations: int):
    state = json.loads((scratch.path / "sandbox/scripted/state.json").read_text())
    recs = scratch.records()
    rows = table.read_rows(scratch.path / "sandbox/scripted/perf_results.md")
    assert state["in_flight"] is None
    assert [r["iteration"] for r in recs] == list(range(iterations))     # each exactly once
    assert [int(r[0]) for r in rows] == list(range(iterations))          # no half or extra row
    assert all(ROW.match(line) for line in scratch.table().splitlines()[2:])
    assert scratch.branch() == state["branch"] and scratch.head() == state["incumbent"]
    assert git(scratch.path, "status", "--porcelain") == ""
    return state, recs
