"""Run a phase in a child process with a deadline; a child that hangs or dies is killed with
its whole process group, and the caller records a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChildResult:
    returncode: int | None
    timed_out: bool
    wall_s: float
    log: Path

    @property
    def died(self) -> bool:
        """Killed by a signal or by the deadline (as opposed to exiting with a status)."""
        return self.timed_out or self.returncode is None or self.returncode < 0

    def describe(self) -> str:
        if self.timed_out:
            return f"killed after {self.wall_s:.0f}s: past the iteration's time limit"
        if self.returncode is not None and self.returncode < 0:
            return f"died from signal {signal.Signals(-self.returncode).name}"
        return f"exited with status {self.returncode}"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run(cmd: list[str], *, timeout_s: float, log: Path, env: dict | None = None,
        cwd: Path | None = None) -> ChildResult:
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    timed_out = False
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        try:
            proc.wait(timeout=max(timeout_s, 0.001))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)  # also reaps anything the child left running in its group
    return ChildResult(None if timed_out else proc.returncode, timed_out,
                       time.monotonic() - start, log)
