"""One writer at a time: an exclusive lock (fcntl.flock) on a file, held for a whole command.

A flock belongs to the open file, so it ends with its process however that process ends
(kill -9 included): a lock left by a dead process is simply free, and nothing has to guess
whether a pid still runs. perfloop opens the file close-on-exec (Python's default), so the
children it starts never hold it. The file keeps its holder's pid, command line and start
time, for the line that refuses a second writer."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from perfloop.core.errors import Busy, EnvironmentFailure


def holder_line(path: Path) -> str:
    """Who holds the lock at `path`, as the file says (written just after it was taken)."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"pid {int(info['pid'])}, `{info['command']}`, since {since}"
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        return "a process that has not said who it is yet"


def _open(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise EnvironmentFailure(f"cannot take perfloop's lock {path} "
                                 f"({(exc.strerror or str(exc)).lower()}): make {path.parent} "
                                 "writable (perfloop keeps its record there), then run the "
                                 "command again") from None


def _take(fd: int, path: Path, what: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise Busy(f"refused: {what} is in use by another perfloop command "
                   f"({holder_line(path)}); perfloop runs one writer at a time: wait for it "
                   "to finish, or stop it (Ctrl-C; `perfloop run --resume` goes on)") from None


def _sign(fd: int, path: Path, command: str) -> None:
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": command,
                                  "since": time.time()}).encode(), 0)
    except OSError as exc:
        raise EnvironmentFailure(f"cannot write perfloop's lock {path} ({exc.strerror}); "
                                 f"free space on the filesystem of {path.parent}") from None


@contextmanager
def hold(path: Path, what: str, command: str | None = None):
    """Hold the lock at `path` for the block; Busy names the holder when another process has
    it. `what` says what the lock guards, `command` who holds it, for that line."""
    fd = _open(path)
    try:
        _take(fd, path, what)
        _sign(fd, path, command or shlex.join(["perfloop", *sys.argv[1:]]))
        try:
            yield
        finally:
            try:
                os.ftruncate(fd, 0)  # no stale holder for the next one to name
            except OSError:
                pass
    finally:
        os.close(fd)  # (releases the lock)
