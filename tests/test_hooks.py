"""The optional hooks of a kernel's contract (perfloop.core.hooks) as the timing worker applies them,
on the CPU: in-place inputs restored before every launch and outside the timed window, scratch
poisoned, writes to undeclared inputs caught, a tolerance per output."""

import json
import shutil
import types
from pathlib import Path

import pytest

from perfloop.child import clock as measure
from perfloop.child.timer import OutputCheck
from perfloop.core import hooks
from perfloop.core import outputs as verify
from perfloop.core.kernel import Shape
from perfloop.core.playbook import Measure

torch = pytest.importorskip("torch")

SHAPE = Shape("s", (64,), "float32", headline=True)
SETTINGS = Measure(rounds=4, round_ms=5, warmup_ms=3, min_reps=5, max_reps=8)


class RecordingClock:
    """A clock whose window is the call itself: it logs 'start' and 'stop' around each call,
    so anything perfloop does (logged by the spies below) shows where it fell."""

    def __init__(self):
        self.log = []

    def time_batch(self, fn, reps, before=None):
        out = []
        for i in range(reps):
            if before is not None:
                before(i)
            self.log.append("start")
            fn()
            self.log.append("stop")
            out.append(1.0)
        return out

    def describe(self):
        return {"clock": "recording"}


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


def timed(contract, launch, *, tolerance=None, clock=None):
    """Time `launch` alone the way the worker does at one shape; returns (Checked, clock)."""
    clock = clock or RecordingClock()
    inputs = contract.make_inputs(SHAPE, 0, "cpu")
    out = contract.empty_output(inputs)
    kernel_hooks, extra, restore = hooks.prepare(contract, inputs, out)
    check = OutputCheck(contract, SHAPE, inputs, out, tolerance or {}, "cpu", seed=1,
                        overhead={"fresh_inputs": 0.0, "output_check": 0.0},
                        kernel_hooks=kernel_hooks, restore=restore)
    rounds = measure.alternating(clock, {"v": lambda: launch(inputs, out, *extra)}, SETTINGS,
                                 verifier=check)
    return rounds.checked["v"], clock


def test_a_correct_in_place_kernel_passes_and_its_launches_never_compound():
    seen = []

    def launch(inputs, out):
        x, y = inputs
        seen.append(float(y.max()))  # drawn in [0, 1): more means an earlier update stayed
        out.copy_(x + 1)
        y.add_(2 * x)

    checked, _ = timed(axpy_contract(), launch)
    assert checked.passed, checked.failures
    assert len(seen) > 30 and max(seen) < 1.0


def test_the_restore_happens_before_every_launch_and_outside_the_timed_window(monkeypatch):
    clock = RecordingClock()
    real = verify.refill
    monkeypatch.setattr(verify, "refill", lambda d, s: (clock.log.append("refill"), real(d, s)))
    calls = []

    def launch(inputs, out):
        clock.log.append("launch")
        calls.append(1)
        out.copy_(inputs[0] + 1)
        inputs[1].add_(2 * inputs[0])

    timed(axpy_contract(), launch, clock=clock)
    inside = False
    for event in clock.log:                 # nothing of perfloop's between start and stop
        assert not inside or event in ("launch", "stop"), clock.log
        inside = event == "start" or inside and event != "stop"
    # every launch, timed or not (first call, host timing, warm-up), follows a restore
    log = clock.log
    launches = [i for i, e in enumerate(log) if e == "launch"]
    assert len(launches) == len(calls) > 30
    for i in launches:
        last = [e for e in log[:i] if e in ("refill", "launch")]
        assert last and last[-1] == "refill", log[max(0, i - 4):i + 1]


def test_an_in_place_kernel_right_only_on_its_first_launch_fails():
    """It updates y on its first call and then, as if y already held the result, skips it."""
    calls = []

    def launch(inputs, out):
        x, y = inputs
        out.copy_(x + 1)
        if not calls:
            y.add_(2 * x)
        calls.append(1)

    checked, _ = timed(axpy_contract(), launch)
    assert not checked.passed
    assert checked.failures[0]["output"] == 1   # the in-place input, not the output


