"""Reading, from a trusted process, a file that kernel code could have made: its folder's files,
a child's log, audit or outputs. Only a regular file is read, opened without following a link
and without waiting on a FIFO, and never more than a limit: no such file can stall or flood
the process that reads it (a red-team kernel put a FIFO named pipe.py in its folder, and the
CLI waited in open() for a writer that never came)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

LIMIT = 256 << 20  # bytes: far past any kernel's source, log or outputs


class NotPlain(OSError):
    """Not a regular file, or larger than the limit."""


def open_plain(path: Path | str) -> int:
    """A file descriptor of `path`, a regular file (FileNotFoundError where there is none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotPlain(errno.ELOOP, "a symbolic link, not a regular file", str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotPlain(errno.EINVAL, "not a regular file", str(path))
    return fd


def read_bytes(path: Path | str, limit: int = LIMIT, offset: int = 0,
               cut: bool = False) -> bytes:
    """The file's bytes from `offset`; past `limit` of them NotPlain, or (cut) the first
    `limit`."""
    with os.fdopen(open_plain(path), "rb") as f:
        f.seek(offset)
        data = f.read(limit + 1)
    if len(data) > limit:
        if not cut:
            raise NotPlain(errno.EFBIG, f"larger than {limit} bytes", str(path))
        data = data[:limit]
    return data


def read_text(path: Path | str, limit: int = LIMIT, errors: str = "strict") -> str:
    return read_bytes(path, limit).decode("utf-8", errors)
