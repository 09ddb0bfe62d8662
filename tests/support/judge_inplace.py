"""The judge of tests/support/inplace_scripted.py: one launch per case, out and y checked."""

import random

import pytest

from perfloop.correctness import log_case, module_for, requested_variants
from perfloop.playbook import freeze


@pytest.mark.parametrize("variant", requested_variants() or [], ids=lambda v: v["label"])
@pytest.mark.parametrize("n", [1, 5, 1000])
def test_adds_in_place(variant, n):
    knobs = {k: freeze(v) for k, v in variant["knobs"].items()}
    launch = module_for(variant["folder"]).build(knobs)
    rng = random.Random(n)
    x = [float(rng.randrange(-50, 50)) for _ in range(n)]
    y = [float(rng.randrange(-50, 50)) for _ in range(n)]
    want_out, want_y = [2 * v for v in x], [a + b for a, b in zip(y, x)]
    out = [float("nan")] * n
    launch(("case", x, y), out)
    passed = out == want_out and y == want_y
    log_case(variant["label"], f"n={n}", passed)
    assert passed
