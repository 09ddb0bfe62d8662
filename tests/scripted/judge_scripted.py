"""The judge of the scripted test kernel: the loop runs it as a pytest file in a child. It owns
its inputs and its reference; from the kernel it takes only build()."""

import random
from pathlib import Path

import pytest

from perfloop.correctness import log_case, module_for, requested_variants
from perfloop.playbook import freeze

HERE = Path(__file__).resolve().parent
DEFAULT = [{"label": "committed", "folder": str(HERE.parent / "kernels" / "scripted"), "knobs": {}}]


@pytest.mark.parametrize("variant", requested_variants() or DEFAULT, ids=lambda v: v["label"])
@pytest.mark.parametrize("n", [1, 5, 1000])
def test_doubles(variant, n):
    module = module_for(variant["folder"])
    launch = module.build({k: freeze(v) for k, v in variant["knobs"].items()})
    values = [float(random.Random(n).randrange(-50, 50)) for _ in range(n)]
    out = [float("nan")] * n
    launch(("case", values), out)
    passed = out == [2 * v for v in values]
    log_case(variant["label"], f"n={n}", passed)
    assert passed
