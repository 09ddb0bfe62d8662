"""Every timed batch runs under the timer's own CPU scheduling, and no launcher changes the
timer's.

A process may change the scheduling of another of its user's processes, stopped or not: its
nice value, its policy (SCHED_IDLE, SCHED_BATCH), the CPUs it may run on, its session's
autogroup weight (/proc/<pid>/autogroup), its resource limits. A red-team candidate gave the
incumbent's launcher SCHED_IDLE from its own launcher; the change outlives the candidate's
turn, so the incumbent would run its batches deprioritized for the rest of the experiment;
another raised its own session's weight with `echo -20 > /proc/self/autogroup`. The timer
therefore sets, before each batch, every thread of the launcher about to be timed (and of the
processes of its group) back to what the timer itself runs with, and after the batch reads
them again: a launcher that raised its own priority or weight, took another policy or CPUs
beyond the timer's while timed is failed. After each batch the timer also reads its own
scheduling and limits (only that launcher ran meanwhile): a change is set back and the
launcher failed. (Narrowing its own CPUs only slows it: OpenMP binds threads so.) A stopped
launcher still finishes the system call it is in; the next batch waits until none works.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

from perfloop.isolation import spawn

STOP_GRACE_S = 10.0   # for a stopped launcher's threads to leave the kernel
LIMITS = {name: getattr(resource, name) for name in (
    "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_RSS",
    "RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_AS", "RLIMIT_SIGPENDING",
    "RLIMIT_MSGQUEUE", "RLIMIT_NICE", "RLIMIT_RTPRIO", "RLIMIT_RTTIME") if hasattr(resource, name)}

POLICIES = {getattr(os, name): name for name in
            ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE", "SCHED_FIFO", "SCHED_RR")
            if hasattr(os, name)}


@dataclass(frozen=True)
class Sched:
    policy: int
    nice: int
    cpus: frozenset[int]
    autogroup: int | None = None   # the nice value of its session's autogroup, where enabled

    def show(self) -> str:
        weight = "" if self.autogroup is None else f", autogroup nice {self.autogroup}"
        return (f"{POLICIES.get(self.policy, self.policy)}, nice {self.nice}{weight}, "
                f"{len(self.cpus)} CPUs")


def autogroup(pid: int | str) -> int | None:
    """The nice value of the process's autogroup (None where the kernel has none)."""
    try:
        with open(f"/proc/{pid}/autogroup", encoding="ascii") as f:
            return int(f.read().split("nice")[1])
    except (OSError, ValueError, IndexError):
        return None


def own() -> Sched:
    """The calling thread's scheduling: what every launcher is set back to."""
    return Sched(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0),
                 frozenset(os.sched_getaffinity(0)), autogroup("self"))


def of_thread(tid: int) -> Sched | None:
    """A thread's scheduling, None once it is gone."""
    try:
        fields = spawn.stat_fields(tid)
        return Sched(int(fields[38]), int(fields[16]), frozenset(os.sched_getaffinity(tid)),
                     autogroup(tid))
    except (OSError, ValueError, IndexError):
        return None


def _set(tid: int, have: Sched, want: Sched) -> None:
    if have.policy != want.policy:
        os.sched_setscheduler(tid, want.policy, os.sched_param(0))
    if have.nice != want.nice:
        os.setpriority(os.PRIO_PROCESS, tid, want.nice)
    if have.cpus != want.cpus:
        os.sched_setaffinity(tid, want.cpus)
    if have.autogroup != want.autogroup and want.autogroup is not None:
        with open(f"/proc/{tid}/autogroup", "w", encoding="ascii") as f:
            f.write(str(want.autogroup))


def threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def reset(pids: list[int], want: Sched) -> list[str]:
    """Set every thread of `pids` to `want`; what could not be set back, described."""
    failed = []
    for pid in pids:
        for tid in threads(pid):
            have = of_thread(tid)
            if have is None or have == want:
                continue
            try:
                _set(tid, have, want)
            except ProcessLookupError:
                continue
            except OSError as exc:
                failed.append(f"thread {tid} ({have.show()}): {exc.strerror}")
    return failed


def gained(pids: list[int], want: Sched) -> list[str]:
    """Threads of `pids` that run with more than `want` gives: a higher priority (a lower
    nice value), another policy, or CPUs outside `want`'s."""
    out = []
    for pid in pids:
        for tid in threads(pid):
            have = of_thread(tid)
            if have is None:
                continue
            if (have.policy != want.policy or have.nice < want.nice
                    or not have.cpus <= want.cpus or _weightier(have, want)):
                out.append(f"thread {tid} ran with {have.show()} (the timer's: {want.show()})")
    return out


def _weightier(have: Sched, want: Sched) -> bool:
    return have.autogroup is not None and want.autogroup is not None \
        and have.autogroup < want.autogroup


def own_limits() -> dict[str, tuple[int, int]]:
    """This process's resource limits, by name."""
    return {name: resource.getrlimit(r) for name, r in LIMITS.items()}


def restore_own(want: Sched, limits: dict[str, tuple[int, int]]) -> list[str]:
    """What of this process's scheduling (its main thread's) and resource limits differs from
    `want` and `limits`, each set back where it can be; described."""
    changed = []
    have = of_thread(os.getpid())
    if have is not None and have != want:
        changed.append(f"scheduling ({have.show()}; its own: {want.show()})")
        try:
            _set(os.getpid(), have, want)
        except OSError:
            pass
    for name, was in limits.items():
        now = resource.getrlimit(LIMITS[name])
        if now != was:
            changed.append(f"limit {name} ({now}; its own: {was})")
            try:
                resource.setrlimit(LIMITS[name], was)
            except (OSError, ValueError):
                pass
    return changed


def busy(pids: list[int]) -> list[int]:
    """Those of `pids` with a thread running or in an uninterruptible wait (not stopped)."""
    out = []
    for pid in pids:
        for tid in threads(pid):
            try:
                state = spawn.stat_fields(tid)[0]
            except (OSError, IndexError):
                continue
            if state in (b"R", b"D"):
                out.append(pid)
                break
    return out


def busy_until_stopped(pids: list[int], grace_s: float) -> list[int]:
    """Wait up to `grace_s` for every thread of `pids` to stop working; those still busy."""
    until = time.monotonic() + grace_s
    while True:
        left = busy(pids)
        if not left or time.monotonic() > until:
            return left
        time.sleep(0.001)
        pids = left
