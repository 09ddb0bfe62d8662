"""The judge of tests/support/inplace_scripted.py: one launch per case, out and y checked."""

import random

import pytest
import torch

from perfloop.correctness import check, module_for, requested_variants
from perfloop.playbook import freeze

EXACT = {"rtol": 0.0, "atol": 0.0, "max_rel_err": 0.0}


@pytest.mark.parametrize("variant", requested_variants() or [], ids=lambda v: v["label"])
@pytest.mark.parametrize("n", [1, 5, 1000])
def test_adds_in_place(variant, n):
    knobs = {k: freeze(v) for k, v in variant["knobs"].items()}
    launch = module_for(variant["folder"]).build(knobs)
    rng = random.Random(n)
    x, y = (torch.tensor([float(rng.randrange(-50, 50)) for _ in range(n)], dtype=torch.float64)
            for _ in range(2))

    def run():
        out, mine = torch.full((n,), float("nan"), dtype=torch.float64), y.clone()
        launch(("case", x, mine), out)
        return (out, mine)

    check(variant["label"], f"n={n}", run, (2 * x, y + x), **EXACT)
