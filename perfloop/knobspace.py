"""Which knob values build the same kernel: the kernel's own optional canonical(knobs) in
kernel.py (e.g. RMSNorm ignores tile's rows when block_elems is set). Candidates that change
nothing are never proposed, so a no-op cannot be kept on a noisy shape's luck."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

from perfloop import dispatch
from perfloop.errors import UserError
from perfloop.kernel import MODULE, import_module
from perfloop.playbook import freeze

Same = Callable[[dict, dict], bool]
_loaded: dict[str, Same] = {}


def plain_same(a: dict, b: dict) -> bool:
    return _frozen(a) == _frozen(b)


def _frozen(knobs: dict) -> dict:
    return {k: freeze(v) for k, v in knobs.items() if k != dispatch.KEY}


def same_for(folder: Path) -> Same:
    """same(a, b) for the kernel in `folder`: equal after its canonical(), plain equality
    without one. Imported once per version of kernel.py."""
    path = Path(folder) / MODULE
    key = hashlib.sha256(path.read_bytes()).hexdigest()
    if key not in _loaded:
        canonical = getattr(import_module(Path(folder), f"space_{key[:12]}"), "canonical", None)
        _loaded[key] = plain_same if canonical is None else _by(canonical)
    return _loaded[key]


def _by(canonical: Callable[[dict], dict]) -> Same:
    def same(a: dict, b: dict) -> bool:
        try:
            return _frozen(canonical(_frozen(a))) == _frozen(canonical(_frozen(b)))
        except Exception as exc:  # the kernel's code: one line, not a traceback
            raise UserError(f"kernel.py canonical() failed: {type(exc).__name__}: {exc}") from None
    return same
