"""A kernel's own view of its knob space, from two optional functions in kernel.py:

- canonical(knobs) -> knobs: the same knobs with what the kernel ignores set to one value (e.g.
  RMSNorm ignores tile's rows when block_elems is set). Candidates that build the incumbent's
  kernel are never proposed, so a no-op cannot be kept on a noisy shape's luck.
- restrict(knobs) -> str | None: why these knob values cannot work together (None: they can).
  Combinations it rules out are never proposed, searched or compiled.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from perfloop.core import dispatch_table as dispatch
from perfloop.core.errors import UserError
from perfloop.contract.kernel import MODULE, load_module
from perfloop.core.values import freeze

Same = Callable[[dict, dict], bool]


def plain_same(a: dict, b: dict) -> bool:
    return _frozen(a) == _frozen(b)


def _frozen(knobs: dict) -> dict:
    return {k: freeze(v) for k, v in knobs.items() if k != dispatch.KEY}


@dataclass(frozen=True)
class Space:
    same: Same = plain_same
    restrict: Callable[[dict], str | None] | None = None

    def why_not(self, knobs: dict) -> str | None:
        """Why these knobs cannot work, by the kernel's restrict(): their plain values, or the
        values in force at a bucket of their dispatch table; None where they can."""
        if self.restrict is None:
            return None
        for bucket in ("", *dispatch.table(knobs)):
            reason = self.restrict(dispatch.knobs_for(knobs, bucket))
            if reason:
                return f"{reason} (at {bucket})" if bucket else reason
        return None

    def worth(self, knobs: dict, changed: dict, bucket: str | None = None) -> bool:
        """Whether `changed` is worth measuring against `knobs`: it builds another kernel at
        `bucket` (None: by the plain values), and restrict() lets it run."""
        return (not self.same(dispatch.knobs_for(knobs, bucket or ""),
                              dispatch.knobs_for(changed, bucket or ""))
                and self.why_not(changed) is None)

    def moves_anywhere(self, knobs: dict, changed: dict) -> bool:
        """Whether `changed` builds another kernel than `knobs` in some bucket (the plain
        knobs' included): a one-knob step also writes its value in the entries that set the
        knob (perfloop.core.dispatch_table.set_everywhere)."""
        return dispatch.moves_anywhere(knobs, changed, self.same)


_loaded: dict[str, Space] = {}


def space_for(folder: Path) -> Space:
    """The kernel's Space (plain equality and no restriction where kernel.py has neither
    function). Imported once per version of kernel.py."""
    path = Path(folder) / MODULE
    key = hashlib.sha256(path.read_bytes()).hexdigest()
    if key not in _loaded:
        module = load_module(Path(folder), f"space_{key[:12]}", str(path))
        canonical = getattr(module, "canonical", None)
        restrict = getattr(module, "restrict", None)
        _loaded[key] = Space(plain_same if canonical is None else _by(canonical),
                             None if restrict is None else _checked(restrict))
    return _loaded[key]


def same_for(folder: Path) -> Same:
    """same(a, b) for the kernel in `folder`: equal after its canonical(), plain equality
    without one."""
    return space_for(folder).same


def _by(canonical: Callable[[dict], dict]) -> Same:
    def same(a: dict, b: dict) -> bool:
        try:
            return _frozen(canonical(_frozen(a))) == _frozen(canonical(_frozen(b)))
        except Exception as exc:  # the kernel's code: one line, not a traceback
            raise UserError(f"kernel.py canonical() failed: {type(exc).__name__}: {exc}") from None
    return same


def _checked(restrict: Callable[[dict], str | None]) -> Callable[[dict], str | None]:
    def why_not(knobs: dict) -> str | None:
        try:
            reason = restrict(_frozen(knobs))
        except Exception as exc:
            raise UserError(f"kernel.py restrict() failed: {type(exc).__name__}: {exc}") from None
        if reason is not None and not isinstance(reason, str):
            raise UserError("kernel.py restrict() must return None or a reason (a string), "
                            f"not {reason!r}")
        return reason or None
    return why_not