def test_a_kernel_that_skips_work_when_the_buffer_already_holds_the_result_never_can():
    """Without the restore, the buffer would hold the previous launch's result."""
    done, skipped = {}, []

    def launch(inputs, out):
        x, y = inputs
        out.copy_(x + 1)
        key = y.data_ptr()
        if key in done and torch.equal(done[key], y):
            skipped.append(1)
            return                                      # "already up to date"
        y.add_(2 * x)
        done[key] = y.clone()

    checked, _ = timed(axpy_contract(), launch)
    # y is restored before every launch, so it never holds a result: the kernel does its work
    # every time, and is right
    assert checked.passed and not skipped


def test_a_launch_that_writes_an_undeclared_input_fails_though_its_outputs_are_right():
    """out = 2 x, with x used as working memory. Its checked launch runs on fresh inputs, so its
    output matches the reference, yet every other launch ran on what it left in x."""

    def make_inputs(shape, seed, device):
        return (torch.rand(shape.dims, generator=torch.Generator().manual_seed(seed)),)

    contract = types.SimpleNamespace(make_inputs=make_inputs, reference=lambda x: 2 * x,
                                     empty_output=lambda inputs: torch.empty_like(inputs[0]))

    def launch(inputs, out):
        out.copy_(2 * inputs[0])
        inputs[0].mul_(0.5)

    checked, _ = timed(contract, launch)
    assert not checked.passed
    first = checked.failures[0]
    assert first["rel_err"] < 1e-6                        # the output itself was right
    assert "wrote to input 0" in first["error"] and "INPLACE" in first["error"]


