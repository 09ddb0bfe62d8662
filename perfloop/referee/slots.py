"""The slots of one shape: N sets of inputs, output and scratch that the trusted timer draws,
shares with every launcher, and checks.

Before every batch each slot's inputs are drawn afresh (from the run's pinned make_inputs), its
output poisoned and its scratch too, so every launch of a batch runs on inputs no launch saw
before: a kernel that does less work on inputs it has seen never gets the chance. After the
batch, a few slots chosen at random (the launcher cannot know which) have their output, and
their in-place inputs, compared with the float64 reference of the inputs drawn for them, and
their other inputs with what was drawn (a launch must not write to an input it does not
declare in INPLACE). The reference is computed here, from the contract, never by kernel code.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from perfloop.contract import hooks, outputs


@dataclass
class LaunchChecks:
    """What the checked launches of one variant showed at one shape."""

    passed: bool = True
    failures: list = field(default_factory=list)   # [{round, ...}] of the checks that failed
    count: int = 0                                  # launches checked

    def to_json(self) -> dict:
        return {"passed": self.passed, "failures": self.failures[:5], "count": self.count,
                "verified_ms": [], "other_ms": [], "dropped": 0}


class Slots:
    def __init__(self, contract, shape, count: int, device: str, seed: int,
                 tolerance: dict, rng: random.Random):
        self.contract, self.shape, self.device = contract, shape, device
        self.seed, self.draws, self.rng = seed, 0, rng
        self.buffers: list = []      # [(inputs, out, extra)] as the launchers see them
        self.hooks = hooks.Hooks()
        self.each: list | None = None
        self.reference_dtype = "float64"
        self.tolerance = tolerance
        self.grow(count)

    def grow(self, count: int) -> None:
        """At least `count` slots (each drawn with its own seed)."""
        while len(self.buffers) < count:
            inputs = self.contract.make_inputs(self.shape, self._next_seed(), self.device)
            out = self.contract.empty_output(inputs)
            self.hooks, extra, _ = hooks.prepare(self.contract, inputs, out)
            self.buffers.append((inputs, out, extra))
        if self.each is None:
            inputs, out, _ = self.buffers[0]
            self.each = self.hooks.tolerances(self.shape, self.hooks.checked(out, inputs),
                                              self.tolerance)

    def _next_seed(self) -> int:
        self.draws += 1
        return self.seed + self.draws

    def refill(self, n: int, check: int) -> dict:
        """Fresh inputs in the first `n` slots, outputs and scratch poisoned; returns
        {slot: the inputs drawn for it} for `check` slots chosen at random."""
        chosen = set(self.rng.sample(range(n), min(check, n)))
        kept = {}
        for i in range(n):
            inputs, out, extra = self.buffers[i]
            new = self.contract.make_inputs(self.shape, self._next_seed(), self.device)
            outputs.refill(inputs, new)
            outputs.poison(out, self.rng)
            for buffer in extra:
                outputs.poison(buffer)
            if i in chosen:
                kept[i] = new
        return kept

    def copy(self, slots) -> dict:
        """{slot: a copy of what it is checked as}: its output, then its in-place inputs, and
        its inputs (to see writes to inputs it does not declare)."""
        return {i: (outputs.clone(self.hooks.checked(self.buffers[i][1], self.buffers[i][0])),
                    outputs.clone(self.buffers[i][0])) for i in slots}

    def check(self, drawn: dict, copies: dict) -> list[dict]:
        """The failures among the checked slots (empty if all passed)."""
        failures = []
        for i, new in drawn.items():
            got, inputs_now = copies[i]
            result = outputs.compare(got, self._reference(new), self.tolerance,
                                     self.shape.dtype, each=self.each)
            written = self._written(inputs_now, new)
            if written is not None:
                result = {**result, "passed": False,
                          "error": f"it wrote to input {written}, which kernel.py does not "
                                   "declare in INPLACE"}
            if not result["passed"]:
                failures.append(result)
        return failures

    def _reference(self, inputs):
        if self.reference_dtype == "float64":
            try:
                return self.contract.reference(*outputs.upcast(inputs))
            except (TypeError, RuntimeError, NotImplementedError):
                self.reference_dtype = "native"  # e.g. an op with no float64 kernel
        return self.contract.reference(*inputs)

    def _written(self, now, drawn) -> int | None:
        """The first input not declared in-place whose values differ from those drawn."""
        if not isinstance(now, (tuple, list)):
            return None
        for i, (a, b) in enumerate(zip(now, drawn)):
            if i not in self.hooks.inplace and not outputs.unchanged(a, b):
                return i
        return None

    def bytes(self) -> int:
        """What one slot holds, in bytes (its tensors)."""
        return sum(leaf.numel() * leaf.element_size()
                   for leaf in outputs.leaves(self.buffers[0]) if hasattr(leaf, "numel"))


def describe_mismatch(failure: dict) -> str:
    """One line for a failed check (outputs.compare's result, or a judge case's)."""
    if failure.get("error"):
        return failure["error"]
    which = f"output {failure['output']}: " if "output" in failure else ""
    return (f"{which}{failure['non_finite']} non-finite, {failure['outside_tolerance']} outside "
            f"atol={failure['atol']} rtol={failure['rtol']}, relative error "
            f"{failure['rel_err']:.3g}")
