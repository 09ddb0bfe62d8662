"""The timing harness on a real GPU: repeatability and plausible ceilings."""

from pathlib import Path

import pytest

from perfloop import ceilings, envinfo, measure, stats
from perfloop.kernel import import_module, load_spec
from perfloop.playbook import SHIPPED, load

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "kernels" / "swiglu"


def test_same_kernel_timed_twice_in_one_process_differs_by_under_one_percent():
    spec = load_spec(FOLDER, ROOT)
    module = import_module(FOLDER, "aa_test")
    launch = module.build(spec.read_knobs())
    inputs = module.make_inputs(spec.headline, 0, "cuda")
    out = module.empty_output(inputs)
    run = lambda: launch(inputs, out)  # noqa: E731
    timed = measure.alternating(measure.CudaClock(), {"a": run, "b": run}, load(SHIPPED).rules.measure)
    medians = {k: [sorted(r)[len(r) // 2] for r in v] for k, v in timed.rounds.items()}
    c = stats.compare(medians["a"], medians["b"])
    print(f"A/A ratio {c.ratio:.5f} [{c.ci_low:.5f}, {c.ci_high:.5f}]")
    assert abs(c.ratio - 1) < 0.01


def test_ceilings_are_plausible_and_bound_the_kernel(tmp_path):
    clock = measure.CudaClock()
    got = ceilings.get(tmp_path / "ceil.json", envinfo.capture(True), clock)
    assert 500 < got["copy_gbps"] < 20000 and 50 < got["bf16_tflops"] < 5000
    assert (tmp_path / "ceil.json").exists()  # cached for the next run
