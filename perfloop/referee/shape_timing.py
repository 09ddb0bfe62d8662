"""One shape timed: its slots drawn and shared with the launchers, the empty batch calibrated,
each variant's first launch and warm-up (a candidate far slower than the incumbent there is a
cliff), the pad that keeps host time out of a GPU batch, then rounds of batches in a random
order reversed every round, with the bracket's own time taken off every variant alike.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from pathlib import Path

from perfloop.contract import roofline, traffic, workload
from perfloop.contract.dispatch import knobs_for
from perfloop.contract.kernel import Shape
from perfloop.contract.playbook import Measure
from perfloop.core.values import freeze
from perfloop.core.vocab import CONTROL, INCUMBENT
from perfloop.referee.launchers import BRACKET, GpuClock, LauncherFailed, Roster, WallClock
from perfloop.referee.slots import LaunchChecks, Slots, describe_mismatch

CHECKS_PER_BATCH = 2
# the sleep ahead of a batch doubles while the launcher's host work outlasts it (a batch of 256
# launches of 40 us host work each needs 10 ms and more); past a second, the variant fails
MAX_PAD_US = 1_000_000.0
# a warm-up of one-launch batches stops here even short of warmup_ms: each batch also costs
# its flush, its sleep and a round trip (ms), so a short kernel takes long to reach it. The
# GPU is warm from the shapes and variants before; the rounds alternate their order, so what
# warming is left falls on no one variant (docs/findings/2026-11-25-timer-measurements.md)
WARM_MAX_BATCHES = 12
MAX_SLOTS = 256
SLOT_MEMORY_SHARE = 0.25   # of the GPU memory free when a shape starts
# a variant whose batches come out no longer than an empty batch this many times in a shape
# is failed: no time can be measured for it (a clamp to zero once kept identical code as
# "100% faster")
EMPTY_LIMIT = 8
CALIBRATIONS = 5


def cliff_bound(ratio: float | None, incumbent_ms: float, bracket_ms: float) -> float | None:
    """The warm-up time past which a candidate is a cliff: `ratio` times the incumbent's, or
    the empty batch's where the incumbent's launch is shorter (a warm-up is one launch less
    that time: at a few microseconds the difference is noise; on an H200 an honest edit read
    4.0x so at SwiGLU's fp16 8 x 4096). An incumbent of about nothing, a launch shorter than
    the bracket's own time, as at a one-row shape on an H100, sets none."""
    if not ratio or incumbent_ms <= 0:
        return None
    return ratio * max(incumbent_ms, bracket_ms)


def longer_pad(pad_us: float, needed_us: float) -> float:
    """The pad after a batch whose host time outlasted it: doubled, or up to four times as
    long where that batch needed more. Doubled from 200 us, each step cost a wasted batch (five
    at SwiGLU's shapes on an H100); raised to all one batch needed, a batch that the host slowed
    once kept its shape's pad at 140 ms."""
    return min(max(pad_us * 2, needed_us * 1.25), pad_us * 4)


class ShapeTimer:
    def __init__(self, spec: dict, contract, roster: Roster, clock: GpuClock | WallClock,
                 rng: random.Random, progress: Callable[..., None]):
        """`contract`: the run's pinned kernel.py, imported; `roster`: its launchers, built."""
        self.spec, self.contract, self.roster = spec, contract, roster
        self.clock, self.rng, self.progress = clock, rng, progress
        self.device = getattr(contract, "DEVICE", "cuda")
        self.gpu = self.device == "cuda"
        self.simulated = getattr(contract, "simulated_ms", None)
        # every variant of kernel code is checked alike, the incumbent and its control too:
        # what a launch sees does not tell it its role (PyTorch's own launches are not)
        self.unverified = {v["label"] for v in spec["variants"] if v.get("torch")}
        self.knobs = {v["label"]: {k: freeze(x) for k, x in v.get("knobs", {}).items()}
                      for v in spec["variants"]}
        self.ceilings: dict | None = None   # the device's, once the run has them
        self.empties: dict = {}   # (label, shape) -> batches that took no time at all
        self.subtracted: dict = {}   # shape -> whether the bracket was taken off its rounds
        self.buckets = {raw["name"]: raw.get("bucket") for raw in spec["shapes"]}
        self.runs_as: dict = {}  # shape -> the bucket it runs as (a hook's)
        # held-back shape -> its own bucket, where it runs as another: the record says both.
        # The parent names the workload's buckets; a hook's are found here (_bucket)
        self.routed_from = {} if hasattr(contract, "bucket") else {
            raw["name"]: raw["routed_from"] for raw in spec["shapes"] if raw.get("routed_from")}
        # ... and those whose launch tunes once among the finalists (perfloop.contract.dispatch:
        # never with a hook, nor for a kernel that writes its inputs)
        tunes = not hasattr(contract, "bucket") and not getattr(contract, "INPLACE", ())
        self.tuned = {raw["name"] for raw in spec["shapes"] if raw.get("tuned")} if tunes else set()
        self.cliffed: dict = {}   # (label, shape) -> how many times slower its warm-up ran
        self.overhead: dict = {}  # (shape, slots checked) -> ms of an empty batch
        # shape -> us of sleep ahead of every batch there, one for all variants: a variant
        # whose launches keep the host busy longer lengthens it for all, so none is timed
        # with its launches queued further ahead than another's
        self.pads: dict = {}
        # batches per variant and round: a wall clock shares the CPU with everything else, so
        # a round's median over a few batches sheds the one that met a busy moment
        self._per_round = 1 if self.gpu or self.simulated is not None else 3

    def time_shape(self, shape: Shape, labels: list[str], seed: int, index: int,
                   settings: Measure) -> dict | None:
        """`labels` timed at `shape` (None: not timed there, or the incumbent failed)."""
        inputs = self.contract.make_inputs(shape, seed, self.device)
        if self._skipped(shape, inputs):
            return None
        slots = Slots(self.contract, shape, self._warm_n(settings), self.device,
                      self.rng.randrange(1 << 62), self.spec.get("tolerance", {}), self.rng)
        self._share(slots, labels)
        checked: dict = {}
        earlier = {label: self.cliffed[label, shape.name] for label in labels
                   if (label, shape.name) in self.cliffed}
        estimates, cliffs = self._warm_all(shape, [x for x in labels if x not in earlier],
                                           slots, settings)
        cliffs.update(earlier)
        active = [label for label in self.roster.active(labels) if label not in cliffs]
        if INCUMBENT not in active:
            return None
        n = self._slot_count(statistics.median(estimates[label] for label in active),
                             slots.bytes(), settings)
        slots.grow(n)
        self._share(slots, active)
        self._calibrate(slots, shape, min(CHECKS_PER_BATCH, n))
        self._settle_pad(active, slots, shape, n)
        rounds, self.subtracted[shape.name] = self._bracketed(
            self._rounds(shape, active, slots, n, settings, checked), shape, n)
        for label, ratio in cliffs.items():  # dropped here only: a cliff in one bucket
            self.cliffed[label, shape.name] = ratio  # says nothing of the others
        self._release(active)
        return self._shape_result(shape, inputs, rounds, n, checked, cliffs)

    # ---- the slots, shared with the launchers ---------------------------------------------
    def _share(self, slots: Slots, labels: list[str]) -> None:
        """The slots' tensors, shared with each launcher (CUDA memory by IPC handles, CPU
        memory as files in /dev/shm), never copied: what a launch writes, the timer reads."""
        from multiprocessing.reduction import ForkingPickler

        import torch.multiprocessing

        torch.multiprocessing.set_sharing_strategy("file_system")

        message = {"op": "slots", "slots": slots.buffers}
        for label in self.roster.active(labels):
            try:
                self.roster.ask(label, message, pickler=ForkingPickler.dumps)
            except LauncherFailed as exc:
                self.roster.lost(exc)

    def _release(self, labels: list[str]) -> None:
        """The launchers drop the shape's slots, and their memory goes back."""
        for label in self.roster.active(labels):
            try:
                self.roster.ask(label, {"op": "slots", "slots": []})
            except LauncherFailed as exc:
                self.roster.lost(exc)
        if self.gpu:
            import torch

            torch.cuda.ipc_collect()

    def _warm_n(self, settings: Measure) -> int:
        return 1 if self.gpu else max(1, settings.min_reps)

    def _slot_count(self, typical_ms: float, slot_bytes: int, settings: Measure) -> int:
        want = settings.round_ms / max(typical_ms, 1e-4)
        count = int(min(max(want, settings.min_reps), settings.max_reps if not self.gpu
                        else MAX_SLOTS))
        if self.gpu and slot_bytes:
            import torch

            free, _ = torch.cuda.mem_get_info()
            count = min(count, max(1, int(free * SLOT_MEMORY_SHARE // slot_bytes)))
        return max(count, 1)

    # ---- one batch ------------------------------------------------------------------------
    def _batch(self, label: str, slots: Slots, n: int, check: bool, shape: Shape,
               round_index: int, checked: dict) -> float | None:
        """One timed batch of `n` launches; ms per launch, the bracket's own time still in it
        (taken off every variant's alike once a shape's rounds are done: _bracketed), or None
        when host time got in."""
        mine = self.roster.turn(label)
        drawn = slots.refill(n, CHECKS_PER_BATCH if check else 0)
        launcher = self.roster.launchers[label]
        copy = lambda: slots.copy(drawn)  # noqa: E731 (read inside the bracket)
        if isinstance(self.clock, GpuClock):   # (self.gpu)
            pad = self.pads.setdefault(shape.name, 200.0)
            batch = self.clock.batch(launcher, n, copy, pad, self.roster.reply_s)
            self.roster.after_turn(label, mine)
            if batch.host_bound:
                self._longer_pad(label, shape, pad, batch.pad_needed_us)
                return None
        else:
            batch = self.clock.batch(launcher, n, copy)
            self.roster.after_turn(label, mine)
        if drawn:
            self._check(label, slots, drawn, batch.copies, shape, round_index, checked)
        ms = self._simulated(label, slots, shape, n) * n if self.simulated is not None \
            else batch.ms
        if not ms > 0:   # (NaN too) no time at all: timed again, or failed
            self._empty(label, shape, batch.ms)
            return None
        return ms / max(n, 1)

    def _check(self, label, slots, drawn, copies, shape, round_index, checked) -> None:
        failures = slots.check(drawn, copies)
        mine = checked.setdefault(label, LaunchChecks())
        mine.count += len(drawn)
        for failure in failures:
            mine.passed = False
            mine.failures.append({"round": round_index, **failure})
        if failures:
            self.roster.fail(label, f"timed output differs from the reference at {shape.name} "
                                    f"({describe_mismatch(failures[0])})")

    def _empty(self, label: str, shape: Shape, ms: float) -> None:
        key = (label, shape.name)
        self.empties[key] = self.empties.get(key, 0) + 1
        if self.empties[key] >= EMPTY_LIMIT:
            raise LauncherFailed(label, f"its batches at {shape.name} took no time at all "
                                        f"({EMPTY_LIMIT} times, the last {ms:.4f} ms): no time "
                                        "can be measured for it")

    def _simulated(self, label: str, slots: Slots, shape: Shape, n: int) -> float:
        """A test kernel's modelled time (kernel.py's simulated_ms): from its knobs in the
        slot's bucket, never from what its launcher does."""
        assert self.simulated is not None   # (called only for a kernel that models its time)
        knobs = self.knobs[label]
        bucket = self._bucket(slots.buffers[0][0], shape)
        mine = knobs_for(knobs, bucket) if bucket is not None else knobs
        return statistics.mean(self.simulated(mine, shape, self.rng.randrange(1 << 30))
                               for _ in range(n))

    # ---- the pad and the bracket ----------------------------------------------------------
    def _longer_pad(self, label: str, shape: Shape, pad: float, needed: float = 0.0) -> None:
        longer = longer_pad(pad, needed)
        if longer > MAX_PAD_US:
            raise LauncherFailed(label, f"its launches keep the host busy longer than "
                                        f"{MAX_PAD_US / 1e6:.0f} s per batch: their host time "
                                        "cannot be kept out of the device time")
        self.pads[shape.name] = longer

    def _settle_pad(self, labels: list[str], slots: Slots, shape: Shape, n: int) -> None:
        """One untimed batch of `n` launches per variant, the pad lengthened until each one's
        launches are all issued inside it, before any round is timed: every round at this
        shape then runs with the same pad for every variant."""
        if not self.gpu:
            return
        for label in self.roster.active(labels):
            try:
                while self._batch(label, slots, n, False, shape, -1, {}) is None:
                    pass
            except LauncherFailed as exc:
                self.roster.lost(exc)

    def _calibrate(self, slots: Slots, shape: Shape, check: int) -> None:
        """The time of an empty batch (the bracket alone, `check` slots' outputs copied, as a
        batch with that many checks copies them), subtracted from every variant's batches at
        this shape alike. Timed with the empty launcher, never a variant's; the least of a few:
        whatever else the machine does only ever adds to it."""
        if self.simulated is not None:
            return
        samples: list[float] = []
        key, launcher = (shape.name, check), self.roster.launchers[BRACKET]
        copy = lambda: slots.copy(range(check))  # noqa: E731
        while len(samples) < CALIBRATIONS:
            mine = self.roster.turn(BRACKET)
            if isinstance(self.clock, GpuClock):   # (self.gpu)
                pad = self.pads.setdefault(shape.name, 200.0)
                batch = self.clock.batch(launcher, 0, copy, pad, self.roster.reply_s)
                self.roster.after_turn(BRACKET, mine)
                if batch.host_bound:
                    self._longer_pad(BRACKET, shape, pad, batch.pad_needed_us)
                    continue
            else:
                batch = self.clock.batch(launcher, 0, copy)
                self.roster.after_turn(BRACKET, mine)
            samples.append(batch.ms)
        self.overhead[key] = min(samples)

    def _bracket_ms(self, shape) -> float:
        """The time of an empty batch at this shape (its calibrations' largest)."""
        return max((ms for (name, _), ms in self.overhead.items() if name == shape.name),
                   default=0.0)

    def _bracketed(self, rounds: dict, shape: Shape, n: int) -> tuple[dict, bool]:
        """The rounds with the bracket's own time (its empty batches', _calibrate) taken off
        every batch of every variant alike, where each of them ran at least twice as long as
        it; else off none, and the times keep it (a ratio then reads nearer 1, never past
        it). A batch barely longer than the bracket would be all noise once it is taken off
        (a clamp of such a batch to zero once kept identical code as "100% faster"), and
        another process's empty batch can take longer than a variant's whole batch of tiny
        launches (on an H200, 0.302 ms against 0.299 ms)."""
        if self.simulated is not None:
            return rounds, False
        checks = min(CHECKS_PER_BATCH, n)

        def bracket(label: str) -> float:
            return self.overhead.get((shape.name, 0 if label in self.unverified else checks),
                                     0.0) / max(n, 1)

        clear = all(x * 1.0 >= 2 * bracket(label) for label, rs in rounds.items() for r in rs
                    for x in r if x == x)   # (a lost batch, NaN, says nothing)
        if not clear:
            return rounds, False
        return {label: [[x - bracket(label) for x in r] for r in rs]
                for label, rs in rounds.items()}, True

    # ---- buckets --------------------------------------------------------------------------
    def _bucket(self, inputs, shape: Shape):
        """The bucket whose knobs the shape runs: the contract's bucket(inputs) where it has the
        hook (its launches dispatch by it), else the workload's, as the parent named it. A
        held-back shape in a bucket no benchmark shape falls in runs as the nearest measured
        one (perfloop.contract.dispatch routes its launches so), and counts there."""
        if not hasattr(self.contract, "bucket"):
            return self.buckets.get(shape.name)
        if shape.name not in self.runs_as:
            # (a str, as the contract says: the record refuses another type, a dispatch table's
            # JSON keys are strings, and a hook returning 4096 must not cost the experiment)
            own = runs = str(self.contract.bucket(inputs))
            if shape.held_back:
                runs = workload.nearest(own, self._measured()) or own
            if runs != own:
                self.routed_from[shape.name] = own
            self.runs_as[shape.name] = runs
        return self.runs_as[shape.name]

    def _measured(self) -> set:
        """The buckets of the benchmark's shapes (the hook's; a shape not timed yet has its
        inputs made here)."""
        out = set()
        for raw in self.spec["shapes"]:
            shape = Shape.from_dict(raw)
            if not shape.held_back:
                out.add(self._bucket(self.contract.make_inputs(shape, 0, self.device), shape)
                        if shape.name not in self.runs_as else self.runs_as[shape.name])
        return out

    def _skipped(self, shape: Shape, inputs) -> bool:
        """A shape outside the buckets a dispatch change touches (spec "only_buckets"), and not
        named in "always", runs the incumbent's code in every variant: not timed."""
        only = self.spec.get("only_buckets")
        if only is None or shape.name in self.spec.get("always", ()):
            return False
        bucket = self._bucket(inputs, shape)
        return bucket is not None and bucket not in only

    # ---- warm-up and cliffs ---------------------------------------------------------------
    def _warm_all(self, shape, labels, slots, settings) -> tuple[dict, dict]:
        """The empty batch calibrated; then, in a random order, each launcher's first launch
        (compiling: untimed) and its warm-up: the typical time of one launch, and the
        candidates that fell off a cliff. A candidate past the cliff is warmed again right
        after a fresh warm-up of the incumbent, and dropped only if it stays past it: one slow
        moment of a busy machine, or an incumbent warmed in a lucky one, is no cliff (a busy
        2-core machine once read fast math, 33% faster elsewhere, as 77.8x slower)."""
        estimates: dict[str, float] = {}
        cliffs: dict[str, float] = {}
        cliff = getattr(settings, "cliff_ratio", None)
        for check in (0, 1):
            self._calibrate(slots, shape, check)
        active = self.roster.active(labels)
        for label in self.rng.sample(active, len(active)):
            try:
                self.progress(label, "compile", shape=shape.name)
                slots.refill(1, 0)
                self.roster.ask(label, {"op": "prime"}, timeout_s=max(self.roster.reply_s, 600))
                self.progress(label, "time", shape=shape.name)
                estimates[label] = self._warm(label, slots, shape, settings,
                                              self._give_up(label, estimates, shape, cliff))
            except LauncherFailed as exc:
                self.roster.lost(exc)
        for label in [x for x in active if x in estimates]:
            bound = self._give_up(label, estimates, shape, cliff)
            if bound is None or estimates[label] <= bound or \
                    label not in self.roster.active([label]):
                continue
            try:
                estimates[INCUMBENT] = self._warm(INCUMBENT, slots, shape, settings, None)
                bound = self._give_up(label, estimates, shape, cliff)
                estimates[label] = self._warm(label, slots, shape, settings, bound)
                if bound is not None and estimates[label] > bound:
                    cliffs[label] = estimates.pop(label) / estimates[INCUMBENT]
            except LauncherFailed as exc:
                self.roster.lost(exc)
        return estimates, cliffs

    def _warm(self, label: str, slots: Slots, shape: Shape, settings: Measure,
              give_up: float | None) -> float:
        """Batches until warmup_ms of kernel time (at most WARM_MAX_BATCHES); the typical time
        of one launch. Past give_up ms (two batches agreeing) it stops at once: a cliff is plain
        to see. On a GPU a batch is one launch; on a CPU, min_reps (a lone launch is lost in the
        wall clock's noise)."""
        recent: list[float] = []
        clean: list[float] = []
        spent, batches = 0.0, 0
        n = self._warm_n(settings)
        while (spent < settings.warmup_ms and batches < WARM_MAX_BATCHES) or len(recent) < 3:
            # the first batch checked (a wrong kernel goes before its rounds); the others
            # not: a check at a large shape costs more than the launch (a float64 reference)
            check = label not in self.unverified and batches == 0
            ms = self._batch(label, slots, n, check, shape, -1, {})
            if ms is None:
                continue
            batches += 1
            spent += max(ms, 1e-3) * n
            recent = (recent + [ms])[-5:]
            clean = (clean + [ms])[-2:]
            if give_up is not None and len(clean) == 2 and min(clean) > give_up:
                return min(clean)
        return statistics.median(recent)

    def _give_up(self, label: str, estimates: dict, shape, ratio: float | None) -> float | None:
        """The warm-up time past which `label` is a cliff (None: the incumbent, its control,
        PyTorch's launches, or no incumbent warmed yet)."""
        if label in (INCUMBENT, CONTROL) or label in self.unverified or INCUMBENT not in estimates:
            return None
        return cliff_bound(ratio, estimates[INCUMBENT], self._bracket_ms(shape))

    # ---- rounds ---------------------------------------------------------------------------
    def _rounds(self, shape, labels, slots, n, settings, checked) -> dict:
        rounds: dict[str, list] = {label: [] for label in labels}
        first = self.rng.sample(labels, len(labels))   # (no role always goes first)
        for r in range(settings.rounds):
            order = first if r % 2 == 0 else list(reversed(first))
            for label in order:
                if label not in self.roster.active(labels):
                    continue
                self.progress(label, "time", shape=shape.name)
                try:
                    samples = []
                    for _attempt in range(6 + self._per_round):
                        ms = self._batch(label, slots, n, label not in self.unverified, shape,
                                         r, checked)
                        if ms is not None:
                            samples.append(ms)
                        if len(samples) == self._per_round:
                            break
                    rounds[label].append(samples or [float("nan")])
                except LauncherFailed as exc:
                    self.roster.lost(exc)
        return {label: r for label, r in rounds.items() if label in self.roster.active(labels)}

    def _shape_result(self, shape, inputs, rounds, n, checked, cliffs) -> dict:
        done = traffic.of(self.contract, shape, Path(self.spec["contract_folder"]).name)
        floor = roofline.floor_ms(done.bytes, done.flops, self.ceilings) if self.ceilings else None
        return {"bytes": done.bytes, "flops": done.total_flops, "flops_by_unit": done.flops,
                "floor_ms": floor, "bucket": self._bucket(inputs, shape),
                "held_back": shape.held_back, "reps": n, "rounds": rounds,
                **({"routed_from": self.routed_from[shape.name]}
                   if shape.name in self.routed_from else {}),
                **({"tuned": True} if shape.name in self.tuned else {}),
                "host_us": {}, "pad_us": self.pads.get(shape.name, 0.0),
                "checked": {label: c.to_json() for label, c in checked.items()},
                "cliffs": cliffs, "fresh_ratio": {},
                "overhead_ms": {k[1]: v for k, v in self.overhead.items() if k[0] == shape.name},
                "bracket_subtracted": self.subtracted.get(shape.name, False)}
