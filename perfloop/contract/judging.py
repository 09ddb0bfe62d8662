"""Which pass of the judge this process runs, shared by the judge's helpers (perfloop.correctness)
and the two pytest plugins that run a judge under the loop.

The loop runs a kernel's judge twice over the same cases: a kernel pass
(perfloop.child.judge_plugin) in processes that run kernel code and only deliver each case's
output as data, and a reference pass (perfloop.referee.judge_plugin) in a process that never
imports kernel code: it draws the same inputs, computes the expected values and compares the
kernel pass's outputs with them. The verdict comes from the reference pass alone.
"""

from __future__ import annotations

KERNEL, REFERENCE = "kernel", "reference"

MODE: str | None = None      # None when a judge runs by hand (plain pytest)
REQUEST: dict | None = None  # the pass's request: variants, where to write, ...
EXPECTED: dict = {}          # reference pass: (label, case) -> {"expected", "tolerance"}
ORDER: list = []             # reference pass: the (label, case) keys in the order checked
