"""What the machine must offer before a command starts an experiment: checked once, before
anything is written, so that a broken environment is refused in one line naming what to fix
instead of being recorded as the candidate's crash.

- git's index is not locked (a lock left by a killed git, or another git command running);
- perfloop can write where it writes: sandbox/, the kernel folder, the repository's git dir;
- those filesystems have room for an experiment's exports, logs and record;
- the committed kernel.py compiles (read from git and compiled, never imported: importing runs
  kernel code in perfloop's own process).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from perfloop.core.errors import EnvironmentFailure, UserError
from perfloop.isolation.mounts import filesystem
from perfloop.core.source import compile_error

MIN_FREE_MB = 300   # an experiment exports two copies of the folder, logs, and compile caches
AGAIN = "then run the command again"
FIXES = {errno.ENOSPC: "free some space there", errno.EDQUOT: "free some space there",
         errno.EROFS: "make it writable", errno.EACCES: "make it writable",
         errno.EPERM: "make it writable"}


def require_no_index_lock(lock: Path) -> None:
    if lock.exists():
        raise EnvironmentFailure(
            f"git's index is locked: {lock} exists (another git command is running in this "
            "repository, or one was killed and left it behind); if no git command is running, "
            f"remove it (`rm {lock}`), {AGAIN}")


def _existing(path: Path) -> Path:
    """The path, or its nearest ancestor that exists (where it would be created)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def require_writable(paths: dict[Path, str]) -> None:
    """{path: what perfloop writes there}; a missing path counts as its nearest ancestor."""
    for path, what in paths.items():
        where = _existing(Path(path))
        if not os.access(where, os.W_OK):
            ro = os.statvfs(where).f_flag & os.ST_RDONLY
            why = f"{filesystem(where)} is read-only" if ro else "no permission to write"
            raise EnvironmentFailure(f"{where} is not writable ({why}); perfloop writes {what} "
                                     f"there: make it writable, {AGAIN}")


def free_mb(path: Path) -> float:
    st = os.statvfs(_existing(Path(path)))
    return st.f_bavail * st.f_frsize / 2**20


def require_room(paths: list[Path], min_mb: int | None = None) -> None:
    min_mb = MIN_FREE_MB if min_mb is None else min_mb
    seen = set()
    for path in paths:
        where = _existing(Path(path))
        device = os.stat(where).st_dev
        if device in seen:
            continue
        seen.add(device)
        free = free_mb(where)
        if free < min_mb:
            raise EnvironmentFailure(
                f"only {free:.0f} MB free on {filesystem(where)}, which holds {where}; an "
                f"experiment needs {min_mb} MB there (exported copies of the kernel, logs, the "
                f"record): free some space, {AGAIN}")


def require_room_for_a_crash(path: Path) -> None:
    """Before a crash is recorded: had the machine room? A timing worker that cannot write
    its result dies like a crashing candidate; with too little room the crash is the
    machine's, and the experiment stays unrecorded, to be run again."""
    free = free_mb(path)
    if free < MIN_FREE_MB:
        raise EnvironmentFailure(
            f"the experiment crashed with only {free:.0f} MB free on {filesystem(path)}, which "
            f"holds {path} (an experiment needs {MIN_FREE_MB} MB): that crash is the machine's, "
            "not the candidate's, so it was not recorded; free some space, then `perfloop run "
            "--resume` runs it again", during=True)


def require_compiles(source: str | None, where: str) -> None:
    """`where` names the committed file, e.g. kernels/x/kernel.py at 1a2b3c4d5e6f."""
    why = compile_error(source, where) if source is not None else None
    if why:
        raise UserError(f"{where} does not compile ({why}); fix it and commit the fix, {AGAIN}")


def from_os_error(exc: OSError) -> EnvironmentFailure | None:
    """The line for a write that the machine refused in the middle of a command (no space,
    read-only), or None for any other OSError (a bug's)."""
    fix = FIXES.get(exc.errno)
    if fix is None:
        return None
    cause = f"{exc.strerror}{_where(exc)}: {fix}"
    return EnvironmentFailure(f"{cause}; nothing was recorded for an unfinished experiment: "
                              "`perfloop run --resume` runs it again", during=True, cause=cause)


def _where(exc: OSError) -> str:
    """The refused file and its filesystem; for a write to a file already open, which names
    none, the filesystems perfloop writes to (the repository's, the temporary one) that are
    short of room."""
    if exc.filename:
        return f" ({exc.filename}, on {filesystem(Path(exc.filename))})"
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return ""
    full = dict.fromkeys(filesystem(place) for place in (Path.cwd(), Path(tempfile.gettempdir()))
                         if free_mb(place) < MIN_FREE_MB)
    return f" (on {' or '.join(full)})" if full else ""
