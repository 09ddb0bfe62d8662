"""Compile ahead, in parallel: `python -m perfloop.child.warm SPEC.json`.

cuTile compiles a kernel on its first launch for each set of constants and array properties,
and keeps the cubin in its disk cache (~/.cache/cutile-python, CUDA_TILE_CACHE_DIR), keyed by
the bytecode, the architecture and the compiler's version, so a second process that launches
the same variant finds it there instead of running tileiras. While the judge runs, a few of
these processes launch every candidate once at every benchmark shape; the timing worker's
first launches then hit the cache. On an H100 a softmax variant's first launch took 0.6-2.2 s
cold and 0.3 s from the cache (the rest is cuTile's Python front end, which no cache holds).

A warmer's results are never used: the parent stops it when the judge is done, and whatever
it crashed or hung on is the judge's and the timer's to find.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from perfloop.contract import dispatch, hooks
from perfloop.isolation import lifeline
from perfloop.contract.kernel import Shape, import_module
from perfloop.contract.playbook import freeze


def main(spec_path: str) -> int:
    lifeline.guard_parent()
    spec = json.loads(Path(spec_path).read_text())
    contract = import_module(Path(spec["contract_folder"]), "contract")
    device = getattr(contract, "DEVICE", "cuda")
    modules: dict = {}
    launches: dict = {}
    for v in spec["variants"]:
        try:
            if v["folder"] not in modules:
                modules[v["folder"]] = import_module(Path(v["folder"]), f"warm{len(modules)}")
            launches[v["label"]] = dispatch.launcher(
                modules[v["folder"]], {k: freeze(x) for k, x in v["knobs"].items()},
                Path(v["folder"]))
        except Exception:
            continue
    for raw in spec["shapes"]:
        inputs = contract.make_inputs(Shape.from_dict(raw), 0, device)
        out = contract.empty_output(inputs)
        try:
            _, extra, restore = hooks.prepare(contract, inputs, out)
        except hooks.ContractError:
            return 0  # the timing worker says what is wrong, in one line
        for launch in launches.values():
            try:
                if restore is not None:
                    restore()
                launch(inputs, out, *extra)
            except Exception:
                continue
        del inputs, out
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
