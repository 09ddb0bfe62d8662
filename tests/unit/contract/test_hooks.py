"""The optional hooks of a kernel's contract (perfloop.contract.hooks) as the trusted timer applies
them, on the CPU: every launch on inputs drawn for it (in-place inputs never compound), scratch
poisoned, writes to undeclared inputs caught, a tolerance per output (perfloop.referee.slots)."""

import random
import types
from pathlib import Path

import pytest
from conftest import ROOT

from perfloop.contract import hooks
from perfloop.contract import outputs as verify
from perfloop.contract.kernel import Shape
from perfloop.referee.slots import LaunchChecks, Slots

torch = pytest.importorskip("torch")

SHAPE = Shape("s", (64,), "float32", headline=True)


def axpy_contract(**extra):
    """y += 2 x in place, and out = x + 1; make_inputs draws y in [0, 1)."""

    def make_inputs(shape, seed, device):
        g = torch.Generator().manual_seed(seed)
        return (torch.rand(shape.dims, generator=g), torch.rand(shape.dims, generator=g))

    def reference(x, y):
        return (x + 1, y + 2 * x)

    return types.SimpleNamespace(**{
        "INPLACE": (1,), "make_inputs": make_inputs, "reference": reference,
        "empty_output": lambda inputs: torch.empty_like(inputs[0]), **extra})


def timed(contract, launch, *, tolerance=None, batches=6, slots=5, log=None) -> LaunchChecks:
    """Run `launch` in batches the way a launcher does for the trusted timer at one shape
    (every slot refilled, then launched once), with every slot checked; the checks' result."""
    mine = Slots(contract, SHAPE, slots, "cpu", 1, tolerance or {}, random.Random(0))
    checked = LaunchChecks()
    for _ in range(batches):
        drawn = mine.refill(slots, slots)
        if log is not None:
            log.append("refill")
        for inputs, out, extra in mine.buffers[:slots]:
            launch(inputs, out, *extra)
        failures = mine.check(drawn, mine.copy(drawn))
        checked.count += len(drawn)
        checked.passed = checked.passed and not failures
        checked.failures += failures
    return checked


def test_a_correct_in_place_kernel_passes_and_its_launches_never_compound():
    seen = []

    def launch(inputs, out):
        x, y = inputs
        seen.append(float(y.max()))  # drawn in [0, 1): more means an earlier update stayed
        out.copy_(x + 1)
        y.add_(2 * x)

    checked = timed(axpy_contract(), launch)
    assert checked.passed, checked.failures
    assert len(seen) == 30 and max(seen) < 1.0


def test_every_launch_runs_on_inputs_drawn_for_it():
    """Each batch launches every slot once, after every slot was drawn afresh: no launch sees
    what an earlier one left, nor inputs it has seen before."""
    log, seen = [], []

    def launch(inputs, out):
        log.append("launch")
        seen.append(inputs[0].numpy().tobytes())
        out.copy_(inputs[0] + 1)
        inputs[1].add_(2 * inputs[0])

    timed(axpy_contract(), launch, log=log)
    assert log == (["refill"] + ["launch"] * 5) * 6
    assert len(set(seen)) == len(seen) == 30


def test_an_in_place_kernel_right_only_on_its_first_launch_fails():
    """It updates y on its first call and then, as if y already held the result, skips it."""
    calls = []

    def launch(inputs, out):
        x, y = inputs
        out.copy_(x + 1)
        if not calls:
            y.add_(2 * x)
        calls.append(1)

    checked = timed(axpy_contract(), launch)
    assert not checked.passed
    assert checked.failures[0]["output"] == 1   # the in-place input, not the output


def test_a_kernel_that_skips_work_on_inputs_it_has_seen_never_can():
    """It remembers its inputs by content and skips the work when they come again: they never
    do, every launch's inputs are drawn for it."""
    done, skipped = set(), []

    def launch(inputs, out):
        x, y = inputs
        key = x.numpy().tobytes() + y.numpy().tobytes()
        if key in done:
            skipped.append(1)
            return                                      # "already up to date"
        out.copy_(x + 1)
        y.add_(2 * x)
        done.add(key)

    checked = timed(axpy_contract(), launch)
    assert checked.passed and not skipped


def test_a_launch_that_writes_an_undeclared_input_fails_though_its_outputs_are_right():
    """out = 2 x, with x used as working memory."""

    def make_inputs(shape, seed, device):
        return (torch.rand(shape.dims, generator=torch.Generator().manual_seed(seed)),)

    contract = types.SimpleNamespace(make_inputs=make_inputs, reference=lambda x: 2 * x,
                                     empty_output=lambda inputs: torch.empty_like(inputs[0]))

    def launch(inputs, out):
        out.copy_(2 * inputs[0])
        inputs[0].mul_(0.5)

    checked = timed(contract, launch)
    assert not checked.passed
    first = checked.failures[0]
    assert first["rel_err"] < 1e-6                        # the output itself was right
    assert "wrote to input 0" in first["error"] and "INPLACE" in first["error"]


