"""Cross-check `perfloop bench` with an independent timer, triton.testing.do_bench, on the same
GPU: `python kernels/swiglu/crosscheck.py sandbox/swiglu/bench.json` (for another kernel, name
its folder: `... sandbox/rmsnorm/bench.json kernels/rmsnorm`).

For each shape (the benchmark's, and the held-out shapes bench drew, drawn again from its
recorded seed), the cuTile kernel (with the knobs bench used), torch.compile (compiled for
that shape, dynamic=False) and the kernel's other competitors (its competitors(), e.g. a
Triton kernel) are timed by do_bench twice: as shipped, whose L2 clear writes zeros over 256
MB (the dirty lines it leaves are written back during the timed kernel), and with that clear
replaced by a read of the same buffer, as perfloop's clock flushes. Prints
bench's medians beside both, and the ratios.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from perfloop.commands.bench import drawn  # noqa: E402
from perfloop.kernel import import_module, load_spec  # noqa: E402
from perfloop.playbook import freeze  # noqa: E402


def _median_us(fn, read_only_clear: bool) -> float:
    driver = triton.runtime.driver.active
    shipped = driver.clear_cache
    if read_only_clear:
        driver.clear_cache = lambda cache: torch.amax(cache)
    try:
        return do_bench(fn, warmup=100, rep=500, return_mode="median") * 1000
    finally:
        driver.clear_cache = shipped


def main(bench_json: str, folder: Path = HERE) -> None:
    bench = json.loads(Path(bench_json).read_text())
    spec = load_spec(folder, folder.parent.parent)
    module = import_module(folder, "crosscheck")
    launch = module.build({k: freeze(v) for k, v in bench["knobs"].items()})
    ours = {(r["shape"], r["variant"]): r["median_ms"] * 1000 for r in bench["rows"]}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("| shape | variant | bench us | do_bench us (zero_ clear) | ratio | "
          "do_bench us (read clear) | ratio |")
    print("|:--|:--|--:|--:|--:|--:|--:|")
    view = bench.get("workload") or {}
    held = [r for r in view.get("shapes", []) if r.get("held_out")]
    extra = drawn(spec, len(held), view["seed"])[1] if held else ()
    for shape in [*spec.shapes, *extra]:
        inputs = module.make_inputs(shape, 0, "cuda")
        out = module.empty_output(inputs)
        torch._dynamo.reset()
        compiled = torch.compile(module.reference, dynamic=False)
        rivals = module.competitors() if hasattr(module, "competitors") else {}
        for variant, fn in (("cutile", lambda i=inputs, o=out: launch(i, o)),
                            ("torch-compile", lambda i=inputs: compiled(*i)),
                            *((name, lambda i=inputs, f=f: f(*i)) for name, f in rivals.items())):
            fn()
            torch.cuda.synchronize()
            zero, read = _median_us(fn, False), _median_us(fn, True)
            mine = ours.get((shape.name, variant), float("nan"))
            print(f"| {shape.name} | {variant} | {mine:.2f} | {zero:.2f} | {mine / zero:.3f} | "
                  f"{read:.2f} | {mine / read:.3f} |")
        del inputs, out


if __name__ == "__main__":
    main(sys.argv[1], *(Path(a).resolve() for a in sys.argv[2:3]))
