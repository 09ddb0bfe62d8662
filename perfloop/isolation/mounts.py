"""Which filesystem a path is on, named as `df` names it (its mount point and device), so that a
message about a full or read-only disk says which disk."""

from __future__ import annotations

import os
from pathlib import Path

MOUNTS = "/proc/self/mounts"


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds `path` (or would hold it, were it made)."""
    where = Path(os.path.realpath(path))
    while not where.exists() and where != where.parent:
        where = where.parent
    while not os.path.ismount(where) and where != where.parent:
        where = where.parent
    return where


def _unescape(field: str) -> str:
    """/proc/self/mounts writes a space, a tab, a newline and a backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def device(mount: Path) -> str | None:
    """The device (or the kind, for a filesystem without one: tmpfs, overlay) mounted at
    `mount`, the last one mounted there; None where the table cannot be read (not Linux)."""
    try:
        with open(MOUNTS, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and _unescape(fields[1]) == str(mount):
            found = _unescape(fields[0])
    return found


def filesystem(path: Path) -> str:
    """`path`'s filesystem in words: "the filesystem mounted at /work (/dev/vda1)"."""
    mount = mount_point(Path(path))
    dev = device(mount)
    return f"the filesystem mounted at {mount}" + (f" ({dev})" if dev else "")