def test_a_per_output_tolerance_tighter_than_the_dtype_default_rejects_what_it_would_pass():
    def launch(inputs, out):                              # relative error 3e-6 on `out`
        x, y = inputs
        out.copy_((x + 1) * (1 + 3e-6))
        y.add_(2 * x)

    assert timed(axpy_contract(), launch).passed          # float32 default: 1e-5
    tight = {"rtol": 1e-7, "atol": 0.0, "max_rel_err": 1e-7}
    checked = timed(axpy_contract(tolerance=lambda shape, index, dtype:
                                  tight if index == 0 else None), launch)
    assert not checked.passed and checked.failures[0]["max_rel_err"] == 1e-7
    # the same tightening of the in-place output alone leaves `out` to the default: passes
    checked = timed(axpy_contract(tolerance=lambda shape, index, dtype:
                                  tight if index == 1 else None), launch)
    assert checked.passed


def test_scratch_is_passed_to_the_launch_poisoned_each_time_and_never_checked():
    contract = axpy_contract(scratch=lambda inputs: torch.zeros_like(inputs[0]))
    kept = {}

    def honest(inputs, out, scratch):
        scratch.copy_(inputs[0] + 1)                    # writes before it reads
        out.copy_(scratch)
        inputs[1].add_(2 * inputs[0])
        scratch.fill_(123.0)                            # garbage left behind is nobody's business

    assert timed(contract, honest).passed

    def reuses(inputs, out, scratch):                  # keeps a result in scratch across calls
        key = scratch.data_ptr()
        if key not in kept:
            scratch.copy_(inputs[0] + 1)
            kept[key] = True
        out.copy_(scratch)
        inputs[1].add_(2 * inputs[0])

    assert not timed(contract, reuses).passed


@pytest.mark.parametrize("inplace, message", [
    ((1, 1), "INPLACE must be a tuple of distinct input indices"),
    ("y", "INPLACE must be a tuple"),
    ((5,), "INPLACE names input 5, but make_inputs returns 2 inputs"),
])
def test_a_wrong_in_place_declaration_is_one_clear_line(inplace, message):
    contract = axpy_contract(INPLACE=inplace)
    with pytest.raises(hooks.ContractError, match=message):
        timed(contract, lambda inputs, out: None)


def test_an_output_buffer_that_is_an_input_is_refused():
    contract = axpy_contract(empty_output=lambda inputs: inputs[1])
    with pytest.raises(hooks.ContractError, match="empty_output returns memory of an input"):
        timed(contract, lambda inputs, out: None)


def test_a_tolerance_hook_that_answers_nonsense_is_refused():
    contract = axpy_contract(tolerance=lambda shape, index, dtype: {"rtol": 1e-3})
    with pytest.raises(hooks.ContractError, match=r"tolerance\(shape s, output 0\)"):
        timed(contract, lambda inputs, out: None)


def test_a_judge_gets_the_tolerance_hook_from_the_runs_pinned_copy(tmp_path, monkeypatch):
    from perfloop.contract import judge_api as correctness
    from perfloop.contract import judging

    folders = {}
    for name, atol in (("work", 0.5), ("pinned", 1e-9)):   # an experiment loosened "work"
        folder = folders[name] = tmp_path / name
        folder.mkdir()
        (folder / "kernel.toml").write_text(
            "[tolerance.float32]\nrtol = 1e-3\natol = 1e-3\nmax_rel_err = 1e-3\n")
        (folder / "kernel.py").write_text(
            "def tolerance(shape, index, dtype):\n"
            "    if shape.dims[0] < 10:\n        return None\n"
            f"    return {{'rtol': 0.0, 'atol': {atol} * shape.dims[0], 'max_rel_err': 0.0}}\n")
    declared = {"rtol": 1e-3, "atol": 1e-3, "max_rel_err": 1e-3}
    assert correctness.tolerance(folders["work"], "float32") == declared
    assert correctness.tolerance(folders["work"], "float32", dims=(5,)) == declared  # None
    assert correctness.tolerance(folders["work"], "float32", dims=(100,))["atol"] == 50.0
    monkeypatch.setattr(judging, "REQUEST", {"contract": {"folder": str(folders["work"]),
                                                          "copy": str(folders["pinned"])}})
    pinned = correctness.tolerance(folders["work"], "float32", dims=(100,))
    assert pinned["atol"] == pytest.approx(1e-7)


# ---- matmul's tolerance grows with K ----------------------------------------------------------
MATMUL_SHAPES = [((4096, 4096, 4096), "bfloat16"), ((128, 8192, 8192), "bfloat16"),
                 ((3000, 5000, 2000), "float16")]

