"""Run a phase in a child process with a deadline, and make sure no child outlives perfloop.

- The child leads its own process group; on a deadline or a stall (no progress written for
  `stall_s`) the whole group is killed, and the caller records a crash.
- If perfloop itself dies, even by SIGKILL, the kernel sends the child SIGTERM (Linux's
  parent-death signal, set here between fork and exec); the child's side of that is
  perfloop.isolation.lifeline.
- Its stdout and stderr reach its log capped (perfloop.isolation.childlog).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from perfloop.isolation import childlog, spawn

python = spawn.python  # the command line of a child
_LIVE: set[int] = set()  # the children started here and not yet killed


def _session(pid: int) -> int | None:
    import os

    try:
        return os.getsid(pid)
    except OSError:
        return None


STRAY_SWEEPS = 20  # a sweep per generation of daemons below daemons, at most


def kill_strays() -> int:
    """Kill the processes that came to this one (a subreaper: perfloop.cli makes it one) in a
    session of their own without being started by it: daemons that kernel code left, once
    their parent died (this process's own helpers, GitPython's, are registered; no program is
    spared by its name: a red-team daemon ran torch's shared-memory manager, which once was,
    and slowed the incumbent's launchers through the timing phase), and everything below
    each of them, in one pass: a daemon that keeps a child of its own must not see that child come back here
    after the sweep, alive. Sweeps again until one finds nothing. Returns how many."""
    killed = 0
    for _ in range(STRAY_SWEEPS):
        found = _strays()
        if not found:
            break
        spawn.kill_pids(found)
        killed += len(found)
        spawn.wait_gone(found, timeout_s=1.0)
    return killed


def unlink_shared_memory(pid: int) -> None:
    """Once the child `pid` has exited: the torch shared memory named for it in /dev/shm (the
    timer's CPU slots). torch's manager unlinks it after the child, but it then comes to
    perfloop, which kills it as any daemon (no program is spared by name), and it stayed. Not
    the child's own work: torch unlinks each again as the child exits, and aborted where one
    was gone (the timer on an H100)."""
    import glob
    import os

    for path in glob.glob(f"/dev/shm/torch_{pid}_*"):
        try:
            os.unlink(path)
        except OSError:
            pass


def _strays() -> list[int]:
    """The strays below this process and all their descendants (see kill_strays)."""
    import os

    me = os.getpid()
    mine, tree = _session(me), spawn.process_table()
    roots = [pid for pid, proc in tree.items()
             if proc.parent == me and pid not in _LIVE | spawn.OWN_HELPERS
             and proc.session != mine]
    return [pid for root in roots for pid in (root, *spawn.descendants_in(tree, root))]


@dataclass(frozen=True)
class ChildResult:
    returncode: int | None
    timed_out: bool
    wall_s: float
    log: Path
    stalled: bool = False
    # ended by perfloop once it had delivered what it was asked for (wait's `done`), without
    # waiting for its exit: torch's and CUDA's teardown takes seconds a process, which the
    # experiment waited for (docs/findings/2026-11-27-boundary-cost.md; returncode: None
    # unless it had exited by then)
    delivered: bool = False

    @property
    def died(self) -> bool:
        """Killed by a signal or by the deadline (as opposed to exiting with a status)."""
        if self.delivered:   # (ended by perfloop: no status is owed)
            return False
        return self.timed_out or self.returncode is None or self.returncode < 0

    def describe(self) -> str:
        if self.delivered and self.returncode is None:
            return "ended by perfloop once it had delivered its result"
        if self.stalled:
            return f"killed after {self.wall_s:.0f}s: no progress for too long (a hang)"
        if self.timed_out:
            return f"killed after {self.wall_s:.0f}s: past the iteration's time limit"
        if self.returncode is not None and self.returncode < 0:
            return f"died from signal {signal.Signals(-self.returncode).name}"
        return f"exited with status {self.returncode}"






def _progress_mark(paths: list[Path]) -> tuple:
    marks: list[tuple[int, int] | None] = []
    for path in paths:
        try:
            st = path.stat()
            marks.append((st.st_size, st.st_mtime_ns))
        except FileNotFoundError:
            marks.append(None)
    return tuple(marks)


class Running:
    """A child started with `start`; `wait` runs it to its end, its deadline, or a stall:
    `progress` files (its log is one) that have not changed for stall_s seconds."""

    def __init__(self, cmd: list[str], *, log: Path, env: dict | None, cwd: Path | None,
                 progress: list[Path]):
        self.log, self.watched, self.started = log, [log, *progress], time.monotonic()
        self._out = childlog.ChildLog(log)   # capped: a child may print without end
        try:
            self.proc = spawn.start(cmd, stdout=self._out.write_fd, stderr=subprocess.STDOUT,
                                    env=env, cwd=cwd)
        except BaseException:
            self._out.close()
            raise
        self._out.started()
        _LIVE.add(self.proc.pid)

    def adopt(self, *, progress: list[Path]) -> None:
        """A child started ahead of its task, which begins now: its time and its stall watch
        count from here, on these progress files besides its log."""
        self.started, self.watched = time.monotonic(), [self.log, *progress]

    def kill(self) -> None:
        spawn.kill_group(self.proc)
        _LIVE.discard(self.proc.pid)
        self._out.close()

    def wait(self, *, deadline: float, stall_s: float | None = None,
             cancel: threading.Event | None = None,
             on_progress: Callable[[], None] | None = None,
             done: Callable[[], bool] | None = None) -> ChildResult:
        """`cancel`, once set (from another thread), ends the wait as a timeout would.
        `on_progress` is called whenever the watched files change (what the live progress
        line shows comes from the same files as the watchdog's verdict). `done`, once true,
        ends the wait as the child's exit would: it has delivered its result (it is killed)."""
        timed_out = stalled = delivered = False
        last_mark, last_change = _progress_mark(self.watched), time.monotonic()
        tick = 0.25 if done is None else 0.02
        try:
            while True:
                try:
                    self.proc.wait(timeout=min(tick, max(deadline - time.monotonic(), 0.001)))
                    break
                except subprocess.TimeoutExpired:
                    pass
                if done is not None and done():
                    delivered = True
                    break
                now = time.monotonic()
                if now >= deadline or cancel is not None and cancel.is_set():
                    timed_out = True
                    break
                mark = _progress_mark(self.watched)
                if mark != last_mark:
                    last_mark, last_change = mark, now
                    if on_progress is not None:
                        on_progress()
                elif stall_s is not None and now - last_change > stall_s:
                    timed_out = stalled = True
                    break
        finally:
            self.kill()  # also reaps anything the child left running in its group
            unlink_shared_memory(self.proc.pid)
        code = None if timed_out else self.proc.returncode
        if delivered:   # (killed just now, unless it had exited on its own)
            code = code if code is not None and code >= 0 else None
        return ChildResult(code, timed_out, time.monotonic() - self.started, self.log, stalled,
                           delivered)


def start(cmd: list[str], *, log: Path, env: dict | None = None, cwd: Path | None = None,
          progress: list[Path] | tuple[Path, ...] = ()) -> Running:
    return Running(cmd, log=log, env=env, cwd=cwd, progress=list(progress))


def run(cmd: list[str], *, timeout_s: float, log: Path, env: dict | None = None,
        cwd: Path | None = None, stall_s: float | None = None,
        progress: list[Path] | tuple[Path, ...] = (), cancel: threading.Event | None = None,
        on_progress: Callable[[], None] | None = None) -> ChildResult:
    return start(cmd, log=log, env=env, cwd=cwd, progress=progress).wait(
        deadline=time.monotonic() + max(timeout_s, 0.001), stall_s=stall_s, cancel=cancel,
        on_progress=on_progress)
