"""Starting perfloop's children, for the parent and for the trusted timer alike: the command line
of a child (perfloop/child/bootstrap.py, then pytest or a module), a new session and process
group for each, the parent-death signal, and killing a child with all it started.

perfloop's processes are child subreapers (Linux's PR_SET_CHILD_SUBREAPER): a daemon that
kernel code starts in a session of its own is re-parented to them rather than to init, so
`kill_descendants` finds and kills it when its phase ends.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
BOOTSTRAP = (Path(__file__).resolve().parents[1] / "child" / "bootstrap.py").read_text()


OWN_HELPERS: set[int] = set()  # long-lived helpers of this process in sessions of their own


def own_helper(pid: int) -> None:
    """A helper this process started in a session of its own (GitPython's cat-file): not a
    stray for perfloop.measure.process.kill_strays."""
    OWN_HELPERS.add(pid)


def python(root: Path, mode: str, *args: str) -> list[str]:
    """The command line of a child: perfloop/child/bootstrap.py, then pytest or a module."""
    return [sys.executable, "-c", BOOTSTRAP, str(root), mode, *args]


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Runs in the child between fork and exec: `sig` when the parent dies. A process that may
    be stopped (SIGSTOP) when that happens needs SIGKILL: any other signal waits for a
    SIGCONT that no one will send."""
    _prctl(PR_SET_PDEATHSIG, sig)


PR_SET_DUMPABLE = 4


def set_dumpable(dumpable: bool) -> bool:
    """Whether other processes of this user may read this one's /proc entries (its
    environment, memory, file descriptors) or attach to it. perfloop's trusted processes are
    not: a launcher read the timer's environment, and with it the user's secrets."""
    return _prctl(PR_SET_DUMPABLE, int(dumpable))


def become_subreaper() -> bool:
    """Orphans among this process's descendants come back to it (kill_descendants)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def start(cmd: list[str], **popen) -> subprocess.Popen:
    """A child in a session and process group of its own, dying with its parent."""
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=die_with_parent, **popen)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def stat_fields(pid: int) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command (which may hold spaces and
    parentheses): proc(5)'s field N is at index N - 3 (state 3, parent 4, group 5, session 6,
    nice 19, policy 41). OSError once the process is gone."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


class Proc(NamedTuple):
    parent: int
    group: int
    session: int


def process_table() -> dict[int, Proc]:
    """Every living process, from /proc, in one pass."""
    out: dict[int, Proc] = {}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            try:
                fields = stat_fields(int(entry.name))
                out[int(entry.name)] = Proc(int(fields[1]), int(fields[2]), int(fields[3]))
            except (OSError, ValueError, IndexError):
                continue
    return out


def descendants_in(table: dict[int, Proc], pid: int) -> list[int]:
    """Every process below `pid` in a process_table."""
    children: dict[int, list[int]] = {}
    for child, proc in table.items():
        children.setdefault(proc.parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def descendants(pid: int | None = None) -> list[int]:
    """Every living process below `pid` (default: this one), from /proc."""
    return descendants_in(process_table(), pid or os.getpid())


def kill_pids(pids: list[int]) -> None:
    """SIGKILL each of `pids` (gone ones are skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids: list[int], timeout_s: float) -> None:
    """Until each of `pids` is dead (reaped here where it is this process's child, a zombie
    elsewhere) or `timeout_s` has passed: its children come back to their subreaper only
    once it has died."""
    import time

    until = time.monotonic() + timeout_s
    left = set(pids)
    while left and time.monotonic() < until:
        for pid in list(left):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    left.discard(pid)
                    continue
            except ChildProcessError:
                pass
            try:
                state = stat_fields(pid)[0]
            except (OSError, IndexError):
                state = b"Z"
            if state in (b"Z", b"X"):
                left.discard(pid)
        if left:
            time.sleep(0.005)


def kill_descendants(pid: int | None = None, spare: frozenset[int] | set[int] = frozenset()) -> int:
    """SIGKILL every process below `pid` (default: this one) but those in `spare`; how many
    there were. With become_subreaper, that includes daemons that left their session."""
    found = [child for child in descendants(pid) if child not in spare]
    kill_pids(found)
    for child in found:  # reap those that are ours, so none stays a zombie
        try:
            os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            pass
    return len(found)