# `matmul`: the shipped kernel.py on the CPU (conftest.py)


def test_matmuls_tolerance_grows_with_k_and_the_judge_reads_the_same(matmul):
    from perfloop.contract import judge_api as correctness

    def at(k, dtype="bfloat16"):
        return matmul.tolerance(Shape("s", (64, 64, k), dtype), 0, dtype)

    assert at(8192)["atol"] == pytest.approx(2 * at(4096)["atol"])
    assert at(1)["max_rel_err"] < at(4096)["max_rel_err"] < at(8192)["max_rel_err"]
    assert at(4096)["rtol"] == at(8)["rtol"]          # the output's rounding does not grow
    assert matmul.tolerance(Shape("s", (1, 1, 1), "float32"), 0, "float32") is None
    folder = Path(matmul.__file__).parent
    assert correctness.tolerance(folder, "float16", dims=(3000, 5000, 2000)) == at(2000, "float16")


@pytest.mark.parametrize("dims, dtype", MATMUL_SHAPES, ids=lambda x: str(x))
def test_matmul_at_its_shapes_passes_with_fp32_accumulation_and_fails_one_product_short(
        matmul, dims, dtype):
    """On the CPU: 32 rows of C, accumulated in float32 by BLAS then rounded as the kernel
    does, pass with room; the same missing K's last product fails."""
    shape = Shape("s", dims, dtype)
    a, b = matmul.make_inputs(Shape("rows", (32, *dims[1:]), dtype), 3, "cpu")
    reference = a.double() @ b.double()
    tol = matmul.tolerance(shape, 0, dtype)
    right = (a.float() @ b.float()).to(a.dtype)
    good = verify.compare(right, reference, {}, dtype, fixed=tol)
    assert good["passed"] and good["rel_err"] < tol["max_rel_err"] / 2
    short = (a[:, :-1].float() @ b[:-1].float()).to(a.dtype)
    assert not verify.compare(short, reference, {}, dtype, fixed=tol)["passed"]


# ---- shared memory, the shipped kernels' declarations, the timer's poison ------------------
def test_memory_is_shared_only_where_views_overlap():
    whole = torch.zeros(100)
    assert verify.same_memory(whole[:51], whole[50:]) and verify.same_memory(whole, whole[3:4])
    assert not verify.same_memory(whole[:50], whole[50:])      # one allocation, two halves
    assert not verify.same_memory(whole, torch.zeros(100))
    values = [1.0, 2.0]
    assert verify.same_memory(values, values) and not verify.same_memory(values, list(values))


@pytest.mark.parametrize("name", ["swiglu", "rmsnorm", "softmax", "matmul"])
def test_the_shipped_kernels_declare_no_in_place_input_or_scratch(name):
    """So their timing is what it was: no restore, no extra launch argument."""
    pytest.importorskip("cuda.tile")
    from perfloop.contract.kernel import import_module
    from perfloop.contract.manifest import load_spec

    root = ROOT
    module = import_module(root / "kernels" / name, f"shipped_{name}")
    spec = load_spec(root / "kernels" / name, root)
    small = Shape("small", tuple(min(d, 64) for d in spec.headline.dims), spec.headline.dtype)
    inputs = module.make_inputs(small, 0, "cpu")
    kernel_hooks, extra, restore = hooks.prepare(module, inputs, module.empty_output(inputs))
    assert (kernel_hooks.inplace, extra, restore) == ((), (), None)
    assert (kernel_hooks.tolerance is not None) == (name == "matmul")


def test_unchanged_holds_nan_equal_to_nan_and_sees_one_changed_element():
    x = torch.tensor([1.0, float("nan"), 3.0])
    assert verify.unchanged((x, [1.0, float("nan")]), (x.clone(), [1.0, float("nan")]))
    y = x.clone()
    y[2] = 4.0
    assert not verify.unchanged((y,), (x,))
    assert not verify.unchanged(([1.0, 2.0],), ([1.0, 2.5],))


def test_the_timers_poison_is_nan_noise_or_zeros_drawn_each_time():
    """What a launch finds in its output tells it nothing: NaN, noise or zeros, by the timer's
    draw, over every element whatever was there; integers keep their largest value."""
    import random

    import torch

    from perfloop.contract import outputs

    rng, seen = random.Random(5), set()
    for _ in range(30):
        out, ints = torch.full((64,), 7.0), torch.zeros(4, dtype=torch.int32)
        outputs.poison((out, ints), rng)
        assert not (out == 7.0).any() and (ints == torch.iinfo(torch.int32).max).all()
        seen.add("nan" if out.isnan().all() else "zeros" if (out == 0).all() else
                 "noise" if out.abs().max() > 100 else "other")
    assert seen == {"nan", "noise", "zeros"}
    plain = torch.ones(3)
    outputs.poison(plain)                      # (judges and hooks: NaN, as before)
    assert plain.isnan().all()
