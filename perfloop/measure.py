"""The timing harness: warm-up and repetitions set by time, variants timed in alternating
rounds in one process, raw samples kept. The clock is pluggable: CUDA events with an L2
flush before every repetition on a GPU, or a kernel's own Clock (scripted test kernels)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Callable, Protocol

from perfloop.playbook import Measure


class Clock(Protocol):
    def time_batch(self, fn: Callable[[], object], reps: int) -> list[float]: ...
    def describe(self) -> dict: ...


class CudaClock:
    """CUDA events around each launch; before each, a buffer twice the L2 size is written so
    every repetition starts with the inputs out of L2."""

    def __init__(self, device="cuda"):
        import torch

        self.torch = torch
        props = torch.cuda.get_device_properties(device)
        self.flush_bytes = max(2 * props.L2_cache_size, 64 << 20)
        self.flush = torch.empty(self.flush_bytes, dtype=torch.int8, device=device)

    def time_batch(self, fn, reps):
        cuda = self.torch.cuda
        events = [(cuda.Event(enable_timing=True), cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for start, end in events:
            self.flush.zero_()
            start.record()
            fn()
            end.record()
        cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]

    def describe(self):
        return {"clock": "cuda-events", "l2_flush_bytes": self.flush_bytes}


def warm_up(clock: Clock, fn, warmup_ms: float) -> float:
    """Run until warmup_ms of kernel time has passed; return the typical time of one run."""
    clock.time_batch(fn, 1)  # first launch: compilation, module load
    spent, recent = 0.0, []
    while spent < warmup_ms or len(recent) < 3:
        sample = clock.time_batch(fn, 1)[0]
        spent += max(sample, 1e-3)
        recent = (recent + [sample])[-5:]
    return statistics.median(recent)


@dataclass(frozen=True)
class Rounds:
    reps: int
    rounds: dict  # label -> list (one per round) of lists of samples in ms


def alternating(clock: Clock, launchers: dict[str, Callable], settings: Measure) -> Rounds:
    """Time every variant in each round, in an order that reverses every round, so slow drift
    of clocks or temperature falls on all variants alike."""
    labels = list(launchers)
    estimates = {label: warm_up(clock, launchers[label], settings.warmup_ms) for label in labels}
    typical = max(statistics.median(estimates.values()), 1e-4)
    reps = int(min(max(settings.round_ms / typical, settings.min_reps), settings.max_reps))
    rounds = {label: [] for label in labels}
    for r in range(settings.rounds):
        for label in labels if r % 2 == 0 else reversed(labels):
            rounds[label].append(clock.time_batch(launchers[label], reps))
    return Rounds(reps, rounds)


def method(clock: Clock, settings: Measure, reps: int) -> dict:
    return {**clock.describe(), **asdict(settings), "reps_per_round": reps,
            "order": "alternating, reversed every round"}
