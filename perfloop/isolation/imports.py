"""Which source files a process imported: what the loop compares with the run's base commit
after a judge or timing process (perfloop.store.pins)."""

from __future__ import annotations

import sys
from pathlib import Path


def imported_files() -> list[str]:
    """Source files of every module loaded in this process."""
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path:
            files.add(str(Path(path).resolve()))
    return sorted(files)
