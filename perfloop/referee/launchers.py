"""The trusted timer's handles on its launchers (perfloop.child.launcher), one process per
variant, and the clocks that time their batches from outside.

Each launcher is forked from the timer before the timer initializes CUDA, imports the contract
or draws anything (so it starts with torch imported, and with nothing it could predict), then
becomes a process of its own: a session of its own, only its own pipes and log open, its own
environment, confined (perfloop.isolation.sandbox). A launcher runs only while it is its turn: the timer continues it (SIGCONT), asks for a batch,
and stops it (SIGSTOP) once the batch is timed, so between turns its host code cannot launch
work, write, or read what the timer does next.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfloop.isolation import childlog, spawn
from perfloop.isolation.channel import NO_ANSWER, Channel, Closed


class LauncherFailed(Exception):
    def __init__(self, label: str, reason: str, kind: str = "crash"):
        super().__init__(reason)
        self.label, self.reason, self.kind = label, reason, kind


EXIT_GRACE_S = 10.0   # how long a launcher whose channel closed may take to exit
CHANNEL_FDS = (100, 101)   # a launcher's ends of its pipes to the timer (read, write)


class Forked:
    """A launcher process forked from the timer: what Launcher needs of a Popen."""

    def __init__(self, pid: int, output: childlog.ChildLog | None = None):
        self.pid, self.output = pid, output
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll_for(self, seconds: float) -> int | None:
        """poll(), retried for up to `seconds`: a process closes its pipes on its way out,
        so its channel can read closed before the process can be reaped."""
        deadline = time.monotonic() + seconds
        while (code := self.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return code

    def wait(self, timeout=None) -> int:
        if timeout is not None:   # as Popen.wait: raise rather than block past the timeout
            if (code := self.poll_for(timeout)) is None:
                raise subprocess.TimeoutExpired(f"launcher {self.pid}", timeout)
            return code
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _timer_files() -> list[int]:
    """The timer's pipes (other launchers' channels among them) and files (its progress,
    logs): closed in a forked launcher. Sockets and devices stay: torch's shared-memory
    client, imported before the fork, holds some."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("pipe:") or (target.startswith("/")
                                           and not target.startswith("/dev/")):
            out.append(int(name))
    return out


def _become_launcher(cwd: Path, env: dict, log: Path, fds: tuple) -> None:
    """In the forked child: a session of its own that dies with the timer, working in its own
    folder, its log as stdout and stderr, no pipe or file of the timer's open, its own
    environment, confined."""
    os.setsid()
    spawn.die_with_parent(signal.SIGKILL)  # (it is stopped between its turns)
    spawn.set_dumpable(True)   # (the timer is not: its own /proc entries are closed to it)
    os.chdir(cwd)
    null, out = os.open(os.devnull, os.O_RDONLY), os.open(log, os.O_WRONLY | os.O_CREAT
                                                         | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(childlog.writer(log, out), 1)   # (the pipe fork_launcher made for its log)
    os.dup2(childlog.writer(log, out), 2)
    for fd in _timer_files():
        if fd > 2 and fd not in fds:
            try:
                os.close(fd)
            except OSError:
                pass
    # its channel at the same descriptors in every launcher (the timer's numbers would tell
    # the order they were forked in)
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, max(CHANNEL_FDS) + 1) for fd in fds]
    for fd, fixed, temporary in zip(fds, CHANNEL_FDS, moved):
        os.close(fd)
        os.dup2(temporary, fixed)
        os.close(temporary)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # (TMPDIR is the launcher's own now)
    sys.dont_write_bytecode = True
    sys.argv = ["perfloop.child.launcher", *map(str, CHANNEL_FDS)]
    from perfloop.isolation import sandbox

    confined = sandbox.apply_from_environ()
    if confined:
        print(f"perfloop: confined: {confined}", flush=True)


