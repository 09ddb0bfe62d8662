"""The device's ceilings: memory bandwidth (bytes read plus written by a large device-to-device
copy, or by a large add, whichever moves more per second: a floor that a plain elementwise
kernel beats would stop a run at the "roofline" while it is still behind) and bf16 matrix
throughput, measured once per device and cached in sandbox/. The floor of a kernel's time
(perfloop.contract.roofline) uses the architecture's peaks, not the measured matmul: a matmul that
beats cuBLAS is not a broken measurement."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from perfloop.core.atomic import write_json
from perfloop.contract.roofline import peak_tensor_tflops, unit_peaks_tflops
from perfloop.referee.clock import CudaClock

COPY_BYTES, MATMUL_N = 1 << 30, 8192
def _median_ms(clock: CudaClock, fn, reps: int) -> float:
    clock.time_batch(fn, 3)
    return statistics.median(clock.time_batch(fn, reps))  # a few calls: the default pad is ample


def _copy_ms(clock: CudaClock) -> float:
    src = clock.torch.empty(COPY_BYTES, dtype=clock.torch.uint8, device="cuda")
    dst = clock.torch.empty_like(src)
    return _median_ms(clock, lambda: dst.copy_(src), 20)


def _add_ms(clock: CudaClock) -> float:
    """c = a + b over three buffers of COPY_BYTES / 2: two reads and a write, the pattern of
    elementwise kernels, which on an H100 moved 4.5% more bytes per second than copy_."""
    n = COPY_BYTES // 2 // 2
    a = clock.torch.empty(n, dtype=clock.torch.bfloat16, device="cuda").fill_(1)
    b, c = clock.torch.empty_like(a).fill_(2), clock.torch.empty_like(a)
    return _median_ms(clock, lambda: clock.torch.add(a, b, out=c), 20)


def _matmul_ms(clock: CudaClock) -> float:
    a = clock.torch.randn(MATMUL_N, MATMUL_N, dtype=clock.torch.bfloat16, device="cuda")
    b = clock.torch.randn_like(a)
    return _median_ms(clock, lambda: a @ b, 10)


def _measure(clock: CudaClock) -> dict:
    copy_ms, add_ms, mm_ms, n = _copy_ms(clock), _add_ms(clock), _matmul_ms(clock), MATMUL_N
    copy_gbps, add_gbps = 2 * COPY_BYTES / copy_ms / 1e6, 1.5 * COPY_BYTES / add_ms / 1e6
    return {"copy_gbps": copy_gbps, "copy_ms": copy_ms, "add_gbps": add_gbps, "add_ms": add_ms,
            "bandwidth_gbps": max(copy_gbps, add_gbps),
            "bf16_tflops": 2 * n**3 / mm_ms / 1e9, "matmul_ms": mm_ms,
            "method": "median of CUDA-event times, L2 flushed by a read: 1 GiB copy_, add of "
                      "3 x 512 MiB, 8192^3 bf16 matmul; bandwidth = the faster of copy and add"}


CLOCK_VERSION = 3  # v2: read-only flush and a sleep pad; v3: add bandwidth. Older ceilings do not count


def device_key(env: dict) -> str:
    """What the ceilings depend on: the GPU, its software, its clock and power limits. A GPU
    whose limits were changed (or that was throttled by them) gets measured again."""
    return (f"{env.get('gpu_name')}|driver {env.get('driver')}|torch {env.get('torch')}"
            f"|power limit {env.get('power_limit')} W|max clocks {env.get('clock_sm_max')}/"
            f"{env.get('clock_mem_max')} MHz|app clock {env.get('clock_sm_app')} MHz"
            f"|clock v{CLOCK_VERSION}")






def get(cache: Path, env: dict, clock: CudaClock) -> dict:
    known = json.loads(cache.read_text()) if cache.exists() else {}
    key = device_key(env)
    if key not in known:
        known[key] = _measure(clock)
        write_json(cache, known)
    return {**known[key], "peak_tensor_tflops": peak_tensor_tflops(env),
            "unit_peaks_tflops": unit_peaks_tflops(env),
            "l2_bytes": env.get("l2_bytes"), "device": key}







