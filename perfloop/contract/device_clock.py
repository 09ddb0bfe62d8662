"""Device time of one call on a GPU, without host time or another call's L2 traffic in it:
what a launch that tunes once among finalists times (perfloop.contract.tuneonce), and the
timer's warm-up and ceilings. The loop's keep or revert is timed differently: batches of
launches back to back over several input slots (perfloop.referee.launchers.GpuClock). The
two can rank configs that differ by under 5% differently
(docs/findings/2026-11-27-workload-bar.md, "Which timer")."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable


class CudaClock:
    """Device time of one call, with neither host time nor someone else's memory traffic in it.

    Before each repetition, outside the timed window:
      - a read of a buffer twice the L2 size evicts the inputs from L2. It only reads, so it
        leaves no dirty lines whose write-back would land in the next timed kernel (a zero_
        flush does: measured on an H100, +10 us on a 117 MB read-only reduction);
      - a sleep kernel keeps the GPU busy while the host issues the call, so the GPU never
        idles inside the window waiting for the host. Its length (`pad_us`) is set from the
        host time of the variants being timed, and repetitions whose host time outgrew it are
        counted (`host_bound`), so the caller can lengthen the pad and time them again.
    Events are bound to torch's C classes when the clock is made, before any kernel code is
    imported, so replacing torch.cuda.Event afterwards does not change what is measured.
    """

    def __init__(self, device="cuda"):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        props = torch.cuda.get_device_properties(self.device)
        self.flush_bytes = max(2 * props.L2_cache_size, 64 << 20)
        self._flush_buf = torch.ones(self.flush_bytes // 8, dtype=torch.int64, device=self.device)
        self._sink = torch.empty((), dtype=torch.int64, device=self.device)
        self._sum, self._sleep, self._sync = torch.sum, torch.cuda._sleep, torch.cuda.synchronize
        self._event = torch.cuda.Event
        self._elapsed = torch._C._CudaEventBase.elapsed_time
        record, self.stream = torch._C._CudaEventBase.record, torch.cuda.current_stream(self.device)
        self._record = lambda event: record(event, self.stream)
        self.cycles_per_us = self._calibrate()
        self.pad_us = 20.0
        self.host_bound: list[int] = []  # repetitions of the last batch whose host time outgrew the pad

    def flush(self) -> None:
        self._sum(self._flush_buf, dim=0, out=self._sink)

    def _calibrate(self) -> float:
        """Sleep-kernel cycles per microsecond, measured (clocks vary by GPU and by load)."""
        cycles = 1_000_000
        self._sleep(cycles)
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        times = []
        for _ in range(3):
            self._record(start)
            self._sleep(cycles)
            self._record(end)
            self._sync()
            times.append(self._elapsed(start, end))
        return cycles / (statistics.median(times) * 1000.0)

    def time_batch(self, fn, reps, before=None):
        events = [(self._event(enable_timing=True), self._event(enable_timing=True))
                  for _ in range(reps)]
        cycles = int(self.pad_us * self.cycles_per_us)
        limit = self.pad_us * 1e-6
        bound = []
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            for i, (start, end) in enumerate(events):
                if before is not None:
                    before(i)
                self.flush()
                self._sleep(cycles)
                self._record(start)
                t0 = time.perf_counter()
                fn()
                if time.perf_counter() - t0 > limit:
                    bound.append(i)
                self._record(end)
            self._sync()
        finally:
            if gc_was_on:
                gc.enable()
        self.host_bound = bound
        return [self._elapsed(start, end) for start, end in events]

    def describe(self):
        return {"clock": "cuda-events", "l2_flush": "read-only sum", "l2_flush_bytes":
                self.flush_bytes, "pad": "sleep kernel ahead of each call, longer than its "
                "host time", "sleep_cycles_per_us": round(self.cycles_per_us, 1)}


def host_us(fn: Callable[[], object], calls: int,
            reset: Callable[[], None] | None = None) -> list[float]:
    """Host time of each call, in microseconds (what launching costs the CPU); `reset` runs
    ahead of each call, untimed."""
    out = []
    for _ in range(calls):
        if reset is not None:
            reset()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def pad_for(host_samples: list[float]) -> float:
    """A sleep long enough that the host usually finishes issuing the call before the GPU gets
    to it; the repetitions where it does not are found afterwards (CudaClock.host_bound)."""
    return max(20.0, 2.0 * statistics.median(host_samples) + 20.0)