def fork_launcher(cwd: Path, env: dict, log: Path, fds: tuple) -> Forked:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    output = childlog.ChildLog(log, append=True)   # capped: kernel code may print without end
    with warnings.catch_warnings():  # (3.12 warns of the timer's lifeline thread: the child
        warnings.simplefilter("ignore", DeprecationWarning)  # runs nothing it shares)
        pid = os.fork()
    if pid:
        output.started()
        return Forked(pid, output)
    code = 1
    try:
        _become_launcher(cwd, env, log, fds)
        from perfloop.child import launcher

        code = launcher.main(*CHANNEL_FDS)
    except SystemExit as exc:  # (kernel code may end its process this way)
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class Launcher:
    def __init__(self, label: str, *, cwd: Path, env: dict, log: Path, reply_s: float):
        """Forks the launcher, working in `cwd`; `configure` sends it its task."""
        self.label, self.reply_s = label, reply_s
        down_r, down_w = os.pipe()   # timer -> launcher
        up_r, up_w = os.pipe()       # launcher -> timer
        self.log = open(log, "ab")
        self.proc = fork_launcher(cwd, env, log, (down_r, up_w))
        os.close(down_r)
        os.close(up_w)
        self.channel = Channel(up_r, down_w)
        self.events: Any = None   # (go, done): interprocess CUDA events, from configure()
        self.running = True

    def configure(self, setup: dict) -> None:
        self.events = setup.get("events_objects")
        try:
            self.channel.send_pickle({k: v for k, v in setup.items() if k != "events_objects"})
        except Closed as exc:
            raise self._failed(str(exc)) from None

    def built(self, timeout_s: float) -> None:
        answer = self._answer(timeout_s)
        if "failed" in answer:
            raise LauncherFailed(self.label, str(answer["failed"])[:300])
        self.stop()

    def ask(self, message: dict, pickler=None, timeout_s: float | None = None) -> dict:
        """Send `message` and wait for the answer, continued while it works and stopped once
        it has answered: a launcher left running after the slots were shared ran beside the
        incumbent's warm-up and first rounds (a red-team kernel's thread saw them)."""
        self.cont()
        try:
            self.channel.send_pickle(message, pickler)
        except Closed as exc:
            raise self._failed(str(exc)) from None
        try:
            answer = self._answer(timeout_s or self.reply_s)
        finally:
            self.stop()
        if "raised" in answer:
            raise LauncherFailed(self.label, str(answer["raised"])[:300])
        return answer

    def send(self, message: dict) -> None:
        """Send without waiting (its answer is read with `answer`)."""
        self.cont()
        try:
            self.channel.send_pickle(message)
        except Closed as exc:
            raise self._failed(str(exc)) from None

    def _answer(self, timeout_s: float) -> dict:
        try:
            answer = self.channel.recv_json(timeout_s)
        except Closed as exc:
            raise self._failed(str(exc)) from None
        if not isinstance(answer, dict):
            raise LauncherFailed(self.label, "answered with something that is not an answer")
        return answer

    def answer(self) -> dict:
        answer = self._answer(self.reply_s)
        if "raised" in answer:
            raise LauncherFailed(self.label, str(answer["raised"])[:300])
        return answer

    def _failed(self, why: str) -> LauncherFailed:
        timed_out = why == NO_ANSWER
        # a channel that closed is a process on its way out: wait for it, or a SIGSEGV read as
        # a hang (seen on the loaded 2-core CPU machine: "a hang" 0.03 s into its timing)
        code = self.proc.poll() if timed_out else self.proc.poll_for(EXIT_GRACE_S)
        if code is None:
            self.kill()
            if timed_out:
                return LauncherFailed(self.label,
                                      f"did not answer in {self.reply_s:.0f} s (a hang)")
            return LauncherFailed(self.label, f"{why}, and it did not exit: killed")
        if code < 0:
            return LauncherFailed(self.label, f"died from signal {signal.Signals(-code).name}")
        return LauncherFailed(self.label, f"exited with status {code} ({why})")

    def stop(self) -> None:
        if self.running and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGSTOP)
            self.running = False

    def cont(self) -> None:
        if not self.running and self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGCONT)
            self.running = True

    def kill(self) -> None:
        spawn.kill_group(self.proc)  # type: ignore[arg-type]  # Forked: pid and wait(), as Popen
        self.log.close()
        if self.proc.output is not None:
            self.proc.output.close()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Batch:
    """One timed batch: its time (ms, all launches), the copies of its checked slots, what the
    launcher said, and whether host time may be in it (the pad was too short)."""

    ms: float
    copies: dict
    host_s: float
    pad_us: float = 0.0          # the sleep ahead of it
    pad_needed_us: float = 0.0   # the pad that would have kept this batch's host time out

    @property
    def host_bound(self) -> bool:
        return self.pad_needed_us > self.pad_us


