"""Tune once among a run's finalists, for a launch in a bucket the run never measured (seed
000's tune-once, cache, launch): each finalist (the knobs a measured bucket runs, or a config
kernel.toml's [workload] declares) is launched a few times on the caller's own inputs, the
fastest is kept in memory and on disk (perfloop.contract.autotune.DiskCache), and every later
launch in that bucket runs it.

Timed on a GPU by the device time of one call (perfloop.contract.device_clock; the loop's timer
times launches back to back instead), else by the wall clock, as the loop's timer times a
CPU kernel. The output is
written by the finalist that runs last, the winner, so what the caller gets is the winner's
result.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from perfloop.contract.autotune import DiskCache
from perfloop.contract.device_clock import CudaClock, host_us, pad_for

MAX_MEASURED = 4    # the nearest measured buckets' distinct knobs
MAX_FINALISTS = 8   # with kernel.toml's declared finalists (perfloop.contract.workload)
REPS = 5
GPU_REPS = 15   # a device-time sample costs ~0.1 ms (L2 eviction, pad): medians of 15


class UnseenBucket(UserWarning):
    """A launch in a bucket that no benchmark shape fell in: what it runs, and how chosen."""


def _device(inputs) -> str:
    first = next((x for x in inputs if hasattr(x, "device")), None)
    if first is None or str(first.device) == "cpu":
        return "cpu"
    import torch

    return f"{torch.cuda.get_device_name(first.device)} ({first.device})"


def _timer(inputs) -> Callable[[Callable[[], object]], float]:
    """median milliseconds of REPS calls of fn (GPU_REPS on a GPU), by device time or the wall
    clock."""
    if _device(inputs) != "cpu":
        # Device time as the timer takes it (L2 evicted, the host's launch hidden behind a
        # sleep): events around one lone launch also hold its host time, which for a launch
        # of a few microseconds is most of the reading (kernels/rmsnorm/NOTES.md)
        import torch

        device = next(x for x in inputs if hasattr(x, "device")).device
        with torch.cuda.device(device):   # (its sleep and synchronize: the inputs' GPU)
            clock = CudaClock(device)

        def cuda(fn) -> float:
            with torch.cuda.device(device):
                clock.pad_us = pad_for(host_us(fn, 3))
                times = clock.time_batch(fn, GPU_REPS)
                if clock.host_bound:   # the host outran the pad: once more, with a longer one
                    clock.pad_us *= 4
                    times = clock.time_batch(fn, GPU_REPS)
            return statistics.median(times)
        return cuda

    def wall(fn) -> float:
        times = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    return wall


def _may_pass(exc: BaseException) -> bool:
    """An error that another try may not meet: memory, which another process may hold."""
    return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()


def identity(kernel: Path, table: dict, bucket: str, finalists: list[str], inputs) -> dict:
    """What decides the winner: the kernel's source, the knobs, the bucket, the finalists and
    the device (a change of any misses the disk cache)."""
    source = (Path(kernel) / "kernel.py").read_bytes() if (Path(kernel) / "kernel.py").exists() \
        else b""
    return {"kernel": f"tuneonce-{Path(kernel).name}",
            "source_sha256": hashlib.sha256(source).hexdigest(),
            "knobs": json.dumps(table, sort_keys=True, default=str), "key": bucket,
            "device": _device(inputs), "space": list(finalists)}


def choose(bucket: str, finalists: dict[str, Callable], inputs, out, extra: tuple,
           ident: dict, cache: DiskCache | None = None) -> tuple[str, str]:
    """(the finalist to run in `bucket`, how it was chosen): from the disk cache, else timed
    here on these inputs. `finalists`: {the bucket it comes from: its launch}."""
    cache = cache or DiskCache()
    found = cache.get(ident)
    if found is not None:
        return found, "tuned once before (disk cache)"
    timed = _timer(inputs)
    ms: dict[str, float] = {}
    failed: dict[str, str] = {}
    passing = False
    for name, launch in finalists.items():
        try:
            launch(inputs, out, *extra)  # its first call may compile
            # (the ignore: mypy cannot infer a lambda whose argument has a default)
            ms[name] = timed(lambda launch=launch: launch(inputs, out, *extra))  # type: ignore[misc]
        except Exception as exc:  # one finalist that cannot run these inputs is no winner
            if not ms and len(failed) == len(finalists) - 1:
                raise               # nor is any: the caller sees the last one's error
            failed[name] = f"{type(exc).__name__}: {str(exc).strip()[:120]}"
            passing = passing or _may_pass(exc)
    best = min(ms, key=ms.__getitem__)
    if not passing:   # memory another process holds may be free next time: then not cached
        cache.put(ident, best, {"median_ms": ms, "failed": failed})
    said = ", ".join([f"{k} {v:.4g} ms" for k, v in ms.items()]
                     + [f"{k} failed ({why})" for k, why in failed.items()])
    warnings.warn(f"perfloop.dispatch: bucket {bucket} was not measured by the run; tuned once "
                  f"among {len(ms)} finalists ({said}): runs {best}'s knobs ("
                  + (f"cached in {cache.directory})" if not passing else "not cached: a finalist "
                     "ran out of memory)"), UnseenBucket, stacklevel=3)
    return best, f"tuned once among {len(ms)} finalists"
