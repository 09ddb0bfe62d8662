"""Run a phase in a child process with a deadline, and make sure no child outlives perfloop.

- The child leads its own process group; on a deadline or a stall (no progress written for
  `stall_s`) the whole group is killed, and the caller records a crash.
- If perfloop itself dies, even by SIGKILL, the kernel sends the child SIGTERM (Linux's
  parent-death signal); `guard_parent()`, which every perfloop child calls first, turns that
  into SIGKILL for the child's whole group, and a watchdog thread does the same if the parent
  disappears another way. So nothing keeps running, or writes files, after its parent is gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ChildResult:
    returncode: int | None
    timed_out: bool
    wall_s: float
    log: Path
    stalled: bool = False

    @property
    def died(self) -> bool:
        """Killed by a signal or by the deadline (as opposed to exiting with a status)."""
        return self.timed_out or self.returncode is None or self.returncode < 0

    def describe(self) -> str:
        if self.stalled:
            return f"killed after {self.wall_s:.0f}s: no progress for too long (a hang)"
        if self.timed_out:
            return f"killed after {self.wall_s:.0f}s: past the iteration's time limit"
        if self.returncode is not None and self.returncode < 0:
            return f"died from signal {signal.Signals(-self.returncode).name}"
        return f"exited with status {self.returncode}"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass


def _kill_own_group(*_args) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def guard_parent() -> None:
    """In a perfloop child: die with the whole process group when the parent goes away."""
    if os.getpgrp() != os.getpid():
        return  # not started by child.run (e.g. a judge run by hand): nothing to guard
    parent = os.getppid()
    signal.signal(signal.SIGTERM, _kill_own_group)

    def watch():
        while True:
            if os.getppid() != parent:
                _kill_own_group()
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True, name="perfloop-parent-watch").start()
    if os.getppid() != parent:  # the parent died before the handler was in place
        _kill_own_group()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _progress_mark(paths: list[Path]) -> tuple:
    marks = []
    for path in paths:
        try:
            st = path.stat()
            marks.append((st.st_size, st.st_mtime_ns))
        except FileNotFoundError:
            marks.append(None)
    return tuple(marks)


def run(cmd: list[str], *, timeout_s: float, log: Path, env: dict | None = None,
        cwd: Path | None = None, stall_s: float | None = None,
        progress: list[Path] = ()) -> ChildResult:
    """Run cmd to its end, its deadline, or a stall: `progress` files (its log is one) that
    have not changed for stall_s seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    deadline = start + max(timeout_s, 0.001)
    timed_out = stalled = False
    watched = [log, *progress]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True, preexec_fn=_die_with_parent)
        last_mark, last_change = _progress_mark(watched), time.monotonic()
        try:
            while True:
                try:
                    proc.wait(timeout=min(0.25, max(deadline - time.monotonic(), 0.001)))
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if now >= deadline:
                    timed_out = True
                    break
                mark = _progress_mark(watched)
                if mark != last_mark:
                    last_mark, last_change = mark, now
                elif stall_s is not None and now - last_change > stall_s:
                    timed_out = stalled = True
                    break
        finally:
            _kill_group(proc)  # also reaps anything the child left running in its group
    return ChildResult(None if timed_out else proc.returncode, timed_out,
                       time.monotonic() - start, log, stalled)
