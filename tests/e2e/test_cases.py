"""A benchmark case's named parameters and per-tensor dtypes (kernel.toml's `params` and
`dtypes`), as the kernel's functions see them in the timer, the warmers and the judge's
tolerance hook."""

import json

import pytest

from perfloop.core.errors import UserError
from perfloop.contract.kernel import Shape
from perfloop.contract.manifest import load_spec

CASES = """
[[shapes]]
name = "head"
dims = [1024]
dtype = "float32"
headline = true
params = { scale = 3, eps = 1e-6, mode = "fast" }
dtypes = { weight = "bfloat16" }
"""


def _manifest(scratch, cases: str) -> None:
    path = scratch.kernel / "kernel.toml"
    text = path.read_text()
    head = text.index("[[shapes]]\nname = \"head\"")
    guard = text.index("[[shapes]]\nname = \"guard\"")
    path.write_text(text[:head] + cases.lstrip() + "\n" + text[guard:])


def test_a_case_carries_named_parameters_and_a_dtype_per_tensor(scratch):
    _manifest(scratch, CASES)
    spec = load_spec(scratch.kernel, scratch.path)
    head = spec.headline
    assert head.params == {"scale": 3, "eps": 1e-6, "mode": "fast"}
    assert head.dtype_of("weight") == "bfloat16" and head.dtype_of("x") == "float32"
    held = next(s for s in spec.held_back if s.name == "held:head")
    assert held.params == head.params and held.dtypes == head.dtypes and held.dims == (769,)
    assert Shape.from_dict(json.loads(json.dumps(head.as_dict()))) == head
    guard = next(s for s in spec.shapes if s.name == "guard")
    assert guard.params == {} and guard.dtype_of("weight") == "float32"


@pytest.mark.parametrize("bad, said", [
    ('params = [1, 2]', "params must be a table"),
    ('params = { eps = [1, 2] }', "params maps names to numbers"),
    ('dtypes = { w = 16 }', "dtypes maps tensor names to dtype names"),
])
def test_a_malformed_case_is_refused_in_one_line(scratch, bad, said):
    plain = "\n".join(line for line in CASES.splitlines()
                       if not line.startswith(("params", "dtypes")))
    _manifest(scratch, f"{plain}\n{bad}\n")
    with pytest.raises(UserError, match=said) as caught:
        load_spec(scratch.kernel, scratch.path)
    assert "\n" not in str(caught.value)


def test_the_timed_kernel_reads_its_cases_parameters(scratch):
    """make_inputs and traffic see the case's params and dtypes in the timing worker: a kernel
    that finds other values fails there, and the baseline would not pass."""
    _manifest(scratch, CASES)
    with open(scratch.kernel / "kernel.py", "a") as f:
        f.write(
            "\n\n_plain_inputs, _plain_traffic = make_inputs, traffic\n\n\n"
            "def _expect(shape):\n"
            "    want = ({'scale': 3, 'eps': 1e-6, 'mode': 'fast'}\n"
            "            if shape.name in ('head', 'held:head') else {})\n"
            "    if shape.params != want or shape.dtype_of('weight') != (\n"
            "            'bfloat16' if want else 'float32'):\n"
            "        raise RuntimeError(f'{shape.name}: params {shape.params}')\n\n\n"
            "def make_inputs(shape, seed, device):\n"
            "    _expect(shape)\n"
            "    return _plain_inputs(shape, seed, device)\n\n\n"
            "def traffic(shape):\n"
            "    _expect(shape)\n"
            "    return _plain_traffic(shape)\n")
    scratch.commit_all("cases with parameters")
    code, init, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0, err
    assert init["experiment"]["status"] == "keep", init["experiment"]["reason"]
