"""Which CUDA streams a call puts work on. CUDA events time one stream; a kernel that moves
part of its work to another stream finishes "early" on the timed one. One call per variant
and shape runs under the profiler (CUPTI), and any GPU activity off the timed stream fails
the variant."""

from __future__ import annotations

from typing import Callable


class Unavailable(Exception):
    """The profiler cannot say here (no CUPTI, no permission, an old torch)."""


def off_stream_activity(fn: Callable[[], object]) -> list[str]:
    """Names of GPU activities that `fn` ran on a stream other than the current one."""
    import torch

    marker = torch.empty(1, device="cuda")
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            marker.fill_(1.0)          # known to run on the timed stream: its id is the reference
            torch.cuda.synchronize()
            fn()
            torch.cuda.synchronize()
        events = [e for e in prof.profiler.kineto_results.events()
                  if e.device_type() == torch.autograd.DeviceType.CUDA]
    except Exception as exc:
        raise Unavailable(f"{type(exc).__name__}: {exc}") from None
    if not events:
        raise Unavailable("the profiler saw no GPU activity, not even its own marker")
    events.sort(key=lambda e: e.start_ns())
    timed = events[0].device_resource_id()
    return sorted({e.name() for e in events[1:] if e.device_resource_id() != timed})


def warm_up() -> None:
    """Start and stop the profiler once: its first start (CUPTI) takes seconds."""
    try:
        off_stream_activity(lambda: None)
    except Unavailable:
        pass
