"""The judge of the scripted test kernel: the loop runs it as a pytest file in a child. It owns
its inputs and its reference; from the kernel it takes only build()."""

import random
from pathlib import Path

import pytest
import torch

from perfloop.correctness import check, module_for, requested_variants, tolerance
from perfloop.playbook import freeze

HERE = Path(__file__).resolve().parent
FOLDER = HERE.parent / "kernels" / "scripted"
DEFAULT = [{"label": "committed", "folder": str(FOLDER), "knobs": {}}]
TOLERANCE = tolerance(FOLDER, "float64")   # the kernel's declared one (exact), as the timer's


@pytest.mark.parametrize("variant", requested_variants() or DEFAULT, ids=lambda v: v["label"])
@pytest.mark.parametrize("n", [1, 5, 1000])
def test_doubles(variant, n):
    module = module_for(variant["folder"])
    launch = module.build({k: freeze(v) for k, v in variant["knobs"].items()})
    rng = random.Random(n)
    values = torch.tensor([float(rng.randrange(-50, 50)) for _ in range(n)], dtype=torch.float64)

    def run():
        out = torch.full((n,), float("nan"), dtype=torch.float64)
        launch(("case", values), out)
        return out

    check(variant["label"], f"n={n}", run, 2 * values, **TOLERANCE)
