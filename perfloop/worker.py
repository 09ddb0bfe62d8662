"""The timing child: `python -m perfloop.worker SPEC.json`.

Loads each variant's kernel folder (the incumbent's comes from its commit, so edited kernel
code is compared fairly), times all variants on every shape in alternating rounds in this one
process, and writes raw samples, ceilings and the environment to the spec's `out` path.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from perfloop import ceilings, envinfo, measure
from perfloop.atomic import write_json
from perfloop.correctness import module_for
from perfloop.kernel import Shape
from perfloop.playbook import Measure, freeze


def _launcher(module, variant: dict):
    """The kernel built with the variant's knobs, or PyTorch's own version of it (bench)."""
    if variant.get("torch"):
        import torch

        fn = module.reference if variant["torch"] == "eager" else torch.compile(module.reference)
        return lambda inputs, out: fn(*inputs)
    return module.build({k: freeze(x) for k, x in variant["knobs"].items()})


def _time_shape(module, clock, launch: dict, shape: Shape, settings: Measure, seed: int,
                device: str) -> measure.Rounds:
    """All variants on one shape's inputs, which are the same for every variant."""
    inputs = module.make_inputs(shape, seed, device)
    out = module.empty_output(inputs)
    bound = {label: (lambda f=f: f(inputs, out)) for label, f in launch.items()}
    return measure.alternating(clock, bound, settings)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    settings = Measure(**spec["measure"])
    variants = spec["variants"]
    modules = {v["label"]: module_for(v["folder"]) for v in variants}
    first = modules[variants[0]["label"]]
    device = getattr(first, "DEVICE", "cuda")
    gpu = device == "cuda"
    clock = first.Clock() if hasattr(first, "Clock") else measure.CudaClock()
    launch = {v["label"]: _launcher(modules[v["label"]], v) for v in variants}
    env = envinfo.capture(gpu)
    ceiling = ceilings.get(Path(spec["ceilings_cache"]), env, clock) if gpu else None
    result = {"environment": env, "ceilings": ceiling, "shapes": {}}
    for raw in spec["shapes"]:
        shape = Shape.from_dict(raw)
        timed = _time_shape(first, clock, launch, shape, settings, spec.get("seed", 0), device)
        bytes_moved, flops = first.traffic(shape)
        floor = ceilings.floor_ms(bytes_moved, flops, ceiling) if ceiling else None
        result["shapes"][shape.name] = {"bytes": bytes_moved, "flops": flops, "floor_ms": floor,
                                        "reps": timed.reps, "rounds": timed.rounds}
    result["method"] = measure.method(clock, settings, timed.reps)
    write_json(Path(spec["out"]), result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
