"""The device's ceilings, measured once per device and cached in sandbox/: copy bandwidth
(bytes read plus written by a large device-to-device copy) and bf16 matrix throughput."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from perfloop.atomic import write_json
from perfloop.measure import CudaClock


def _measure(clock: CudaClock) -> dict:
    torch = clock.torch
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = lambda: dst.copy_(src)  # noqa: E731
    clock.time_batch(copy, 3)
    copy_ms = statistics.median(clock.time_batch(copy, 20))
    del src, dst
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn_like(a)
    mm = lambda: a @ b  # noqa: E731
    clock.time_batch(mm, 3)
    mm_ms = statistics.median(clock.time_batch(mm, 10))
    return {"copy_gbps": 2 * (1 << 30) / copy_ms / 1e6, "copy_ms": copy_ms,
            "bf16_tflops": 2 * n**3 / mm_ms / 1e9, "matmul_ms": mm_ms,
            "method": "median of CUDA-event times, L2 flushed: 1 GiB copy_, 8192^3 bf16 matmul"}


def device_key(env: dict) -> str:
    return f"{env.get('gpu_name')}|driver {env.get('driver')}|torch {env.get('torch')}"


def get(cache: Path, env: dict, clock: CudaClock) -> dict:
    known = json.loads(cache.read_text()) if cache.exists() else {}
    key = device_key(env)
    if key not in known:
        known[key] = _measure(clock)
        write_json(cache, known)
    return {**known[key], "device": key}


def floor_ms(bytes_moved: float, flops: float, ceilings: dict) -> float:
    return max(bytes_moved / (ceilings["copy_gbps"] * 1e6),
               flops / (ceilings["bf16_tflops"] * 1e9))
