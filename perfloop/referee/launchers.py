"""The trusted timer's launchers (perfloop.child.launcher), one process per variant: the
handle on each (Launcher), those of one run (Roster), and the clocks that time their batches
from outside.

Each launcher is forked from the timer before the timer initializes CUDA, imports the contract
or draws anything (so it starts with torch imported, and with nothing it could predict), then
becomes a process of its own: a session of its own, only its own pipes and log open, its own
environment, confined (perfloop.isolation.sandbox). A launcher runs only while it is its turn:
the timer continues it (SIGCONT), asks for a batch, and stops it (SIGSTOP) once the batch is
timed, so between turns its host code cannot launch work, write, or read what the timer does
next. A turn is every task a launcher runs, timed or not: before it, strays are killed, every
other launcher is stopped for good and the launcher's processes are set back to the timer's
own scheduling (perfloop.referee.scheduling); after it, the launcher has raised neither its
own scheduling nor changed the timer's. A launcher that fails is dropped with the reason.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfloop.contract.kernel import code_digest
from perfloop.core.vocab import CONTROL, INCUMBENT, Outcome
from perfloop.isolation import childlog, gpu_ipc, spawn
from perfloop.isolation.channel import NO_ANSWER, Channel, Closed
from perfloop.isolation.sandbox import Confinement, kernel_env, linked_cache
from perfloop.referee import scheduling


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


# ---- the launchers of one run ----------------------------------------------------------------
# the launcher whose empty batches give the bracket's own time, subtracted from every batch
# alike: it runs no variant's code, so no variant's turns tell it apart, and work a stopped
# launcher keeps doing enters no variant's calibration (a candidate-only one once read 12.3 ms
# for 0.25 while a stopped group worked in the kernel)
BRACKET = "bracket"


@dataclass(frozen=True)
class Release:
    """The parent's go: the variants that passed the judge (of those built, or failed here),
    whether to select among the candidates, and where the judge's cases to replay are."""

    labels: list[str]
    select: bool
    replay: dict | None


