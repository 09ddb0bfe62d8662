"""The timing harness: warm-up and repetitions set by time, variants timed in alternating
rounds in one process, raw samples kept, and one randomly chosen repetition of every batch
checked against the reference on fresh inputs.

The clock is pluggable: CUDA events on a GPU (CudaClock), or a kernel's own Clock (scripted
test kernels). A clock has `time_batch(fn, reps, before) -> [ms]` and `describe() -> dict`;
`before(i)` runs ahead of repetition i, outside the timed window.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

from perfloop.contract.device_clock import CudaClock, host_us, pad_for  # noqa: F401
from perfloop.contract.playbook import Measure


class Clock(Protocol):
    def time_batch(self, fn: Callable[[], object], reps: int,
                   before: Callable[[int], None] | None = None) -> list[float]: ...
    def describe(self) -> dict: ...


def warm_up(clock: Clock, fn, warmup_ms: float, give_up_ms: float | None = None,
            reset: Callable[[], None] | None = None) -> float:
    """Run until warmup_ms of kernel time has passed; return the typical time of one run.
    Past give_up_ms per run (two runs agreeing), it returns at once: a cliff is plain to see.
    `reset` runs ahead of each run, outside the timed window."""
    before = None if reset is None else (lambda i: reset())
    clock.time_batch(fn, 1, before)  # first launch: compilation, module load
    spent = 0.0
    recent: list[float] = []
    clean: list[float] = []
    while spent < warmup_ms or len(recent) < 3:
        sample = clock.time_batch(fn, 1, before)[0]
        spent += max(sample, 1e-3)
        recent = (recent + [sample])[-5:]
        if not getattr(clock, "host_bound", None):  # (a host-bound sample holds idle time)
            clean = (clean + [sample])[-2:]
        if give_up_ms is not None and len(clean) == 2 and min(clean) > give_up_ms:
            return min(clean)
    return statistics.median(recent)


@dataclass
class Verified:
    """What the verified repetitions of one variant showed."""

    passed: bool = True
    failures: list = field(default_factory=list)     # [{round, detail}] of the rounds that failed
    verified_ms: list = field(default_factory=list)  # the verified repetitions' times
    other_ms: list = field(default_factory=list)     # all other repetitions' times
    dropped: int = 0                                 # repetitions dropped: host outran the pad


class Verifier(Protocol):
    """Poison before every repetition; fresh inputs and their reference for the verified one;
    a copy of its output; the check of that copy. Optionally `reset`, run before every call
    (warm-up and host timing too): in-place inputs restored, scratch poisoned."""

    def before_each(self) -> None: ...
    def fresh(self, round_index: int, label: str) -> None: ...
    def snapshot(self) -> None: ...
    def check(self) -> dict: ...


@dataclass(frozen=True)
class Rounds:
    reps: int
    rounds: dict                                   # label -> [[samples of one round]]
    host_us: dict                                  # label -> [host time per call]
    pad_us: float
    checked: dict = field(default_factory=dict)    # label -> Verified
    cliffs: dict = field(default_factory=dict)     # label -> warm-up time / the first label's

    def to_json(self) -> dict:
        return {"reps": self.reps, "rounds": self.rounds, "host_us": self.host_us,
                "pad_us": self.pad_us, "checked": {k: asdict(v) for k, v in self.checked.items()},
                "cliffs": self.cliffs}


def alternating(clock: Clock, launchers: dict[str, Callable], settings: Measure,
                verifier: Verifier | None = None, rng: random.Random | None = None,
                unverified: set | frozenset = frozenset(),
                on_batch: Callable[[str], None] = lambda label: None) -> Rounds:
    """Time every variant in each round, in an order that reverses every round, so slow drift
    of clocks or temperature falls on all variants alike. In each batch one repetition, at a
    random place, runs on fresh inputs and its output is checked (with a verifier; except for
    `unverified` labels, whose output is only poisoned). With settings.cliff_ratio, a checked
    variant whose warm-up runs that many times slower than the first label's (the incumbent)
    is not timed further: it is listed in `cliffs`."""
    rng = rng or random.Random()
    labels = list(launchers)
    host = {}
    # in-place inputs restored (scratch poisoned) before every call, timed or not, so that no
    # call runs on what earlier calls left behind; None for kernels without such hooks
    reset = getattr(verifier, "reset", None)
    for label in labels:
        on_batch(label)
        if reset is not None:
            reset()
        launchers[label]()  # first call: compile, load, and any autotuning, outside the host timing
        host[label] = host_us(launchers[label], 10, reset)
    padded = hasattr(clock, "pad_us")
    if padded:  # warm-up estimates must hold no host time, or a host-heavy launch looks a cliff
        setattr(clock, "pad_us", max(pad_for(hs) for hs in host.values()))
    estimates: dict[str, float] = {}
    cliffs: dict[str, float] = {}
    cliff = getattr(settings, "cliff_ratio", None)
    for label in list(labels):
        on_batch(label)
        give_up = (cliff * estimates[labels[0]] if cliff and estimates.get(labels[0], 0) > 0
                   and label not in unverified else None)
        estimates[label] = warm_up(clock, launchers[label], settings.warmup_ms, give_up, reset)
        if give_up is not None and estimates[label] > give_up:
            # a slow start is not a cliff, which stays slow when retried
            # (docs/findings/2026-11-25-timer-measurements.md)
            estimates[label] = warm_up(clock, launchers[label], settings.warmup_ms, give_up,
                                       reset)
        if give_up is not None and estimates[label] > give_up:
            cliffs[label] = estimates.pop(label) / estimates[labels[0]]
    labels = [label for label in labels if label not in cliffs]
    if padded:
        setattr(clock, "pad_us", pad_for([h for label in labels for h in host[label]]))
    typical = max(statistics.median(estimates.values()), 1e-4)
    reps = int(min(max(settings.round_ms / typical, settings.min_reps), settings.max_reps))
    rounds: dict[str, list[list[float]]] = {label: [] for label in labels}
    checked = {label: Verified() for label in labels}
    for r in range(settings.rounds):
        for label in labels if r % 2 == 0 else reversed(labels):
            on_batch(label)
            samples = _batch(clock, launchers[label], reps, verifier, r, label, rng,
                             checked[label], check=label not in unverified)
            rounds[label].append(samples)
    return Rounds(reps, rounds, host, getattr(clock, "pad_us", 0.0), checked, cliffs)


def _batch(clock, fn, reps, verifier, round_index, label, rng, checked: Verified,
           check: bool = True) -> list[float]:
    """One variant's repetitions of one round. With a verifier, one of them (at a random place,
    so a kernel cannot count its way to it) runs on fresh inputs and its output is checked.
    Repetitions whose host time outgrew the pad may hold GPU idle time: they are dropped, and
    if that is most of the batch, it is timed again with a pad twice as long."""
    k = rng.randrange(reps)
    check = check and verifier is not None

    def before(i):
        if check and i == k + 1:
            verifier.snapshot()  # the checked repetition's output, before it is poisoned again
        verifier.before_each()   # every variant's output is poisoned alike
        if check and i == k:
            verifier.fresh(round_index, label)

    for _attempt in range(4):
        samples = clock.time_batch(fn, reps, before if verifier else None)
        if check and k == reps - 1:
            verifier.snapshot()
        bound = set(getattr(clock, "host_bound", ()))
        if len(bound) <= reps // 2:
            break
        clock.pad_us *= 2
    if check:
        result = verifier.check()
        if not result["passed"]:
            checked.passed = False
            checked.failures.append({"round": round_index, **result})
        if k not in bound:
            checked.verified_ms.append(samples[k])
        checked.other_ms.extend(s for i, s in enumerate(samples) if i != k and i not in bound)
    kept = [s for i, s in enumerate(samples) if i not in bound]
    if not kept:  # every repetition outran even the longest pad: an overestimate beats nothing
        return samples
    checked.dropped += len(bound)
    return kept


def method(clock: Clock, settings: Measure, reps: int) -> dict:
    return {**clock.describe(), **asdict(settings), "reps_per_round": reps,
            "order": "alternating, reversed every round"}
