"""The timing child: `python -m perfloop.child.timer SPEC.json`.

What is timed comes from the variants (their kernel folders and knobs); everything that
defines the benchmark comes from the run's pinned contract folder: inputs, the output buffer,
the reference, bytes and FLOPs, the device and the clock. So an experiment can change how
the kernel computes, never what it is measured on.

For each shape, every variant is timed in alternating rounds (clock.alternating). In every
batch one repetition at a random place runs on freshly drawn inputs and its output is checked
against the float64 reference within the kernel's declared tolerance; the output is poisoned
before every repetition, so a skipped write cannot pass. A variant that fails that check, runs
work on another stream, raises, or replaces perfloop's functions is dropped and recorded with
the reason; the others go on. With `select`, the fastest candidate (at the headline, among those
that lose at no shape) is then timed again against the incumbent in fresh rounds, so the pick among several candidates is not judged on the same
samples that picked it.

Before each variant's code runs, a line naming it goes to the progress file: if this process
dies or hangs, the parent knows whose code did it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from perfloop.child import ceilings, clock, lifeline, streams, tamper
from perfloop.core import envinfo, hooks, outputs, roofline, stats, traffic
from perfloop.core.atomic import digest, write_json
from perfloop.core.errors import UserError
from perfloop.core.kernel import Shape, import_module
from perfloop.core.playbook import Measure, freeze
from perfloop.core.vocab import CONTROL, INCUMBENT, Outcome


class VariantFailed(Exception):
    def __init__(self, label: str, reason: str):
        super().__init__(reason)
        self.label, self.reason = label, reason


class Progress:
    """One line per step into the progress file, flushed before the variant's code runs."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8")

    def __call__(self, label: str, stage: str, **extra) -> None:
        self.file.write(json.dumps({"label": label, "stage": stage, **extra,
                                    "t": round(time.monotonic(), 3)}) + "\n")
        self.file.flush()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


class OutputCheck:
    """The verifier of clock.alternating for one shape: poison, fresh inputs, reference; and,
    for a kernel with hooks (perfloop.core.hooks), in-place inputs restored and scratch poisoned
    before every launch (`reset`), outside the timed window."""

    def __init__(self, contract, shape: Shape, inputs, out, tolerance: dict, device: str,
                 seed: int, overhead: dict, kernel_hooks: hooks.Hooks = hooks.Hooks(),
                 restore: hooks.Restore | None = None):
        self.contract, self.shape, self.inputs, self.out = contract, shape, inputs, out
        self.tolerance, self.device, self.seed = tolerance, device, seed
        self.overhead = overhead  # host seconds spent drawing inputs and checking outputs
        self.draws = 0
        self.reference = self.copy = self.drawn = None
        self.reference_dtype = "float64"
        self.hooks = kernel_hooks
        self.each = kernel_hooks.tolerances(shape, kernel_hooks.checked(out, inputs), tolerance)
        self.reset = restore  # run before every launch (clock.alternating); None: nothing to do

    def before_each(self) -> None:
        outputs.poison(self.out)
        if self.reset is not None:
            self.reset()

    def fresh(self, round_index: int, label: str) -> None:
        t0 = time.monotonic()
        self.draws += 1
        new = self.contract.make_inputs(self.shape, self.seed + self.draws, self.device)
        outputs.refill(self.inputs, new)
        if self.reset is not None:
            self.reset.redraw(new)  # later launches restore to these
        self.reference = self._reference(new)
        self.drawn = new  # to see whether a launch wrote to an input it did not declare
        self.copy = None
        self.overhead["fresh_inputs"] += time.monotonic() - t0

    def _reference(self, inputs):
        if self.reference_dtype == "float64":
            try:
                return self.contract.reference(*outputs.upcast(inputs))
            except (TypeError, RuntimeError, NotImplementedError):
                self.reference_dtype = "native"  # e.g. an op with no float64 kernel
        return self.contract.reference(*inputs)

    def snapshot(self) -> None:
        self.copy = outputs.clone(self.hooks.checked(self.out, self.inputs))

    def check(self) -> dict:
        t0 = time.monotonic()
        if self.copy is None:
            self.snapshot()
        result = outputs.compare(self.copy, self.reference, self.tolerance, self.shape.dtype,
                                each=self.each)
        written = self._written()
        if written is not None:
            result = {**result, "passed": False,
                      "error": f"it wrote to input {written}, which kernel.py does not "
                               "declare in INPLACE"}
        self.reference = self.copy = self.drawn = None
        self.overhead["output_check"] += time.monotonic() - t0
        return {**result, "reference_dtype": self.reference_dtype}

    def _written(self) -> int | None:
        """The first input not declared in-place whose values differ from those drawn."""
        if self.drawn is None or not isinstance(self.inputs, (tuple, list)):
            return None
        for i, (now, drawn) in enumerate(zip(self.inputs, self.drawn)):
            if i not in self.hooks.inplace and not outputs.unchanged(now, drawn):
                return i
        return None


