"""Issue 26's bar, measured by hand on a GPU (not a test: pytest collects test_*.py only).

Each shipped kernel's public function (dispatch and tune-once included, as a user calls it)
at held-out shapes drawn from its kernel.toml workload with a seed no run used, against
torch.compile (compiled per shape, dynamic=False), the kernel's competitors() (Triton) and,
for matmul, cuBLAS (torch's matmul). Timer: triton.testing.do_bench, median of three rounds
of alternating order, L2 cleared before every call and then a GPU sleep of BAR_PAD_CYCLES
(400000, about 200 us): a call whose host time outlasts the clear would otherwise be timed by
its host time (on an H200 host a Triton launch took 57-100 us, the 256 MB clear 55). Prints
one line per shape, best peer / cuTile as ratio, and per kernel the held-out geometric mean
and minimum.

do_bench's clear writes 256 MB, so the timed call starts with an L2 full of dirty lines whose
write-back lands in it: on an H100 that added 2-12 us to each variant of a 20-60 us matmul,
cuBLAS's included. BAR_CLEAR=both times each variant after that clear and after one that only
reads the same buffer (a clean L2, as perfloop's own clock leaves it) and prints both ratios;
the bar is the first.

    python tests/workload_bar.py SEED COUNT [kernel ...]     # e.g. 7 8

A kernel given as a path (it has a "/") is a folder of one's own, e.g. one written from the
README: it runs through `perfloop.dispatch.launcher` with its knobs.json, as its callers
would, against torch.compile of its reference and its competitors().
"""

import math
import os
import statistics
import sys
import warnings
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from perfloop.commands.bench import drawn  # noqa: E402
from perfloop.contract import dispatch  # noqa: E402
from perfloop.contract.kernel import import_module  # noqa: E402
from perfloop.contract.manifest import load_spec  # noqa: E402

PAD = int(os.environ.get("BAR_PAD_CYCLES", "400000"))
CLEARS = {"write": ("write",), "read": ("read",), "both": ("write", "read")}.get(
    os.environ.get("BAR_CLEAR", "write")) or sys.exit("BAR_CLEAR must be write, read or both")
BAR = 0.9
_driver = triton.runtime.driver.active
_shipped_clear = _driver.clear_cache
_sink = []


def _clear_then_pad(cache):
    _shipped_clear(cache)
    torch.cuda._sleep(PAD)


def _read_then_pad(cache):
    if not _sink:
        _sink.append(torch.empty((), dtype=torch.int64, device=cache.device))
    torch.sum(cache, dim=0, dtype=torch.int64, out=_sink[0])
    torch.cuda._sleep(PAD)


_CLEAR_FNS = {"write": _clear_then_pad, "read": _read_then_pad}


def median_us(fns: dict, rounds: int = 3) -> dict:
    """{name: median us} over `rounds` do_bench readings of each, in rounds of alternating
    order. Timed one variant after another, cuTile's reading moved with its place in the order
    (one H100, RMSNorm bf16 3052 x 2048: 14.05 us timed first against Triton's 11.01; 11.52
    against 11.36 in rounds)."""
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            times[name].append(do_bench(fns[name], warmup=25, rep=100, return_mode="median"))
    return {name: statistics.median(v) * 1000 for name, v in times.items()}


def by_clear(fns: dict) -> dict:
    """{clear: {name: median us}} for each clear of CLEARS."""
    out = {}
    for clear in CLEARS:
        _driver.clear_cache = _CLEAR_FNS[clear]
        out[clear] = median_us(fns)
    return out


def peers(name: str, module, inputs) -> dict:
    fns = {}
    if name == "matmul":   # torch.compile of a matmul is cuBLAS
        fns["cublas"] = lambda: module.reference(*inputs)
    else:
        torch._dynamo.reset()
        compiled = torch.compile(module.reference, dynamic=False)
        fns["tcompile"] = lambda: compiled(*inputs)
    rivals = module.competitors() if hasattr(module, "competitors") else {}
    for rival, fn in rivals.items():
        fns[rival] = lambda fn=fn: fn(*inputs)
    return fns


def _routed(module, spec):
    """f(*inputs) -> out through the kernel's committed knobs, routed by bucket."""
    launch = dispatch.launcher(module, spec.read_knobs(), folder=spec.folder)

    def public(*inputs):
        out = module.empty_output(inputs)
        launch(inputs, out)
        return out

    return public


def main(seed: int, count: int, names: list[str]) -> None:
    warnings.simplefilter("ignore")
    print(torch.cuda.get_device_name(), flush=True)
    summary = {}
    for name in names:
        own = "/" in name   # a folder of one's own: its launch as the loop measured it
        folder = Path(name).resolve() if own else ROOT / "kernels" / name
        spec = load_spec(folder, folder.parent.parent)
        name = spec.name
        module = import_module(spec.folder, f"bar_{name}")
        public = _routed(module, spec) if own else getattr(module, name)
        ratios = {clear: [] for clear in CLEARS}
        for shape in [*drawn(spec, count, seed)[1], *spec.shapes]:
            inputs = module.make_inputs(shape, 0, "cuda")
            got = public(*inputs)
            ref = module.reference(*[t.double() for t in inputs])
            err = float((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
            fns = {"cutile": lambda: public(*inputs), **peers(name, module, inputs)}
            held = shape.name.startswith("held:")
            for clear, times in by_clear(fns).items():
                ratio = min(v for k, v in times.items() if k != "cutile") / times["cutile"]
                if held:
                    ratios[clear].append(ratio)
                print(f"{name:8s} {shape.name:26s} {clear:5s} err={err:.1e} "
                      + " ".join(f"{k}={v:8.2f}" for k, v in times.items())
                      + f"  ratio={ratio:.3f}" + ("" if ratio >= BAR else "  <0.9")
                      + ("" if held else "  (benchmark shape)"), flush=True)
        for clear, got in ratios.items():
            geomean = math.exp(sum(map(math.log, got)) / len(got))
            summary[name, clear] = (geomean, min(got), sum(r < BAR for r in got), len(got))
    print("| kernel | L2 clear | held-out geomean | min | below 0.9 |")
    for (name, clear), (g, low, below, n) in summary.items():
        print(f"| {name} | {clear} | {g:.3f} | {low:.3f} | {below}/{n} |")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]),
         sys.argv[3:] or ["rmsnorm", "softmax", "swiglu", "matmul"])
