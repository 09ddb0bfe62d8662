"""What Nsight Compute profiles: `python -P -m perfloop.child.profile_target SPEC.json`.

Builds the variant named in the spec (the incumbent's folder and knobs) on the benchmark's
inputs at one shape (the contract's make_inputs, from the run's base commit), warms it up
(compiles, caches), and launches it once more between cudaProfilerStart and Stop: ncu runs with
--profile-from-start off, so that warm launch is all it profiles.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from perfloop.contract import dispatch, hooks
from perfloop.core.atomic import write_json
from perfloop.contract.kernel import Shape, import_module
from perfloop.contract.playbook import freeze


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    contract = import_module(Path(spec["contract_folder"]), "contract")
    module = import_module(Path(spec["folder"]), "profiled")
    device = getattr(contract, "DEVICE", "cuda")
    launch = dispatch.launcher(module, {k: freeze(v) for k, v in spec["knobs"].items()},
                               Path(spec["folder"]))
    inputs = contract.make_inputs(Shape.from_dict(spec["shape"]), 0, device)
    out = contract.empty_output(inputs)
    try:
        _, extra, restore = hooks.prepare(contract, inputs, out)
    except hooks.ContractError as exc:
        print(f"perfloop: {exc}", file=sys.stderr)
        return 2
    reset = restore or (lambda: None)  # in-place inputs as drawn before every launch
    for _ in range(spec.get("warmup", 3)):
        reset()
        launch(inputs, out, *extra)
    gpu = device == "cuda"
    reset()
    if gpu:
        import torch

        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    for _ in range(spec.get("launches", 1)):
        launch(inputs, out, *extra)
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    write_json(Path(spec["out"]), {"device": device, "launches": spec.get("launches", 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
