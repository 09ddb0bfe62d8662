"""Time the cuTile attention against SDPA's cuDNN and flash backends and the Triton competitor
with an independent timer, triton.testing.do_bench (its L2 clear before every repetition), at
the issue's headline shapes: bf16, batch x sequence = 16k tokens, hidden 2048 (heads = 2048 /
D), and a decode step. Prints a table of TFLOP/s (4 D FLOPs per (query, key) pair a head
computes: the issue's 4 B H S^2 D, about halved when causal) and, for decode, GB/s of the bytes it
must move; each output is checked first against the kernel's reference within its tolerance.

    python kernels/attention/crosscheck.py                        # the committed knobs
    python kernels/attention/crosscheck.py '{"tile": [64, 128]}'  # and these over them, too
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import triton
from triton.testing import do_bench

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from perfloop.kernel import import_module, read_knobs  # noqa: E402
from perfloop.playbook import freeze  # noqa: E402

# (name, dims [B, Hq, Hkv, Sq, Sk, D], causal): the H100 figures were taken at these
SHAPES = [("d128-s4096", (4, 16, 16, 4096, 4096, 128), False),
          ("d128-s4096-causal", (4, 16, 16, 4096, 4096, 128), True),
          ("d128-s1024", (16, 16, 16, 1024, 1024, 128), False),
          ("d64-s4096", (4, 32, 32, 4096, 4096, 64), False),
          ("d256-s4096", (4, 8, 8, 4096, 4096, 256), False),
          ("d256-s4096-causal", (4, 8, 8, 4096, 4096, 256), True),
          ("decode-gqa4-8k", (16, 32, 8, 1, 8192, 128), False)]
PEERS = ("sdpa-cudnn", "sdpa-flash", "triton")


def _ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def _launching(launch, inputs, out):
    def run():
        launch(inputs, out)
        return out
    return run


def main(extra: list[dict]) -> None:
    module = import_module(HERE, "attention_crosscheck")
    committed = read_knobs(HERE / "knobs.json")
    ours = [("cutile", committed)] + [
        ("cutile " + json.dumps(change, separators=(",", ":")),
         {**committed, **{k: freeze(v) for k, v in change.items()}}) for change in extra]
    rivals = {k: v for k, v in module.competitors().items() if k in PEERS}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{triton.__version__}, cuDNN {torch.backends.cudnn.version()}; do_bench median, "
          "L2 cleared")
    print("| shape | variant | ms | TFLOP/s | GB/s | / sdpa-cudnn | check |")
    print("|:--|:--|--:|--:|--:|--:|:--|")
    start = time.monotonic()
    for name, dims, causal in SHAPES:
        shape = SimpleNamespace(name=name, dims=dims, dtype="bfloat16",
                                params={"causal": causal})
        inputs = module.make_inputs(shape, 0, "cuda")
        work = module.traffic(shape)
        flops = work["flops"]["tensor.bfloat16"]
        expected = module.reference(*(x.double() if torch.is_tensor(x) else x for x in inputs))
        tol = module.tolerance(shape, 0, "bfloat16")
        runs = [(label, (lambda i=inputs, f=f: f(*i))) for label, f in rivals.items()]
        runs += [(label, _launching(module.build(knobs), inputs, module.empty_output(inputs)))
                 for label, knobs in ours]
        times = {}
        for label, fn in runs:
            try:
                out = fn()
                diff = (out.double() - expected).abs()
                ok = bool((diff <= tol["atol"] + tol["rtol"] * expected.abs()).all()) and \
                    float(diff.norm() / expected.norm()) <= tol["max_rel_err"]
                times[label] = _ms(fn)
            except Exception as exc:   # a backend that cannot take the shape: said, not fatal
                print(f"| {name} | {label} | - | - | - | - | {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:60] if str(exc) else ''} |")
                continue
            ms = times[label]
            base = times.get("sdpa-cudnn")
            print(f"| {name} | {label} | {ms:.4f} | {flops / ms / 1e9:.1f} | "
                  f"{work['bytes'] / ms / 1e6:.0f} | "
                  f"{'-' if base is None else format(base / ms, '.3f')} | "
                  f"{'ok' if ok else 'MISMATCH'} |")
        del inputs, expected
        torch.cuda.empty_cache()
    print(f"({time.monotonic() - start:.0f} s)")


if __name__ == "__main__":
    main([json.loads(a) for a in sys.argv[1:]])
