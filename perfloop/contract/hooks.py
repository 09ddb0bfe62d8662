"""A kernel's optional benchmark hooks in kernel.py, read like the rest of the benchmark (from the
run's base commit, so an experiment cannot change them):

  INPLACE = (i, ...)           the inputs launch() updates in place. perfloop keeps a pristine
                               copy of each, restores it before every launch (outside the timed
                               window), never poisons it, and checks its new value: reference()
                               then returns (outputs, new value of inputs[i], ...), in INPLACE's
                               order.
  scratch(inputs) -> buffers   working memory, passed as launch(inputs, out, buffers); filled
                               with NaN before every launch, never checked.
  tolerance(shape, index, dtype) -> {rtol, atol, max_rel_err} or None
                               the tolerance of checked output `index` (the leaves of out, then
                               the in-place inputs) at a benchmark shape; None: kernel.toml's
                               [tolerance.<dtype>], else perfloop's default for the dtype.

A kernel that defines none of them is timed and checked exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfloop.contract import outputs
from perfloop.contract.kernel import TOLERANCE_KEYS


class ContractError(Exception):
    """kernel.py declares a hook wrongly; the message is one line naming what is wrong."""


@dataclass(frozen=True)
class Hooks:
    inplace: tuple[int, ...] = ()
    scratch: object = None     # scratch(inputs) -> buffers, or None
    tolerance: object = None   # tolerance(shape, index, dtype) -> dict | None, or None

    @classmethod
    def of(cls, module) -> "Hooks":
        inplace = getattr(module, "INPLACE", ())
        if isinstance(inplace, int) and not isinstance(inplace, bool):
            inplace = (inplace,)
        if (not isinstance(inplace, (tuple, list)) or len(set(inplace)) != len(inplace)
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                           for i in inplace)):
            raise ContractError(f"kernel.py: INPLACE must be a tuple of distinct input "
                                f"indices, e.g. (0,), not {inplace!r}")
        for name in ("scratch", "tolerance"):
            if hasattr(module, name) and not callable(getattr(module, name)):
                raise ContractError(f"kernel.py: {name} must be a function")
        return cls(tuple(inplace), getattr(module, "scratch", None),
                   getattr(module, "tolerance", None))

    def check_inputs(self, inputs, out) -> None:
        """INPLACE names inputs that exist, and nothing perfloop poisons (the output, scratch)
        shares memory with an input: poisoning it would destroy the input."""
        count = len(inputs) if isinstance(inputs, (tuple, list)) else 1
        bad = [i for i in self.inplace if i >= count]
        if bad:
            raise ContractError(f"kernel.py: INPLACE names input {bad[0]}, but make_inputs "
                                f"returns {count} input{'s' * (count != 1)}")
        if _shared(out, inputs):
            raise ContractError("kernel.py: empty_output returns memory of an input; declare "
                                "an input the launch updates in INPLACE instead")

    def make_scratch(self, inputs, out):
        if self.scratch is None:
            return None
        buffers = self.scratch(inputs)
        if _shared(buffers, (inputs, out)):
            raise ContractError("kernel.py: scratch() returns memory of an input or output")
        return buffers

    def checked(self, out, inputs) -> tuple:
        """What a launch's result is checked as: the output, then each in-place input."""
        return (out, *(inputs[i] for i in self.inplace)) if self.inplace else out

    def tolerances(self, shape, checked, declared: dict) -> list[dict]:
        """The tolerance of every leaf of `checked`: the hook's, else the declared one for its
        dtype (kernel.toml), else perfloop's default."""
        out = []
        for index, leaf in enumerate(outputs.leaves(checked)):
            dtype = outputs.dtype_name(leaf, shape.dtype)
            mine = self.tolerance(shape, index, dtype) if self.tolerance else None
            if mine is not None:
                valid(mine, f"kernel.py: tolerance(shape {shape.name}, output {index})")
            out.append(dict(mine) if mine is not None else outputs.tolerance_for(dtype, declared))
        return out


class Restore:
    """Run before every launch: each in-place input back to its pristine copy, scratch poisoned,
    so that no launch runs on what an earlier one left behind."""

    def __init__(self, kernel_hooks: Hooks, inputs, scratch):
        self.inputs, self.inplace, self.scratch = inputs, kernel_hooks.inplace, scratch
        self.pristine = [outputs.clone(inputs[i]) for i in self.inplace]

    def __call__(self) -> None:
        for i, saved in zip(self.inplace, self.pristine):
            outputs.refill(self.inputs[i], saved)
        if self.scratch is not None:
            outputs.poison(self.scratch)

    def redraw(self, new) -> None:
        """New inputs were drawn (refilled into the same buffers): restore to them from now."""
        for i, saved in zip(self.inplace, self.pristine):
            outputs.refill(saved, new[i])


def prepare(module, inputs, out) -> tuple[Hooks, tuple, Restore | None]:
    """The hooks of `module` checked against one shape's buffers: (hooks, the extra launch
    arguments (scratch), the restore to run before every launch or None if nothing needs it)."""
    kernel_hooks = Hooks.of(module)
    kernel_hooks.check_inputs(inputs, out)
    scratch = kernel_hooks.make_scratch(inputs, out)
    restore = (Restore(kernel_hooks, inputs, scratch)
               if kernel_hooks.inplace or scratch is not None else None)
    return kernel_hooks, (() if scratch is None else (scratch,)), restore


def valid(tol, where: str) -> dict:
    """A tolerance is exactly {rtol, atol, max_rel_err}, each a number >= 0."""
    if (not isinstance(tol, dict) or set(tol) != set(TOLERANCE_KEYS) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for v in tol.values())):
        raise ContractError(f"{where} must return None or {{rtol, atol, max_rel_err}} as "
                            f"numbers >= 0, not {tol!r}")
    return tol


def _shared(x, others) -> bool:
    mine = outputs.leaves(x)
    theirs = outputs.leaves(others)
    return any(outputs.same_memory(a, b) for a in mine for b in theirs)
