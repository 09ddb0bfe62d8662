"""The judge of the scripted test kernel: the loop runs it as a pytest file in a child."""

from pathlib import Path

import pytest

from perfloop.correctness import log_case, module_for, requested_variants
from perfloop.kernel import Shape
from perfloop.playbook import freeze

HERE = Path(__file__).resolve().parent
DEFAULT = [{"label": "committed", "folder": str(HERE.parent / "kernels" / "scripted"), "knobs": {}}]


@pytest.mark.parametrize("variant", requested_variants() or DEFAULT, ids=lambda v: v["label"])
@pytest.mark.parametrize("n", [1, 5, 1000])
def test_doubles(variant, n):
    module = module_for(variant["folder"])
    launch = module.build({k: freeze(v) for k, v in variant["knobs"].items()})
    inputs = module.make_inputs(Shape("case", (n,), "float32"), 0, "cpu")
    out = module.empty_output(inputs)
    launch(inputs, out)
    passed = out == [2 * v for v in inputs[1]]  # the judge owns its reference
    log_case(variant["label"], f"n={n}", passed)
    assert passed
