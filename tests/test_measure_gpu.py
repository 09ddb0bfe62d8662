"""The timing harness on a real GPU: repeatability, plausible ceilings, a flush that costs the
kernel nothing, host time kept out of device time, work on other streams caught."""

import statistics
import time
from pathlib import Path

import pytest

from perfloop.child import ceilings, streams
from perfloop.child import clock as measure
from perfloop.core import envinfo, stats
from perfloop.core.kernel import Shape, import_module
from perfloop.core.manifest import load_spec
from perfloop.core.playbook import SHIPPED, load

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "kernels" / "swiglu"
SETTINGS = load(SHIPPED).rules.measure


def _medians(timed: measure.Rounds) -> dict:
    return {k: [statistics.median(r) for r in v] for k, v in timed.rounds.items()}


def test_same_kernel_timed_twice_in_one_process_differs_by_under_one_percent():
    spec = load_spec(FOLDER, ROOT)
    module = import_module(FOLDER, "aa_test")
    launch = module.build(spec.read_knobs())
    inputs = module.make_inputs(spec.headline, 0, "cuda")
    out = module.empty_output(inputs)
    run = lambda: launch(inputs, out)  # noqa: E731
    medians = _medians(measure.alternating(measure.CudaClock(), {"a": run, "b": run}, SETTINGS))
    c = stats.compare(medians["a"], medians["b"])
    print(f"A/A ratio {c.ratio:.5f} [{c.ci_low:.5f}, {c.ci_high:.5f}]")
    assert abs(c.ratio - 1) < 0.01


def test_ceilings_are_plausible_and_bound_the_kernel(tmp_path):
    clock = measure.CudaClock()
    got = ceilings.get(tmp_path / "ceil.json", envinfo.capture(True), clock)
    assert 500 < got["copy_gbps"] < 20000 and 50 < got["bf16_tflops"] < 5000
    assert (tmp_path / "ceil.json").exists()  # cached for the next run
    assert "power limit" in got["device"]
    assert f"clock v{ceilings.CLOCK_VERSION}" in got["device"]


def test_the_flush_adds_nothing_to_a_read_only_kernel_larger_than_l2():
    """A zero_ flush leaves dirty lines whose write-back lands in the timed kernel (+10 us on
    a 117 MB read on an H100); a read-only flush must leave the kernel's time as it is."""
    import torch

    clock = measure.CudaClock()
    x = torch.randn(2 * clock.flush_bytes // 2, dtype=torch.bfloat16, device="cuda")  # 2x the flush
    o = torch.empty((), dtype=torch.float32, device="cuda")
    read = lambda: torch.sum(x, dim=0, dtype=torch.float32, out=o)  # noqa: E731
    bare = measure.CudaClock()
    bare.flush = lambda: None
    results = {}
    for name, c in (("flushed", clock), ("not flushed", bare)):
        c.pad_us = 50.0
        c.time_batch(read, 5)
        results[name] = statistics.median(
            statistics.median(c.time_batch(read, 20)) for _ in range(5))
    print(f"read of {x.numel() * 2 / 1e6:.0f} MB: {results}")
    assert results["flushed"] == pytest.approx(results["not flushed"], rel=0.02)


def _swiglu_at(dims, dtype="float32"):
    spec = load_spec(FOLDER, ROOT)
    module = import_module(FOLDER, f"busy_{dims[0]}")
    launch = module.build(spec.read_knobs())
    inputs = module.make_inputs(Shape("s", dims, dtype), 0, "cuda")
    return launch, inputs, module.empty_output(inputs)


def test_a_host_busy_wait_before_a_launch_does_not_change_its_device_time():
    launch, inputs, out = _swiglu_at((1000, 3000))

    def busy():
        until = time.perf_counter() + 40e-6
        while time.perf_counter() < until:
            pass
        launch(inputs, out)

    timed = measure.alternating(measure.CudaClock(), {"plain": lambda: launch(inputs, out),
                                                      "busy": busy}, SETTINGS)
    plain, slow = (statistics.median(s for r in timed.rounds[k] for s in r) for k in ("plain", "busy"))
    host = {k: statistics.median(v) for k, v in timed.host_us.items()}
    print(f"plain {plain * 1000:.2f} us, with a 40 us busy-wait {slow * 1000:.2f} us; "
          f"host per call {host}; pad {timed.pad_us:.0f} us")
    assert abs(slow - plain) * 1000 < 1.0          # device time: within 1 us
    assert host["busy"] > host["plain"] + 35       # host time: measured, on its own


def test_work_moved_to_another_stream_is_seen():
    import torch

    launch, inputs, out = _swiglu_at((4096, 4096), "bfloat16")
    side = torch.cuda.Stream()

    def sneaky():
        ready = torch.cuda.Event()
        ready.record()
        with torch.cuda.stream(side):
            side.wait_event(ready)
            launch(inputs, out)

    assert streams.off_stream_activity(lambda: launch(inputs, out)) == []
    assert streams.off_stream_activity(sneaky)
