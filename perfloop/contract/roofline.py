"""The physical floor of a kernel's time: each execution unit's peak (tensor cores by dtype,
fp32 lanes, special-function units) from the architecture's rate per SM and clock, and the
device's measured bandwidth (perfloop.referee.ceilings measures it). Pure functions: the parent
reads the ceilings a timing recorded, the timer computes floors with them."""

from __future__ import annotations

from collections.abc import Mapping

# Dense rates per SM per clock of each execution unit (perfloop.contract.traffic.UNITS): tensor cores
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

