"""Which CUDA streams a call puts work on. CUDA events time one stream; a kernel that moves
part of its work to another stream finishes "early" on the timed one. One call per variant
and shape runs under the profiler (CUPTI), and any GPU activity off the timed stream fails
the variant."""

from __future__ import annotations

from typing import Callable


def off_stream_activity(fn: Callable[[], object]) -> list[str] | None:
    """Names of GPU activities that `fn` ran on a stream other than the current one, or None
    when the profiler is not available here (then nothing can be said)."""
    import torch

    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    marker = torch.empty(1, device="cuda")
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            marker.fill_(1.0)          # known to run on the timed stream: its id is the reference
            torch.cuda.synchronize()
            fn()
            torch.cuda.synchronize()
        events = [e for e in prof.profiler.kineto_results.events()
                  if e.device_type() == torch.autograd.DeviceType.CUDA]
    except Exception:  # no CUPTI, no permission, an old torch: the check is skipped, and said so
        return None
    if not events:
        return None
    events.sort(key=lambda e: e.start_ns())
    timed = events[0].device_resource_id()
    return sorted({e.name() for e in events[1:] if e.device_resource_id() != timed})
