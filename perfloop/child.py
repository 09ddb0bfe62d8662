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
from typing import Callable

PR_SET_PDEATHSIG = 1

# Runs first in every judge and timing child (`python -c BOOTSTRAP ROOT MODE ARGS...`): modules
# whose source lies in the repository (not in the Python environment, even one inside it) are
# compiled from their source, never from a cached .pyc, which anyone can plant with a forged
# timestamp; pytest's cache of rewritten test modules is ignored the same way. MODE is
# "pytest" (the judge) or a module to run as __main__ (the timing worker).
BOOTSTRAP = """
import importlib.machinery, os, site, sys
root, mode = os.path.realpath(sys.argv[1]), sys.argv[2]
env = [os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, site.getusersitepackages(),
                                     *site.getsitepackages()}]
def repo_file(path):
    path = os.path.realpath(path)
    return path.startswith(root + os.sep) and not any(path.startswith(e + os.sep) for e in env)
class SourceOnly(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        return self.source_to_code(self.get_data(self.path), self.path)
class RepositorySource:
    @staticmethod
    def find_spec(name, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and (spec.origin or "").endswith(".py") and repo_file(spec.origin):
            spec.loader = SourceOnly(spec.name, spec.origin)
            return spec
        return None
sys.meta_path.insert(0, RepositorySource)
if mode == "pytest":
    import _pytest.assertion.rewrite, pytest
    _pytest.assertion.rewrite._read_pyc = lambda *args, **kwargs: None
    sys.exit(pytest.main(sys.argv[3:]))
import runpy
sys.argv = [mode, *sys.argv[3:]]
runpy.run_module(mode, run_name="__main__", alter_sys=True)
"""


def python(root: Path, mode: str, *args: str) -> list[str]:
    """The command line of a child: the bootstrap above, then pytest or a module."""
    return [sys.executable, "-c", BOOTSTRAP, str(root), mode, *args]


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


# what every judge and timing worker of a GPU kernel imports, and takes seconds to (torch alone
# 4.5 s on an H100 host): a child started ahead imports it while the previous experiment runs
PRELOAD = ("torch", "cuda.tile")
WAIT_LIMIT_S = 3600  # a child started ahead whose task never comes gives up


def wait_for_task(path: Path, preload=PRELOAD) -> bool:
    """In a child started ahead of its task (its task file named on its command line, not
    written yet): import `preload`, then wait for the file. Nothing here touches the GPU or
    imports kernel code: that is the task's. False if no task came in WAIT_LIMIT_S."""
    import importlib
    import importlib.util

    for name in preload:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    until = time.monotonic() + WAIT_LIMIT_S
    while not path.exists():
        if time.monotonic() > until:
            return False
        time.sleep(0.01)
    return True


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


class Running:
    """A child started with `start`; `wait` runs it to its end, its deadline, or a stall:
    `progress` files (its log is one) that have not changed for stall_s seconds."""

    def __init__(self, cmd: list[str], *, log: Path, env: dict | None, cwd: Path | None,
                 progress: list[Path]):
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log, self.watched, self.started = log, [log, *progress], time.monotonic()
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                     cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent)

    def adopt(self, *, progress: list[Path]) -> None:
        """A child started ahead of its task, which begins now: its time and its stall watch
        count from here, on these progress files besides its log."""
        self.started, self.watched = time.monotonic(), [self.log, *progress]

    def kill(self) -> None:
        _kill_group(self.proc)
        self._out.close()

    def wait(self, *, deadline: float, stall_s: float | None = None,
             cancel: threading.Event | None = None,
             on_progress: Callable[[], None] | None = None) -> ChildResult:
        """`cancel`, once set (from another thread), ends the wait as a timeout would.
        `on_progress` is called whenever the watched files change (what the live progress
        line shows comes from the same files as the watchdog's verdict)."""
        timed_out = stalled = False
        last_mark, last_change = _progress_mark(self.watched), time.monotonic()
        try:
            while True:
                try:
                    self.proc.wait(timeout=min(0.25, max(deadline - time.monotonic(), 0.001)))
                    break
                except subprocess.TimeoutExpired:
                    pass
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
        return ChildResult(None if timed_out else self.proc.returncode, timed_out,
                           time.monotonic() - self.started, self.log, stalled)


def start(cmd: list[str], *, log: Path, env: dict | None = None, cwd: Path | None = None,
          progress: list[Path] = ()) -> Running:
    return Running(cmd, log=log, env=env, cwd=cwd, progress=list(progress))


def run(cmd: list[str], *, timeout_s: float, log: Path, env: dict | None = None,
        cwd: Path | None = None, stall_s: float | None = None,
        progress: list[Path] = (), cancel: threading.Event | None = None,
        on_progress: Callable[[], None] | None = None) -> ChildResult:
    return start(cmd, log=log, env=env, cwd=cwd, progress=progress).wait(
        deadline=time.monotonic() + max(timeout_s, 0.001), stall_s=stall_s, cancel=cancel,
        on_progress=on_progress)
