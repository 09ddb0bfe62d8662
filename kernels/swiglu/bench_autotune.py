"""Autotune's costs for SwiGLU, measured: `python kernels/swiglu/bench_autotune.py`.

1. the first call at the headline shape with an empty cache (search + the final compile);
2. a first call in a process whose disk cache already holds the winner;
3. steady state: host time per call, on a launch-bound shape, of a plain ct.launch with its
   arguments prepared once, of SwiGLU's fixed-config launch (the same wrapper work without
   autotune), and of its tuned launch; and GPU time of plain and tuned at the headline shape.
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cuda.tile as ct
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from perfloop.child import clock  # noqa: E402
from perfloop import autotune  # noqa: E402
from perfloop.core import stats  # noqa: E402
from perfloop.kernel import Shape, import_module, load_spec, read_knobs  # noqa: E402
from perfloop.playbook import SHIPPED, load  # noqa: E402


def _first_call(module, knobs, inputs, out) -> tuple[float, object]:
    launch = module.build(knobs)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    launch(inputs, out)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, launch


def _host_us_per_call(fn, calls=3000) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    spec = load_spec(HERE, HERE.parent.parent)
    module = import_module(HERE, "bench_autotune")
    knobs = {**read_knobs(HERE / "knobs.json"), "autotune": True}
    with tempfile.TemporaryDirectory() as cache:
        os.environ["PERFLOOP_AUTOTUNE_CACHE"] = cache
        head = module.make_inputs(spec.headline, 0, "cuda")
        out = module.empty_output(head)
        cold_s, tuned = _first_call(module, knobs, head, out)
        config = tuned.tuner.last_config
        autotune._memory.clear()  # as a new process would start: only the disk cache remains
        warm_s, again = _first_call(module, knobs, head, out)
        print(f"first call, empty cache: {cold_s:.2f} s (searches: {tuned.tuner.searches}); "
              f"first call, winner on disk: {warm_s:.3f} s (searches: {again.tuner.searches}); "
              f"winner {config}")

        plain_kernel = again.tuner.kernel_for(config)
        stream = torch.cuda.current_stream()

        def plain_for(inputs, out):
            a, b = inputs
            a2, b2, c2 = a.view(-1, a.shape[-1]), b.view(-1, b.shape[-1]), out.view(-1, out.shape[-1])
            grid = module.grid(knobs, *a2.shape, a2.device, config["occupancy"])
            args = (a2, b2, c2, *module._constants(knobs))
            return lambda: ct.launch(stream, grid, plain_kernel, args)

        small = module.make_inputs(Shape("small", (8, 1024), "bfloat16"), 0, "cuda")
        small_out = module.empty_output(small)
        again(small, small_out)  # tunes the small shape outside the timing
        fixed = module.build({**knobs, "autotune": False, "occupancy": config["occupancy"]})
        host_plain = _host_us_per_call(plain_for(small, small_out))
        host_fixed = _host_us_per_call(lambda: fixed(small, small_out))
        host_tuned = _host_us_per_call(lambda: again(small, small_out))
        print(f"host time per call (8x1024, launch-bound): plain ct.launch {host_plain:.1f} us, "
              f"fixed-config wrapper {host_fixed:.1f} us, tuned wrapper {host_tuned:.1f} us "
              f"(autotune's own cost {host_tuned - host_fixed:+.1f} us)")

        timed = clock.alternating(clock.CudaClock(), {
            "plain": plain_for(head, out), "tuned": lambda: again(head, out)},
            load(SHIPPED).rules.measure)
        medians = {k: [statistics.median(r) for r in v] for k, v in timed.rounds.items()}
        c = stats.compare(medians["plain"], medians["tuned"])
        print(f"GPU time at {spec.headline.name}: plain {statistics.median(medians['plain']):.4f} ms, "
              f"tuned {statistics.median(medians['tuned']):.4f} ms, tuned/plain {c.ratio:.4f} "
              f"[{c.ci_low:.4f}, {c.ci_high:.4f}]")


if __name__ == "__main__":
    main()