def test_a_per_output_tolerance_tighter_than_the_dtype_default_rejects_what_it_would_pass():
    def launch(inputs, out):                              # relative error 3e-6 on `out`
        x, y = inputs
        out.copy_((x + 1) * (1 + 3e-6))
        y.add_(2 * x)

    assert timed(axpy_contract(), launch)[0].passed       # float32 default: 1e-5
    tight = {"rtol": 1e-7, "atol": 0.0, "max_rel_err": 1e-7}
    checked, _ = timed(axpy_contract(tolerance=lambda shape, index, dtype:
                                     tight if index == 0 else None), launch)
    assert not checked.passed and checked.failures[0]["max_rel_err"] == 1e-7
    # the same tightening of the in-place output alone leaves `out` to the default: passes
    checked, _ = timed(axpy_contract(tolerance=lambda shape, index, dtype:
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

    assert timed(contract, honest)[0].passed

    def reuses(inputs, out, scratch):                  # keeps a result in scratch across calls
        if "done" not in kept:
            scratch.copy_(inputs[0] + 1)
            kept["done"] = True
        out.copy_(scratch)
        inputs[1].add_(2 * inputs[0])

    assert not timed(contract, reuses)[0].passed


def test_a_kernel_without_hooks_is_timed_as_before(monkeypatch):
    """No restore, no extra work before any launch: only the output's poison."""
    clock = RecordingClock()
    real_refill, real_poison = verify.refill, verify.poison
    monkeypatch.setattr(verify, "refill", lambda d, s: (clock.log.append("refill"),
                                                        real_refill(d, s)))
    monkeypatch.setattr(verify, "poison", lambda x: (clock.log.append("poison"), real_poison(x)))
    contract = axpy_contract()
    del contract.INPLACE
    contract.reference = lambda x, y: x + 1

    def launch(inputs, out):
        out.copy_(inputs[0] + 1)

    checked, _ = timed(contract, launch, clock=clock)
    assert checked.passed
    refills = clock.log.count("refill")
    assert refills == SETTINGS.rounds        # the fresh inputs of each batch's checked launch
    assert all(e in ("start", "stop", "poison", "refill") for e in clock.log)
    before = clock.log[:clock.log.index("poison")]
    assert set(before) <= {"start", "stop"}  # warm-up and host timing: nothing in between


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
    from perfloop.child import judge_api as correctness
    from perfloop.child import judge_plugin as judging

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


@pytest.fixture(scope="module")
def matmul():
    pytest.importorskip("cuda.tile")
    from perfloop.core.kernel import import_module

    return import_module(Path(__file__).resolve().parent.parent / "kernels" / "matmul",
                         "matmul_tolerance")


def test_matmuls_tolerance_grows_with_k_and_the_judge_reads_the_same(matmul):
    from perfloop.child import judge_api as correctness

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


# ---- through the loop: the worker reads the hooks from the run's pinned kernel.py ----------
SUPPORT = Path(__file__).resolve().parent / "support"


@pytest.fixture
def inplace(scratch):
    """The scratch repository with the scripted kernel replaced by an in-place one."""
    shutil.copy(SUPPORT / "inplace_scripted.py", scratch.kernel / "kernel.py")
    shutil.copy(SUPPORT / "judge_inplace.py", scratch.path / "tests" / "judge_scripted.py")
    scratch.commit_all("an in-place kernel")
    return scratch


def _step_with_mode(repo, mode: str) -> dict:
    code, out, err = repo.cli("init", "--kernel", "scripted")
    assert code == 0 and out["experiment"]["status"] == "keep", (out, err)
    knobs = repo.kernel / "knobs.json"
    knobs.write_text(knobs.read_text().replace('"mode": "ok"', f'"mode": "{mode}"'))
    code, out, err = repo.cli("step", "--kernel", "scripted", "--describe", f"mode {mode}")
    assert code == 0, err
    return out["experiment"]


def test_an_in_place_kernel_is_timed_and_checked_through_the_loop(inplace):
    code, out, err = inplace.cli("init", "--kernel", "scripted")
    assert code == 0 and (out["experiment"]["status"], out["experiment"]["correctness"]) == (
        "keep", "PASS"), (out, err)
    # the baseline's timed launches were checked (y included: see the "once" cheat below)
    assert inplace.records()[0]["timing"]["method"]["overhead_s"]["output_check"] > 0


@pytest.mark.parametrize("mode, reason", [
    ("once", "timed output differs from the reference at head (output 1:"),
    ("scribble", "wrote to input 1, which kernel.py does not declare in INPLACE"),
])
def test_in_place_cheats_that_pass_the_judge_fail_the_timed_check(inplace, mode, reason):
    e = _step_with_mode(inplace, mode)
    assert (e["status"], e["correctness"]) == ("revert", "FAIL"), e
    assert reason in e["reason"], e["reason"]


def test_a_wrong_in_place_declaration_fails_the_baseline_in_one_line(inplace):
    kernel = inplace.kernel / "kernel.py"
    kernel.write_text(kernel.read_text().replace("INPLACE = (2,)", "INPLACE = (7,)"))
    inplace.commit_all("a wrong declaration")
    code, out, err = inplace.cli("init", "--kernel", "scripted")
    assert code != 0 and "Traceback" not in err
    assert "INPLACE names input 7, but make_inputs returns 3 inputs" in json.dumps(out)


def test_memory_is_shared_only_where_views_overlap():
    whole = torch.zeros(100)
    assert verify.same_memory(whole[:51], whole[50:]) and verify.same_memory(whole, whole[3:4])
    assert not verify.same_memory(whole[:50], whole[50:])      # one allocation, two halves
    assert not verify.same_memory(whole, torch.zeros(100))
    values = [1.0, 2.0]
    assert verify.same_memory(values, values) and not verify.same_memory(values, list(values))


def test_the_cuda_clock_runs_before_ahead_of_its_flush_pad_and_start_event():
    """The restore runs in `before`: on the GPU clock that must come ahead of the L2 flush (so
    the flush evicts what the copy wrote) and the sleep pad, and outside the events."""
    log = []
    clock = object.__new__(measure.CudaClock)
    clock.pad_us, clock.cycles_per_us = 20.0, 1.0
    clock._event = lambda enable_timing: object()
    clock._record = lambda event: log.append("record")
    clock.flush = lambda: log.append("flush")
    clock._sleep = lambda cycles: log.append("sleep")
    clock._sync = lambda: log.append("sync")
    clock._elapsed = lambda start, end: 1.0
    clock.time_batch(lambda: log.append("launch"), 2, before=lambda i: log.append("before"))
    assert log == ["before", "flush", "sleep", "record", "launch", "record"] * 2 + ["sync"]


@pytest.mark.parametrize("name", ["swiglu", "rmsnorm", "softmax", "matmul"])
def test_the_shipped_kernels_declare_no_in_place_input_or_scratch(name):
    """So their timing is what it was: no restore, no extra launch argument."""
    pytest.importorskip("cuda.tile")
    from perfloop.core.kernel import import_module
    from perfloop.core.manifest import load_spec

    root = Path(__file__).resolve().parent.parent
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
