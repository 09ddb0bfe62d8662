"""Every timed batch runs under the timer's own CPU scheduling.

A process may change the scheduling of another of its user's processes, stopped or not: its
nice value, its policy (SCHED_IDLE, SCHED_BATCH), the CPUs it may run on. A red-team
candidate gave the incumbent's launcher SCHED_IDLE from its own launcher; the change outlives
the candidate's turn, so the incumbent would run its batches deprioritized for the rest of the
experiment. The timer therefore sets, before each batch, every thread of the launcher about to
be timed (and of the processes of its group) back to what the timer itself runs with, and
after the batch reads them again: a launcher that raised its own priority, took another
policy or CPUs beyond the timer's while timed is failed. (Narrowing its own CPUs only slows it:
OpenMP binds threads so.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from perfloop.core import spawn

POLICIES = {getattr(os, name): name for name in
            ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE", "SCHED_FIFO", "SCHED_RR")
            if hasattr(os, name)}


@dataclass(frozen=True)
class Sched:
    policy: int
    nice: int
    cpus: frozenset[int]

    def show(self) -> str:
        return (f"{POLICIES.get(self.policy, self.policy)}, nice {self.nice}, "
                f"{len(self.cpus)} CPUs")


def own() -> Sched:
    """The calling thread's scheduling: what every launcher is set back to."""
    return Sched(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0),
                 frozenset(os.sched_getaffinity(0)))


def of_thread(tid: int) -> Sched | None:
    """A thread's scheduling, None once it is gone."""
    try:
        fields = spawn.stat_fields(tid)
        return Sched(int(fields[38]), int(fields[16]), frozenset(os.sched_getaffinity(tid)))
    except (OSError, ValueError, IndexError):
        return None


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
                if have.policy != want.policy:
                    os.sched_setscheduler(tid, want.policy, os.sched_param(0))
                if have.nice != want.nice:
                    os.setpriority(os.PRIO_PROCESS, tid, want.nice)
                if have.cpus != want.cpus:
                    os.sched_setaffinity(tid, want.cpus)
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
            if have.policy != want.policy or have.nice < want.nice or not have.cpus <= want.cpus:
                out.append(f"thread {tid} ran with {have.show()} (the timer's: {want.show()})")
    return out