class Worker:
    def __init__(self, spec: dict):
        self.spec = spec
        self.settings = Measure(**spec["measure"])
        self.progress = Progress(Path(spec["progress"]))
        self.failed: dict[str, dict] = {}  # label -> {reason, kind: fail (wrong) | crash | slow}
        # whose code is checked: by default the candidates; the incumbent and its control run
        # code that was checked when it was a candidate, and PyTorch's versions are the reference
        checked = spec.get("checked", [v["label"] for v in spec["variants"][2:]])
        self.unverified = {v["label"] for v in spec["variants"] if v["label"] not in checked
                           or v.get("torch")}
        self.progress_label = INCUMBENT
        self.stream_check = "not run"
        self.overhead = {"stream_check": 0.0, "fresh_inputs": 0.0, "output_check": 0.0}
        self.rng = random.Random(os.urandom(16))
        self.contract = import_module(Path(spec["contract_folder"]), "contract")
        for raw in spec["shapes"]:  # a wrong traffic() stops the worker before any timing
            traffic.of(self.contract, Shape.from_dict(raw), Path(spec["contract_folder"]).name)
        self.device = getattr(self.contract, "DEVICE", "cuda")
        self.gpu = self.device == "cuda"
        # the clock and the tamper snapshot exist before any variant's code is imported
        self.clock = self.contract.Clock() if hasattr(self.contract, "Clock") else clock.CudaClock()
        self.guarded = self._guarded_objects()
        self.before = tamper.snapshot(self.guarded)
        self.launch = self._build_all(spec["variants"])
        if self.gpu:
            streams.warm_up()  # the profiler's first start is slow: pay it while the judge runs

    def wait_for_go(self) -> None:
        """Wait until the parent names the variants that passed the judge."""
        go = Path(self.spec["go"])
        while not go.exists():
            time.sleep(0.02)
        release = json.loads(go.read_text())
        self.labels = [label for label in release["labels"] if label in self.launch
                       or label in self.failed]
        self.select = release.get("select", False)

    def _guarded_objects(self) -> dict:
        if not self.gpu:
            return {}
        import torch

        return {"torch.cuda.Event": torch.cuda.Event, "torch.cuda.synchronize": torch.cuda.synchronize,
                "torch.cuda._sleep": torch.cuda._sleep, "torch.sum": torch.sum}

    def _fail(self, label: str, reason: str, kind: Outcome = Outcome.FAIL) -> None:
        self.failed.setdefault(label, {"reason": reason, "kind": kind})

    def _check_tamper(self, label: str) -> None:
        replaced = tamper.changed(self.before, self._guarded_objects())
        if replaced:
            # nothing this process measures from here on can be trusted: report and stop
            self.progress(label, "tampered", reason="replaced perfloop's timing or checking "
                          f"functions ({', '.join(replaced[:4])})")
            os._exit(4)

    def _build_all(self, variants: list[dict]) -> dict:
        modules, launch = {}, {}
        for v in variants:
            label = v["label"]
            self.progress(label, "build")
            try:
                if v.get("torch"):
                    launch[label] = self._torch_launcher(v["torch"])
                else:
                    # the A/A control gets its own import (and so its own kernel objects and
                    # compiled code), as a candidate with the incumbent's code would: what a
                    # separate build alone changes is then part of the noise, not a gain
                    key = (v["folder"], label == CONTROL)
                    if key not in modules:
                        modules[key] = import_module(Path(v["folder"]), f"variant{len(modules)}")
                    launch[label] = modules[key].build({k: freeze(x) for k, x in v["knobs"].items()})
            except Exception as exc:
                self._fail(label, f"could not be built: {_one_line(exc)}", Outcome.CRASH)
            self._check_tamper(label)
        return launch

    def _torch_launcher(self, kind: str):
        """PyTorch's own version (bench): eager, or torch.compile made fresh for each shape
        with dynamic=False, as a user would compile it for a fixed shape; or one of the
        kernel's other competitors (e.g. a Triton kernel)."""
        reference = self.contract.reference
        if kind.startswith("competitor:"):  # the kernel's own list (contract's competitors())
            other = self.contract.competitors()[kind.removeprefix("competitor:")]
            return lambda inputs, out, *scratch: other(*inputs)
        if kind == "eager":
            return lambda inputs, out, *scratch: reference(*inputs)
        import torch

        compiled = {}

        def launch(inputs, out, *scratch):
            key = id(inputs)
            if key not in compiled:
                torch._dynamo.reset()
                compiled.clear()
                compiled[key] = torch.compile(reference, dynamic=False)
            return compiled[key](*inputs)

        return launch

    # ---- timing ---------------------------------------------------------------------------
    def time_pass(self, labels: list[str], seed: int, cliffs: bool = True) -> dict:
        """`cliffs`: drop a candidate whose warm-up is a cliff. The re-timing of the chosen
        candidate does not: it was timed at every shape already, and one slow warm-up there
        (seen on an H100: 9.7x, where its first pass ran 1.26x) would void the experiment."""
        settings = self.settings if cliffs else dataclasses.replace(self.settings,
                                                                    cliff_ratio=None)
        shapes = {}
        for index, raw in enumerate(self.spec["shapes"]):
            shape = Shape.from_dict(raw)
            active = [label for label in labels if label not in self.failed]
            if INCUMBENT not in active:
                break
            timed = self._time_shape(shape, active, seed, index, settings)
            if timed is not None:
                shapes[shape.name] = timed
        return {"labels": labels, "shapes": shapes}

    def _skipped(self, shape: Shape, inputs) -> bool:
        """A shape outside the buckets a dispatch change touches (spec "only_buckets"), and not
        named in "always", runs the incumbent's code in every variant: not timed."""
        only = self.spec.get("only_buckets")
        if only is None or shape.name in self.spec.get("always", ()) \
                or not hasattr(self.contract, "bucket"):
            return False
        return self.contract.bucket(inputs) not in only

    def _time_shape(self, shape: Shape, labels: list[str], seed: int, index: int,
                    settings: Measure) -> dict | None:
        inputs = self.contract.make_inputs(shape, seed, self.device)
        if self._skipped(shape, inputs):
            return None
        out = self.contract.empty_output(inputs)
        tolerance = self.spec.get("tolerance", {})
        try:  # a hook declared wrongly voids the benchmark, not one variant
            kernel_hooks, extra, restore = hooks.prepare(self.contract, inputs, out)
            check = OutputCheck(self.contract, shape, inputs, out, tolerance, self.device,
                                seed=1_000_003 * (index + 1) + 7919 * seed,
                                overhead=self.overhead, kernel_hooks=kernel_hooks,
                                restore=restore)
        except hooks.ContractError as exc:
            raise VariantFailed(INCUMBENT, str(exc)) from None
        while True:
            active = [label for label in labels if label not in self.failed]
            bound = {label: self._bound(label, inputs, out, extra) for label in active}
            try:
                self._stream_check(bound, shape, check.reset)
                active = [label for label in active if label not in self.failed]
                rounds = clock.alternating(
                    self.clock, {label: bound[label] for label in active}, settings,
                    verifier=check, rng=self.rng, unverified=self.unverified,
                    on_batch=lambda label: self._before_batch(label, shape))
                break
            except VariantFailed as exc:
                if exc.label in (INCUMBENT, CONTROL):
                    raise
                self._fail(exc.label, exc.reason, Outcome.CRASH)
        self._check_tamper(self.progress_label)
        for label, ratio in rounds.cliffs.items():
            self._fail(label, f"at {shape.name} its warm-up ran {ratio:.1f}x slower than the "
                              "incumbent's: dropped as a cliff, not timed further", Outcome.SLOW)
        for label, checked in rounds.checked.items():
            if not checked.passed:
                first = checked.failures[0]
                self._fail(label, f"timed output differs from the reference at {shape.name} "
                                  f"({_describe_mismatch(first)})")
            ratio = _fresh_ratio(checked)
            limit = self.spec.get("max_fresh_ratio")
            if limit and ratio is not None and ratio > limit:
                self._fail(label, f"at {shape.name} the checked launches, on fresh inputs, took "
                                  f"{ratio:.2f}x the others: its results look cached")
        done = traffic.of(self.contract, shape, Path(self.spec["contract_folder"]).name)
        floor = roofline.floor_ms(done.bytes, done.flops, self.ceilings) if self.ceilings else None
        bucket = self.contract.bucket(inputs) if hasattr(self.contract, "bucket") else None
        return {"bytes": done.bytes, "flops": done.total_flops, "flops_by_unit": done.flops,
                "floor_ms": floor, "bucket": bucket,
                "held_back": shape.held_back, **rounds.to_json(),
                "fresh_ratio": {label: _fresh_ratio(c) for label, c in rounds.checked.items()}}

    def _before_batch(self, label: str, shape: Shape) -> None:
        self._check_tamper(self.progress_label)  # whose code ran since the last check
        self.progress_label = label
        self.progress(label, "time", shape=shape.name)

    def _bound(self, label: str, inputs, out, extra: tuple = ()):
        launch = self.launch[label]

        def call():
            try:
                return launch(inputs, out, *extra)
            except Exception as exc:
                raise VariantFailed(label, f"raised while timed: {_one_line(exc)}") from None

        return call

    def _stream_check(self, bound: dict, shape: Shape, reset=None) -> None:
        if not self.gpu:
            return
        for label, call in bound.items():
            self.progress(label, "compile", shape=shape.name)
            self.progress_label = label
            if reset is not None:
                reset()
            call()  # compile first, so the profiled call is a plain one
            if label in self.unverified:
                continue
            self.progress(label, "stream-check", shape=shape.name)
            t0 = time.monotonic()
            if reset is not None:
                reset()
            try:
                off = streams.off_stream_activity(call)
            except streams.Unavailable as exc:
                self.stream_check = f"unavailable: {exc}"
                continue
            finally:
                self.overhead["stream_check"] += time.monotonic() - t0
            if off:
                self._fail(label, f"at {shape.name} it ran work on another CUDA stream "
                                  f"({', '.join(off[:3])}), which the clock does not see")
            elif self.stream_check == "not run":
                self.stream_check = "profiler (CUPTI): GPU work off the timed stream fails"

    # ---- the whole run --------------------------------------------------------------------
    def run(self) -> dict:
        env = envinfo.capture(self.gpu)
        self.ceilings = (ceilings.get(Path(self.spec["ceilings_cache"]), env, self.clock)
                         if self.gpu else None)
        labels = self.labels
        seed = self.spec.get("seed", 0)
        passes = [self.time_pass(labels, seed)]
        best = None
        candidates = [label for label in labels[2:] if label not in self.failed]
        if self.select and len(candidates) > 1 and passes[0]["shapes"]:
            best = _fastest(passes[0], candidates, self.spec["headline"],
                            self.spec.get("regression_tolerance", 0.0))
            passes.append(self.time_pass([INCUMBENT, CONTROL, best], seed + 1, cliffs=False))
        elif len(candidates) == 1:
            best = candidates[0]
        reps = next(iter(passes[-1]["shapes"].values()), {}).get("reps", 0)
        return {"environment": env, "ceilings": self.ceilings,
                "failed": {k: v for k, v in self.failed.items() if k in labels},
                "passes": passes, "best": best,
                "method": {**clock.method(self.clock, self.settings, reps),
                           "verified": "one repetition per batch, at a random place, on fresh "
                                       "inputs, against the float64 reference",
                           "stream_check": self.stream_check,
                           "overhead_s": {k: round(v, 3) for k, v in self.overhead.items()},
                           "selection": "best candidate re-timed in fresh rounds"
                           if len(passes) > 1 else "single pass"}}


