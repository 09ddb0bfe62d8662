"""The device's ceilings: memory bandwidth (bytes read plus written by a large device-to-device
copy, or by a large add, whichever moves more per second: a floor that a plain elementwise
kernel beats would stop a run at the "roofline" while it is still behind) and bf16 matrix
throughput, measured once per device and cached in sandbox/; and each execution unit's peak
(tensor cores by dtype, fp32 lanes, special-function units), from the architecture's rate per
SM and clock. The floor of a kernel's time uses the peaks, not the measured matmul: a matmul
that beats cuBLAS is not a broken measurement."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path

from perfloop.child.clock import CudaClock
from perfloop.core.atomic import write_json

COPY_BYTES, MATMUL_N = 1 << 30, 8192
# Dense rates per SM per clock of each execution unit (perfloop.core.traffic.UNITS): tensor cores
# by input dtype and fp32 lanes in FLOPs (an FMA counts 2), special-function units (MUFU: exp2,
# log2, rsqrt, rcp, sin, cos) in results. At the GPU's maximum SM clock each is a rate no
# kernel can exceed. Sources:
# - tensor.*, NVIDIA's architecture whitepapers. A100 ("NVIDIA A100 Tensor Core GPU
#   Architecture"): 4 tensor cores per SM of 256 dense FP16/BF16 FMA per clock = 2048 FLOPs,
#   TF32 half of it, no FP8; 312 TFLOP/s = 108 SMs x 1410 MHz x 2048. H100 ("NVIDIA H100
#   Tensor Core GPU Architecture"; developer.nvidia.com/blog/nvidia-hopper-architecture-in-depth,
#   table 3): "2x the MMA rates of the A100 SM on equivalent data types, and 4x ... using
#   FP8"; 989.4 TFLOP/s bf16 = 132 SMs x 1830 MHz x 4096, TF32 494.7, FP8 1978.9. B200 (HGX
#   B200 datasheet, 1000 W): dense BF16/FP16 2.25 PFLOP/s, TF32 1.1, FP8 4.5, i.e. 148 SMs x
#   ~1.86 GHz x 8192 / 4096 / 16384.
# - fp32: 64 FP32 lanes per SM on sm_80 (A100 whitepaper: 19.5 TFLOP/s = 108 x 1410 MHz x
#   128 FLOPs), 128 on sm_90 (H100 whitepaper: 128 FP32 cores per SM, "2x faster
#   clock-for-clock" than A100; 66.9 TFLOP/s = 132 x 1980 MHz x 256) and on sm_100 (128 FP32
#   cores per SM; HGX B200 datasheet: 80 TFLOP/s).
# - sfu: 16 results per SM per clock (4 per SM sub-partition) for 32-bit reciprocal, rsqrt,
#   log2, exp2, sine and cosine: the CUDA C++ Programming Guide's table "Throughput of Native
#   Arithmetic Instructions" (16 for cc 8.0, as quoted in
#   forums.developer.nvidia.com/t/sfu-performance-in-a100/197699; the same figure for 9.0 and
#   10.0).
UNIT_RATES_PER_SM_CLOCK = {
    "sm_80": {"tensor.bf16": 2048, "tensor.fp16": 2048, "tensor.tf32": 1024,
              "fp32": 128, "sfu": 16},
    "sm_90": {"tensor.bf16": 4096, "tensor.fp16": 4096, "tensor.tf32": 2048,
              "tensor.fp8": 8192, "fp32": 256, "sfu": 16},
    "sm_100": {"tensor.bf16": 8192, "tensor.fp16": 8192, "tensor.tf32": 4096,
               "tensor.fp8": 16384, "fp32": 256, "sfu": 16},
}
TENSOR_FLOPS_PER_SM_CLOCK = {arch: rates["tensor.bf16"]
                             for arch, rates in UNIT_RATES_PER_SM_CLOCK.items()}


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


def unit_peaks_tflops(env: dict) -> dict:
    """{unit: peak in T operations/s}: SMs x maximum SM clock x the architecture's rate per SM
    and clock; empty when the architecture, the clock or the SM count is unknown."""
    rates = UNIT_RATES_PER_SM_CLOCK.get(env.get("sm") or "", {})
    try:
        clock_mhz, sms = float(env["clock_sm_max"]), int(env["sm_count"])
    except (KeyError, TypeError, ValueError):
        return {}
    return {unit: rate * sms * clock_mhz * 1e6 / 1e12 for unit, rate in rates.items()}


def peak_tensor_tflops(env: dict) -> float | None:
    """The dense bf16 tensor-core peak; None when a fact is missing."""
    return unit_peaks_tflops(env).get("tensor.bf16")


def get(cache: Path, env: dict, clock: CudaClock) -> dict:
    known = json.loads(cache.read_text()) if cache.exists() else {}
    key = device_key(env)
    if key not in known:
        known[key] = _measure(clock)
        write_json(cache, known)
    return {**known[key], "peak_tensor_tflops": peak_tensor_tflops(env),
            "unit_peaks_tflops": unit_peaks_tflops(env),
            "l2_bytes": env.get("l2_bytes"), "device": key}


def bandwidth_gbps(ceilings: dict) -> float:
    return ceilings.get("bandwidth_gbps") or ceilings["copy_gbps"]


def unit_peak_tflops(unit: str, ceilings: dict) -> float | None:
    """The unit's peak, in T operations/s. Where the architecture's rates are unknown, the
    bf16, fp16 and tf32 tensor units fall back to the bf16 peak or the measured bf16 matmul
    (no slower than any of them, so the floor stays a lower bound); other units then have no
    peak and do not bound the floor."""
    peaks = ceilings.get("unit_peaks_tflops") or {}
    if unit in peaks:
        return peaks[unit]
    if unit in ("tensor.bf16", "tensor.fp16", "tensor.tf32") and not peaks:
        return ceilings.get("peak_tensor_tflops") or ceilings.get("bf16_tflops")
    return None


def floor_ms(bytes_moved: float, flops, ceilings: dict) -> float:
    """The time no kernel can show: the longest of its bytes at the measured bandwidth and
    each execution unit's operations at that unit's peak. `flops` maps units to counts
    (perfloop.work), or is a number of bf16 tensor-core FLOPs. The longest, not the sum: the
    memory system, the tensor cores, the fp32 lanes and the SFUs work concurrently, so a
    kernel can overlap them fully and none of them can be beaten. The clock's flush only
    reads, so up to one L2 of a kernel's last writes is written back after the timed window:
    those bytes are not counted (on an H100, torch.compile's SwiGLU otherwise ran at up to
    1.045 of the floor at 245 MB, and a roofline stop fired while it was 3% ahead)."""
    by_unit = flops if isinstance(flops, Mapping) else {"tensor.bf16": flops}
    unseen = min(ceilings.get("l2_bytes") or 0, bytes_moved / 2)  # writes are at most half
    times = [(bytes_moved - unseen) / (bandwidth_gbps(ceilings) * 1e6)]
    for unit, count in by_unit.items():
        peak = unit_peak_tflops(unit, ceilings)
        if peak and count:
            times.append(count / (peak * 1e9))
    return max(times)


def roofline(ceilings: dict | None, units) -> tuple[dict, float | None]:
    """({unit: operations/s} for those of `units` with a known peak, bytes/s), for
    decide.classify; ({}, None) without ceilings (a CPU clock)."""
    if not ceilings:
        return {}, None
    peaks = {u: unit_peak_tflops(u, ceilings) for u in units}
    return ({u: p * 1e12 for u, p in peaks.items() if p},
            bandwidth_gbps(ceilings) * 1e9)