class Roster:
    def __init__(self, spec: dict, progress: Callable[..., None]):
        """Forks one launcher per variant, and the empty one: first, before the timer imports
        the contract or draws anything; `start` builds them."""
        self.spec, self.progress = spec, progress
        self.failed: dict[str, dict] = {}  # label -> {reason, kind}
        self.reply_s = float(spec.get("reply_timeout_s", 300))
        childlog.configure(float(spec.get("log_cap_mb", childlog.DEFAULT_CAP_MB)))  # (launchers)
        self.own = own_helpers()   # before any kernel code exists
        self.sched = scheduling.own()  # what every timed batch runs with
        self.launchers: dict[str, Launcher] = {}   # built and not dropped (start fills it)
        self._forked = self._fork(spec["variants"])

    def start(self, device: str) -> None:
        """Every launcher built, side by side; the timer's own scheduling and limits checked."""
        # the timer's own limits, checked after every turn; every launcher runs kernel code
        # from here on (they build side by side), so a change now cannot be laid at one's door
        self.limits = scheduling.own_limits()
        self.launchers = self._start(self.spec["variants"], self._forked, device)
        changed = scheduling.restore_own(self.sched, self.limits)
        if changed:
            raise LauncherFailed(BRACKET, f"the trusted timer's {changed[0]} changed while the "
                                          "variants were built: nothing can be timed fairly")
        if BRACKET not in self.launchers:
            raise LauncherFailed(BRACKET, self.failed.get(BRACKET, {}).get(
                "reason", "the timer's own empty launcher could not be built"))

    def _launcher_env(self, v: dict, folder: Path) -> dict:
        """A launcher's environment (perfloop.isolation.sandbox): it writes only its folder (with
        its code's compile cache), and reads only the code it runs (its variant's export; the
        contract for PyTorch's own launches), whatever its role."""
        conf = self.spec.get("confinement") or {}
        code = v.get("folder") or (self.spec["contract_folder"] if v.get("torch") else None)
        env = dict(os.environ)
        if code:
            shared = Path(self.spec.get("cache", folder.parent)) / code_digest(Path(code))
            env["CUDA_TILE_CACHE_DIR"] = linked_cache(folder, shared)
        confinement = Confinement(conf.get("mode", "off"), (str(code),) if code else ())
        return kernel_env(env, folder, self.spec["root"], confinement)

    def _fork(self, variants: list[dict]) -> dict:
        """One launcher per variant and the empty one, forked in a random order (an order
        drawn from the system, not from a generator the launchers would inherit), each in a
        folder of a random name with its log there: nothing of a launcher's process names
        its role."""
        import torch  # noqa: F401 (each launcher starts with it imported)

        work = Path(self.spec["progress"]).parent
        every = [*variants, {"label": BRACKET, "torch": None, "folder": None}]
        out = {}
        for v in random.SystemRandom().sample(every, len(every)):
            folder = work / f"k-{os.urandom(6).hex()}"
            folder.mkdir(parents=True)
            out[v["label"]] = Launcher(v["label"], cwd=folder, env=self._launcher_env(v, folder),
                                       log=folder / "launcher.log", reply_s=self.reply_s)
        return out

    def _start(self, variants: list[dict], out: dict, device: str) -> dict:
        setups = {}
        for v in [*variants, {"label": BRACKET, "empty": True}]:
            label = v["label"]
            kind = "empty" if v.get("empty") else v.get("torch") or "kernel"
            setup = {"device": device, "kind": kind, "folder": v.get("folder"),
                     "knobs": v.get("knobs", {}), "contract_folder": self.spec["contract_folder"]}
            if device == "cuda":
                events = (gpu_ipc.IpcEvent(), gpu_ipc.IpcEvent())
                setup["events"] = {"go": events[0].handle(), "done": events[1].handle()}
                setup["events_objects"] = events
            setups[label] = setup
            self.progress(label, "build")
        for step in ("configure", "built"):  # (every launcher builds while the others do)
            for label, launcher in list(out.items()):
                try:
                    if step == "configure":
                        launcher.configure(setups[label])
                    else:
                        launcher.built(self.spec.get("build_timeout_s", 3600))
                except LauncherFailed as exc:
                    self.fail(label, exc.reason, Outcome.CRASH)
                    launcher.kill()
                    del out[label]
        return out

    def go(self) -> Release:
        """Wait until the parent names the variants that passed the judge; the others'
        launchers are killed."""
        go = Path(self.spec["go"])
        while not go.exists():
            time.sleep(0.02)
        release = json.loads(go.read_text())
        labels = [label for label in release["labels"]
                  if label in self.launchers or label in self.failed]
        for label in list(self.launchers):
            if label not in labels and label != BRACKET:
                self.launchers.pop(label).kill()
        return Release(labels, release.get("select", False), release.get("replay"))

    def fail(self, label: str, reason: str, kind: str = Outcome.FAIL) -> None:
        self.failed.setdefault(label, {"reason": reason, "kind": kind})
        launcher = self.launchers.get(label)
        if launcher is not None and kind != Outcome.FAIL:
            launcher.kill()

    def lost(self, exc: LauncherFailed) -> None:
        """A launcher crashed, hung or raised: dropped; without the incumbent (or the empty
        launcher that calibrates the bracket), nothing compares."""
        self.progress(exc.label, "failed", reason=exc.reason)
        if exc.label in (INCUMBENT, CONTROL, BRACKET):
            raise exc
        self.fail(exc.label, exc.reason, Outcome.CRASH)
        launcher = self.launchers.pop(exc.label, None)
        if launcher is not None:
            launcher.kill()

    def active(self, labels: list[str]) -> list[str]:
        return [label for label in labels if label not in self.failed and label in self.launchers]

    # ---- turns ----------------------------------------------------------------------------
    def _sweep(self) -> dict[int, list[int]]:
        """Between turns no process runs below the timer but its launchers and their groups
        (stopped with them): whatever kernel code started in a session of its own (a daemon
        comes back here: the timer is a subreaper) is killed before another variant's turn.
        Returns the processes of each launcher's group, by group."""
        groups: dict[int, list[int]] = {launcher.proc.pid: []
                                        for launcher in self.launchers.values()}
        table = spawn.process_table()
        for pid in spawn.descendants_in(table, os.getpid()):
            # a launcher's own group is stopped with it between turns; the timer's own helpers
            # (torch's shared-memory manager) were there before any kernel code
            if table[pid].group in groups:
                groups[table[pid].group].append(pid)
                continue
            if pid in self.own:
                continue
            try:
                os.kill(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
        return groups

    def turn(self, label: str) -> list[int]:
        """Before a launcher's batch: strays killed, every other launcher stopped for good (a
        thread still working in the kernel is waited for), and its processes set back to the
        timer's own scheduling (perfloop.referee.scheduling), which another launcher may have
        changed. Returns its processes."""
        launcher = self.launchers[label]
        groups = self._sweep()
        self._others_stopped(groups, launcher.proc.pid)
        mine = groups.get(launcher.proc.pid) or [launcher.proc.pid]
        failed = scheduling.reset(mine, self.sched)
        if failed:
            raise LauncherFailed(label, "its scheduling was changed and could not be set back "
                                        f"({failed[0]}): no batch of it can be timed fairly")
        return mine

    def _others_stopped(self, groups: dict[int, list[int]], running: int) -> None:
        """Wait until no thread of another launcher's group runs: a stopped process still
        finishes the system call it is in (madvise over 1.5 GiB took seconds), beside the
        next batch. A launcher that keeps working past the grace is dropped."""
        others = {pid: pids for pid, pids in groups.items() if pid != running}
        busy = scheduling.busy_until_stopped([p for pids in others.values() for p in pids],
                                             scheduling.STOP_GRACE_S)
        for label, launcher in list(self.launchers.items()):
            if set(others.get(launcher.proc.pid, ())) & set(busy):
                self.lost(LauncherFailed(label, "kept working while stopped (a thread in "
                                                "the kernel past its turn, "
                                                f"{scheduling.STOP_GRACE_S:.0f} s)"))

    def ask(self, label: str, message: dict, **how) -> dict:
        """A launcher's task other than a timed batch (its slots, its first launch): a turn as
        a batch is, since its process runs meanwhile."""
        mine = self.turn(label)
        answer = self.launchers[label].ask(message, **how)
        self.after_turn(label, mine)
        return answer

    def after_turn(self, label: str, mine: list[int]) -> None:
        """After a launcher's batch: it did not raise its own scheduling, and left the timer's
        own (its priority, autogroup, CPUs, resource limits: any process of its user may
        change them, and only this launcher ran) as they were, or set back here."""
        gained = scheduling.gained(mine, self.sched)
        if gained:
            raise LauncherFailed(label, f"changed its own scheduling while timed: {gained[0]}")
        changed = scheduling.restore_own(self.sched, self.limits)
        if changed:
            raise LauncherFailed(label, f"changed the trusted timer's {changed[0]} while timed")

    def close(self) -> None:
        for launcher in self.launchers.values():
            launcher.kill()
        spawn.kill_descendants(spare=self.own)  # torch's manager may serve a process after us


def own_helpers() -> set[int]:
    """The processes the timer itself runs below it: torch's shared-memory manager, started
    here by sharing a first tensor, before any launcher."""
    import torch
    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy("file_system")
    torch.zeros(1).share_memory_()
    return set(spawn.descendants())


# ---- the clocks ------------------------------------------------------------------------------
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