def _fresh_ratio(checked: clock.Checked) -> float | None:
    if len(checked.verified_ms) < 3 or not checked.other_ms:
        return None
    other = statistics.median(checked.other_ms)
    return statistics.median(checked.verified_ms) / other if other > 0 else None


def _describe_mismatch(failure: dict) -> str:
    if failure.get("error"):
        return failure["error"]
    which = f"output {failure['output']}: " if "output" in failure else ""
    return (f"{which}{failure['non_finite']} non-finite, {failure['outside_tolerance']} outside "
            f"atol={failure['atol']} rtol={failure['rtol']}, relative error {failure['rel_err']:.3g}")


def _fastest(first_pass: dict, candidates: list[str], headline: str, tolerance: float) -> str:
    """The candidate to carry into the decision: the fastest at the headline among those no
    slower than the incumbent (beyond `tolerance`) at any shape; the fastest at the headline
    when every candidate loses somewhere (the decision then reverts, saying where)."""
    ratios = {label: {} for label in candidates}
    for name, shape in first_pass["shapes"].items():
        inc = [statistics.median(r) for r in shape["rounds"][INCUMBENT]]
        for label in candidates:
            mine = [statistics.median(r) for r in shape["rounds"][label]]
            ratios[label][name] = stats.compare(inc, mine).ratio
    safe = [c for c in candidates if max(ratios[c].values()) <= 1 + tolerance]
    return min(safe or candidates, key=lambda label: ratios[label][headline])


def main(spec_path: str) -> int:
    lifeline.guard_parent()
    if not Path(spec_path).exists() and not lifeline.wait_for_task(Path(spec_path)):
        return 3  # started ahead (phases.start_timer_ahead) for an experiment that never came
    raw = Path(spec_path).read_bytes()
    spec = json.loads(raw)
    try:
        worker = Worker(spec)
    except UserError as exc:  # the contract itself is wrong (traffic()): its one line, no label
        Progress(Path(spec["progress"]))(None, "contract", reason=str(exc))
        return 6
    worker.wait_for_go()
    try:
        result = worker.run()
    except VariantFailed as exc:  # the incumbent itself failed: nothing can be compared
        worker.progress(exc.label, "failed", reason=exc.reason)
        return 5
    finally:
        if spec.get("imports_out"):
            Path(spec["imports_out"]).write_text(json.dumps(tamper.imported_files()))
    write_json(Path(spec["out"]), {**result, "spec": digest(raw)})  # (phases checks it)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