class WallClock:
    """A CPU kernel: the trusted timer's wall clock from its "go" to the launcher's answer. The
    launcher is stopped at once, before the checked outputs are read, so work left for later
    cannot fill them in."""

    def describe(self) -> dict:
        return {"clock": "wall clock of the trusted timer around each launcher's batch"}

    def batch(self, launcher: Launcher, n: int, copy) -> Batch:
        launcher.cont()
        t0 = time.perf_counter()
        launcher.send({"op": "batch", "n": n})
        answer = launcher.answer()
        ms = (time.perf_counter() - t0) * 1e3
        launcher.stop()
        return Batch(ms, copy(), float(answer.get("host_s") or 0.0))


class GpuClock:
    """A GPU kernel: the trusted timer's CUDA events around the launcher's batch. On the timer's
    stream: the L2 flush, a sleep long enough for both hosts to issue their work, the start
    event, `go`; the launcher's stream waits for `go`, launches, records `done`; the timer's
    stream waits for `done`, copies the checked outputs, records the end event. Everything the
    batch's inputs could be used for happens between the two events: inputs are drawn before
    the start event and the outputs are read before the end event."""

    def __init__(self):
        import torch

        self.torch = torch
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.flush_bytes = max(2 * props.L2_cache_size, 64 << 20)
        self._flush = torch.ones(self.flush_bytes // 8, dtype=torch.int64, device="cuda")
        self._sink = torch.empty((), dtype=torch.int64, device="cuda")
        self.stream = torch.cuda.current_stream()
        self.cycles_per_us = self._calibrate()

    def _calibrate(self) -> float:
        torch, cycles, times = self.torch, 1_000_000, []
        torch.cuda._sleep(cycles)
        for _ in range(3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(cycles)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return cycles / (sorted(times)[1] * 1000.0)

    def describe(self) -> dict:
        return {"clock": "cuda events of the trusted timer around each launcher's batch, "
                         "joined by interprocess events", "l2_flush": "read-only sum",
                "l2_flush_bytes": self.flush_bytes}

    def batch(self, launcher: Launcher, n: int, copy, pad_us: float,
              timeout_s: float) -> Batch:
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        go, done = launcher.events
        torch.sum(self._flush, dim=0, out=self._sink)
        torch.cuda._sleep(int(pad_us * self.cycles_per_us))
        t0 = time.perf_counter()
        start.record(self.stream)
        go.record(self.stream)
        launcher.send({"op": "batch", "n": n})
        answer = launcher.answer()
        done.wait(self.stream)
        copies = copy()
        end.record(self.stream)
        host_s = time.perf_counter() - t0
        until = time.monotonic() + timeout_s
        while not end.query():
            if time.monotonic() > until:
                raise LauncherFailed(launcher.label, "its GPU work did not end in "
                                     f"{timeout_s:.0f} s (a hang)")
            time.sleep(0.0002)
        launcher.stop()
        # host time past half the pad is bound by it: launches issued just as the sleep ends
        # reach the GPU while it runs the batch's first ones, and a tiny kernel's batch then
        # times slower
        return Batch(start.elapsed_time(end), copies, float(answer.get("host_s") or 0.0),
                     pad_us=pad_us, pad_needed_us=2 * host_s * 1e6)
