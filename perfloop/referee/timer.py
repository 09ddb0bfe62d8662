"""The trusted timer: `python -m perfloop.referee.timer SPEC.json`. It never imports kernel code.

Everything that defines the benchmark comes from the run's pinned contract folder (the base
commit's kernel.py): inputs, output buffers, the reference, bytes and FLOPs, the bucket. Each
variant (the incumbent, its A/A control, each candidate) is built in a launcher process of its
own (perfloop.child.launcher), so no variant's code shares a process with another's or with
the clock. For each shape, in alternating rounds, each launcher runs batches: N launches on N
slots of inputs drawn afresh for every batch (perfloop.referee.slots), timed from here
(perfloop.referee.launchers: CUDA events around interprocess events on a GPU, the wall clock on
a CPU), a few slots at random checked against the float64 reference. A launcher that crashes,
hangs, raises or returns a wrong output is dropped with the reason; the others go on. With
`select`, the fastest candidate is timed again against the incumbent in fresh rounds.

Its result (the statistics are perfloop's own process's: perfloop.measure.phases) lists per
shape and variant the per-launch time of each batch, round by round.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from types import MappingProxyType

from perfloop.contract import hooks, outputs, roofline, traffic, workload
from perfloop.core import envinfo, stats
from perfloop.isolation import childlog, gpu_ipc, spawn
from perfloop.core.atomic import digest, write_json
from perfloop.contract.dispatch import knobs_for
from perfloop.core.errors import UserError
from perfloop.contract.kernel import Shape, code_digest, import_module
from perfloop.isolation.lifeline import guard_parent, wait_for_task
from perfloop.contract.playbook import Measure
from perfloop.isolation.sandbox import Confinement, kernel_env, linked_cache
from perfloop.core.values import freeze
from perfloop.core.vocab import CONTROL, INCUMBENT, Outcome
from perfloop.referee import ceilings, replay, scheduling
from perfloop.referee.launchers import GpuClock, Launcher, LauncherFailed, WallClock
from perfloop.referee.slots import LaunchChecks, Slots

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
# the launcher whose empty batches give the bracket's own time, subtracted from every batch
# alike: it runs no variant's code, so no variant's turns tell it apart, and work a stopped
# launcher keeps doing enters no variant's calibration (a candidate-only one once read 12.3 ms
# for 0.25 while a stopped group worked in the kernel)
BRACKET = "bracket"
# the class's empty maps until _plan_replay sets its own: read-only, so none is shared by writes
_NONE_YET: dict = MappingProxyType({})  # type: ignore[assignment]  # (never written to)
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


class Progress:
    """One line per step into the progress file, flushed before the step runs."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8")

    def __call__(self, label, stage: str, **extra) -> None:
        self.file.write(json.dumps({"label": label, "stage": stage, **extra,
                                    "t": round(time.monotonic(), 3)}) + "\n")
        self.file.flush()


class Timer:
    held_back_skipped = False   # a pass found no gain at the benchmark's shapes
    # (none until the go: perfloop.referee.replay)
    replays: dict[str, list] = _NONE_YET       # label -> its judge cases not replayed yet
    replay_spots: dict[str, int] = _NONE_YET   # label -> the shape index its replay runs before
    replayed: dict[str, int] = _NONE_YET       # label -> how many of its judge cases were replayed

    def __init__(self, spec: dict):
        self.spec = spec
        self.settings = Measure(**spec["measure"])
        self.progress = Progress(Path(spec["progress"]))
        self.failed: dict[str, dict] = {}  # label -> {reason, kind}
        self.reply_s = float(spec.get("reply_timeout_s", 300))
        childlog.configure(float(spec.get("log_cap_mb", childlog.DEFAULT_CAP_MB)))  # (launchers)
        self._own = _own_helpers()   # before any kernel code exists
        self.sched = scheduling.own()  # what every timed batch runs with
        forked = self._fork_launchers(spec["variants"])  # first: see perfloop.referee.launchers
        self.rng = random.Random(os.urandom(16))
        self.contract = import_module(Path(spec["contract_folder"]), "contract")
        for raw in spec["shapes"]:  # a wrong traffic() stops the timer before any timing
            traffic.of(self.contract, Shape.from_dict(raw), Path(spec["contract_folder"]).name)
        self.device = getattr(self.contract, "DEVICE", "cuda")
        self.gpu = self.device == "cuda"
        self.simulated = getattr(self.contract, "simulated_ms", None)
        # every variant of kernel code is checked alike, the incumbent and its control too:
        # what a launch sees does not tell it its role (PyTorch's own launches are not)
        self.unverified = {v["label"] for v in spec["variants"] if v.get("torch")}
        self.knobs = {v["label"]: {k: freeze(x) for k, x in v.get("knobs", {}).items()}
                      for v in spec["variants"]}
        self.clock = GpuClock() if self.gpu else WallClock()
        # the timer's own limits, checked after every turn; every launcher runs kernel code
        # from here on (they build side by side), so a change now cannot be laid at one's door
        self.limits = scheduling.own_limits()
        self.launchers = self._start_launchers(spec["variants"], forked)
        changed = scheduling.restore_own(self.sched, self.limits)
        if changed:
            raise LauncherFailed(BRACKET, f"the trusted timer's {changed[0]} changed while the "
                                          "variants were built: nothing can be timed fairly")
        if BRACKET not in self.launchers:
            raise LauncherFailed(BRACKET, self.failed.get(BRACKET, {}).get(
                "reason", "the timer's own empty launcher could not be built"))
        self.empties: dict = {}   # (label, shape) -> batches that took no time at all
        self.subtracted: dict = {}   # shape -> whether the bracket was taken off its rounds
        self.buckets = {raw["name"]: raw.get("bucket") for raw in spec["shapes"]}
        self.runs_as: dict = {}  # shape -> the bucket it runs as (a hook's)
        # held-back shape -> its own bucket, where it runs as another: the record says both.
        # The parent names the workload's buckets; a hook's are found here (_bucket)
        self.routed_from = {} if hasattr(self.contract, "bucket") else {
            raw["name"]: raw["routed_from"] for raw in spec["shapes"] if raw.get("routed_from")}
        # ... and those whose launch tunes once among the finalists (perfloop.contract.dispatch:
        # never with a hook, nor for a kernel that writes its inputs)
        tunes = not hasattr(self.contract, "bucket") and not getattr(self.contract, "INPLACE", ())
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

    # ---- launchers ------------------------------------------------------------------------
    def _launcher_env(self, v: dict, folder: Path) -> dict:
        """A launcher's environment (perfloop.isolation.sandbox): it writes only its folder (with
        its code's compile cache), and reads only the code it runs (its variant's export; the
        contract for PyTorch's own launches), whatever its role."""
        conf = self.spec.get("confinement") or {}
        code = v.get("folder") or (self.spec["contract_folder"] if v.get("torch") else None)
        env = dict(os.environ)
        if code:
            shared = Path(self.spec.get("cache", folder.parent)) / code_digest(Path(code))
            env["CUDA_TILE_CACHE_DIR"] = linked_cache(folder, shared)
        confinement = Confinement(conf.get("mode", "off"), (str(code),) if code else ())
        return kernel_env(env, folder, self.spec["root"], confinement)

    def _fork_launchers(self, variants: list[dict]) -> dict:
        """One launcher per variant and the empty one, forked in a random order (an order
        drawn from the system, not from a generator the launchers would inherit), each in a
        folder of a random name with its log there: nothing of a launcher's process names
        its role."""
        import torch  # noqa: F401 (each launcher starts with it imported)

        work = Path(self.spec["progress"]).parent
        every = [*variants, {"label": BRACKET, "torch": None, "folder": None}]
        out = {}
        for v in random.SystemRandom().sample(every, len(every)):
            folder = work / f"k-{os.urandom(6).hex()}"
            folder.mkdir(parents=True)
            out[v["label"]] = Launcher(v["label"], cwd=folder, env=self._launcher_env(v, folder),
                                       log=folder / "launcher.log", reply_s=self.reply_s)
        return out

    def _start_launchers(self, variants: list[dict], out: dict) -> dict:
        setups = {}
        for v in [*variants, {"label": BRACKET, "empty": True}]:
            label = v["label"]
            kind = "empty" if v.get("empty") else v.get("torch") or "kernel"
            setup = {"device": self.device, "kind": kind, "folder": v.get("folder"),
                     "knobs": v.get("knobs", {}), "contract_folder": self.spec["contract_folder"]}
            if self.gpu:
                events = (gpu_ipc.IpcEvent(), gpu_ipc.IpcEvent())
                setup["events"] = {"go": events[0].handle(), "done": events[1].handle()}
                setup["events_objects"] = events
            setups[label] = setup
            self.progress(label, "build")
        for step in ("configure", "built"):  # (every launcher builds while the others do)
            for label, launcher in list(out.items()):
                try:
                    if step == "configure":
                        launcher.configure(setups[label])
                    else:
                        launcher.built(self.spec.get("build_timeout_s", 3600))
                except LauncherFailed as exc:
                    self._fail(label, exc.reason, Outcome.CRASH)
                    launcher.kill()
                    del out[label]
        return out

    def _fail(self, label: str, reason: str, kind: str = Outcome.FAIL) -> None:
        self.failed.setdefault(label, {"reason": reason, "kind": kind})
        launcher = self.launchers.get(label) if hasattr(self, "launchers") else None
        if launcher is not None and kind != Outcome.FAIL:
            launcher.kill()

    def _lost(self, exc: LauncherFailed) -> None:
        """A launcher crashed, hung or raised: dropped; without the incumbent (or the empty
        launcher that calibrates the bracket), nothing compares."""
        self.progress(exc.label, "failed", reason=exc.reason)
        if exc.label in (INCUMBENT, CONTROL, BRACKET):
            raise exc
        self._fail(exc.label, exc.reason, Outcome.CRASH)
        launcher = self.launchers.pop(exc.label, None)
        if launcher is not None:
            launcher.kill()

    def wait_for_go(self) -> None:
        """Wait until the parent names the variants that passed the judge."""
        go = Path(self.spec["go"])
        while not go.exists():
            time.sleep(0.02)
        release = json.loads(go.read_text())
        self.labels = [label for label in release["labels"]
                       if label in self.launchers or label in self.failed]
        self.select = release.get("select", False)
        for label in list(self.launchers):
            if label not in self.labels and label != BRACKET:
                self.launchers.pop(label).kill()
        self._plan_replay(release.get("replay"))

    # ---- the judge's cases, replayed (perfloop.referee.replay) ----------------------------
    def _plan_replay(self, where: dict | None) -> None:
        """Each verified variant's judge cases, and where in the first pass they run: before a
        shape drawn at random, or after the last one."""
        self.replays, self.replay_spots, self.replayed = {}, {}, {}
        if not where:
            return
        verified = [label for label in self.labels if label not in self.unverified]
        try:
            self.replays = replay.load(where, self.spec["variants"])
        except replay.Unreadable as exc:
            for label in verified:
                self._fail(label, f"the judge's cases could not be replayed: {exc}")
            return
        self.replays = {k: v for k, v in self.replays.items() if k in verified}
        self.replay_spots = {label: self.rng.randrange(len(self.spec["shapes"]) + 1)
                             for label in self.replays}

    def _replay_due(self, index: int | None, labels: list[str]) -> None:
        """The replays planned before shape `index` of the pass (None: every one left)."""
        for label in labels:
            if label in self.replays and (index is None or self.replay_spots[label] == index):
                self._replay(label, self.replays.pop(label))

    def _replay(self, label: str, cases: list) -> None:
        """One untimed batch of the variant's judge cases in its launcher: shared as slots
        are, outputs poisoned, launched as a timed batch is, then compared here."""
        if label not in self._active([label]):
            return
        from multiprocessing.reduction import ForkingPickler

        self.progress(label, "replay", cases=len(cases))
        launcher = self.launchers[label]
        try:
            buffers = [case.buffers(self.gpu) for case in cases]
        except replay.Unreadable as exc:
            self._fail(label, f"the judge's cases could not be replayed: {exc}")
            return
        copy = lambda: [outputs.clone(out) for _, out, _ in buffers]  # noqa: E731
        try:
            self._ask(label, {"op": "slots", "slots": buffers}, pickler=ForkingPickler.dumps)
            mine = self._turn(label)
            for _, out, _ in buffers:
                outputs.poison(out, self.rng)
            if isinstance(self.clock, GpuClock):   # (self.gpu)
                batch = self.clock.batch(launcher, len(buffers), copy, 200.0, self.reply_s)
            else:
                batch = self.clock.batch(launcher, len(buffers), copy)
            self._after_turn(label, mine)
            self._ask(label, {"op": "slots", "slots": []})
        except LauncherFailed as exc:
            self._lost(LauncherFailed(label, f"{exc.reason} (replaying the judge's cases)"))
            return
        finally:
            del buffers
            if self.gpu:
                import torch

                torch.cuda.ipc_collect()
        self.replayed[label] = len(cases)
        for case, got in zip(cases, batch.copies):
            result = case.compare(got)
            if not result["passed"]:
                self._fail(label, f"replayed judge case {case.name} differs from the judge's "
                                  f"expected value ({_describe_mismatch(result)}): launched "
                                  "where no pytest runs, it computed another output")
                return

    # ---- one shape ------------------------------------------------------------------------
    def _active(self, labels: list[str]) -> list[str]:
        return [label for label in labels if label not in self.failed and label in self.launchers]

    def _share(self, slots: Slots, labels: list[str]) -> None:
        """The slots' tensors, shared with each launcher (CUDA memory by IPC handles, CPU
        memory as files in /dev/shm), never copied: what a launch writes, the timer reads."""
        from multiprocessing.reduction import ForkingPickler

        import torch.multiprocessing

        torch.multiprocessing.set_sharing_strategy("file_system")

        message = {"op": "slots", "slots": slots.buffers}
        for label in self._active(labels):
            try:
                self._ask(label, message, pickler=ForkingPickler.dumps)
            except LauncherFailed as exc:
                self._lost(exc)

    def _sweep(self) -> dict[int, list[int]]:
        """Between turns no process runs below the timer but its launchers and their groups
        (stopped with them): whatever kernel code started in a session of its own (a daemon
        comes back here: the timer is a subreaper) is killed before another variant's turn.
        Returns the processes of each launcher's group, by group."""
        groups: dict[int, list[int]] = {launcher.proc.pid: []
                                        for launcher in self.launchers.values()}
        table = spawn.process_table()
        for pid in spawn.descendants_in(table, os.getpid()):
            # a launcher's own group is stopped with it between turns; the timer's own helpers
            # (torch's shared-memory manager) were there before any kernel code
            if table[pid].group in groups:
                groups[table[pid].group].append(pid)
                continue
            if pid in self._own:
                continue
            try:
                os.kill(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
        return groups

    def _turn(self, label: str) -> list[int]:
        """Before a launcher's batch: strays killed, every other launcher stopped for good (a
        thread still working in the kernel is waited for), and its processes set back to the
        timer's own scheduling (perfloop.referee.scheduling), which another launcher may have
        changed. Returns its processes."""
        launcher = self.launchers[label]
        groups = self._sweep()
        self._others_stopped(groups, launcher.proc.pid)
        mine = groups.get(launcher.proc.pid) or [launcher.proc.pid]
        failed = scheduling.reset(mine, self.sched)
        if failed:
            raise LauncherFailed(label, "its scheduling was changed and could not be set back "
                                        f"({failed[0]}): no batch of it can be timed fairly")
        return mine

    def _others_stopped(self, groups: dict[int, list[int]], running: int) -> None:
        """Wait until no thread of another launcher's group runs: a stopped process still
        finishes the system call it is in (madvise over 1.5 GiB took seconds), beside the
        next batch. A launcher that keeps working past the grace is dropped."""
        others = {pid: pids for pid, pids in groups.items() if pid != running}
        busy = scheduling.busy_until_stopped([p for pids in others.values() for p in pids],
                                             scheduling.STOP_GRACE_S)
        for label, launcher in list(self.launchers.items()):
            if set(others.get(launcher.proc.pid, ())) & set(busy):
                self._lost(LauncherFailed(label, "kept working while stopped (a thread in "
                                                 "the kernel past its turn, "
                                                 f"{scheduling.STOP_GRACE_S:.0f} s)"))

    def _ask(self, label: str, message: dict, **how) -> dict:
        """A launcher's task other than a timed batch (its slots, its first launch): a turn as
        a batch is, since its process runs meanwhile."""
        mine = self._turn(label)
        answer = self.launchers[label].ask(message, **how)
        self._after_turn(label, mine)
        return answer

    def _after_turn(self, label: str, mine: list[int]) -> None:
        """After a launcher's batch: it did not raise its own scheduling, and left the timer's
        own (its priority, autogroup, CPUs, resource limits: any process of its user may
        change them, and only this launcher ran) as they were, or set back here."""
        gained = scheduling.gained(mine, self.sched)
        if gained:
            raise LauncherFailed(label, f"changed its own scheduling while timed: {gained[0]}")
        changed = scheduling.restore_own(self.sched, self.limits)
        if changed:
            raise LauncherFailed(label, f"changed the trusted timer's {changed[0]} while timed")

    def _batch(self, label: str, slots: Slots, n: int, check: bool, shape: Shape,
               round_index: int, checked: dict) -> float | None:
        """One timed batch of `n` launches; ms per launch, the bracket's own time still in it
        (taken off every variant's alike once a shape's rounds are done: _bracketed), or None
        when host time got in."""
        mine = self._turn(label)
        drawn = slots.refill(n, CHECKS_PER_BATCH if check else 0)
        launcher = self.launchers[label]
        copy = lambda: slots.copy(drawn)  # noqa: E731 (read inside the bracket)
        if isinstance(self.clock, GpuClock):   # (self.gpu)
            pad = self.pads.setdefault(shape.name, 200.0)
            batch = self.clock.batch(launcher, n, copy, pad, self.reply_s)
            self._after_turn(label, mine)
            if batch.host_bound:
                self._longer_pad(label, shape, pad, batch.pad_needed_us)
                return None
        else:
            batch = self.clock.batch(launcher, n, copy)
            self._after_turn(label, mine)
        if drawn:
            self._check(label, slots, drawn, batch.copies, shape, round_index, checked)
        ms = self._simulated(label, slots, shape, n) * n if self.simulated is not None \
            else batch.ms
        if not ms > 0:   # (NaN too) no time at all: timed again, or failed
            self._empty(label, shape, batch.ms)
            return None
        return ms / max(n, 1)

    def _empty(self, label: str, shape: Shape, ms: float) -> None:
        key = (label, shape.name)
        self.empties[key] = self.empties.get(key, 0) + 1
        if self.empties[key] >= EMPTY_LIMIT:
            raise LauncherFailed(label, f"its batches at {shape.name} took no time at all "
                                        f"({EMPTY_LIMIT} times, the last {ms:.4f} ms): no time "
                                        "can be measured for it")

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

    def _simulated(self, label: str, slots: Slots, shape: Shape, n: int) -> float:
        """A test kernel's modelled time (kernel.py's simulated_ms): from its knobs in the
        slot's bucket, never from what its launcher does."""
        assert self.simulated is not None   # (called only for a kernel that models its time)
        knobs = self.knobs[label]
        bucket = self._bucket(slots.buffers[0][0], shape)
        mine = knobs_for(knobs, bucket) if bucket is not None else knobs
        return statistics.mean(self.simulated(mine, shape, self.rng.randrange(1 << 30))
                               for _ in range(n))

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
        for label in self._active(labels):
            try:
                while self._batch(label, slots, n, False, shape, -1, {}) is None:
                    pass
            except LauncherFailed as exc:
                self._lost(exc)

    def _check(self, label, slots, drawn, copies, shape, round_index, checked) -> None:
        failures = slots.check(drawn, copies)
        mine = checked.setdefault(label, LaunchChecks())
        mine.count += len(drawn)
        for failure in failures:
            mine.passed = False
            mine.failures.append({"round": round_index, **failure})
        if failures:
            self._fail(label, f"timed output differs from the reference at {shape.name} "
                              f"({_describe_mismatch(failures[0])})")

    def _calibrate(self, slots: Slots, shape: Shape, check: int) -> None:
        """The time of an empty batch (the bracket alone, `check` slots' outputs copied, as a
        batch with that many checks copies them), subtracted from every variant's batches at
        this shape alike. Timed with the empty launcher, never a variant's; the least of a few:
        whatever else the machine does only ever adds to it."""
        if self.simulated is not None:
            return
        samples: list[float] = []
        key, launcher = (shape.name, check), self.launchers[BRACKET]
        copy = lambda: slots.copy(range(check))  # noqa: E731
        while len(samples) < CALIBRATIONS:
            mine = self._turn(BRACKET)
            if isinstance(self.clock, GpuClock):   # (self.gpu)
                pad = self.pads.setdefault(shape.name, 200.0)
                batch = self.clock.batch(launcher, 0, copy, pad, self.reply_s)
                self._after_turn(BRACKET, mine)
                if batch.host_bound:
                    self._longer_pad(BRACKET, shape, pad, batch.pad_needed_us)
                    continue
            else:
                batch = self.clock.batch(launcher, 0, copy)
                self._after_turn(BRACKET, mine)
            samples.append(batch.ms)
        self.overhead[key] = min(samples)

    def _bucket(self, inputs, shape: Shape):
        """The bucket whose knobs the shape runs: the contract's bucket(inputs) where it has the
        hook (its launches dispatch by it), else the workload's, as the parent named it. A
        held-back shape in a bucket no benchmark shape falls in runs as the nearest measured
        one (perfloop.contract.dispatch routes its launches so), and counts there."""
        if not hasattr(self.contract, "bucket"):
            return self.buckets.get(shape.name)
        if shape.name not in self.runs_as:
            own = runs = self.contract.bucket(inputs)
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

    def _time_shape(self, shape: Shape, labels: list[str], seed: int, index: int,
                    settings: Measure) -> dict | None:
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
        active = [label for label in self._active(labels) if label not in cliffs]
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

    def _release(self, labels: list[str]) -> None:
        """The launchers drop the shape's slots, and their memory goes back."""
        for label in self._active(labels):
            try:
                self._ask(label, {"op": "slots", "slots": []})
            except LauncherFailed as exc:
                self._lost(exc)
        if self.gpu:
            import torch

            torch.cuda.ipc_collect()

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
        active = self._active(labels)
        for label in self.rng.sample(active, len(active)):
            try:
                self.progress(label, "compile", shape=shape.name)
                slots.refill(1, 0)
                self._ask(label, {"op": "prime"}, timeout_s=max(self.reply_s, 600))
                self.progress(label, "time", shape=shape.name)
                estimates[label] = self._warm(label, slots, shape, settings,
                                              self._give_up(label, estimates, shape, cliff))
            except LauncherFailed as exc:
                self._lost(exc)
        for label in [x for x in active if x in estimates]:
            bound = self._give_up(label, estimates, shape, cliff)
            if bound is None or estimates[label] <= bound or label not in self._active([label]):
                continue
            try:
                estimates[INCUMBENT] = self._warm(INCUMBENT, slots, shape, settings, None)
                bound = self._give_up(label, estimates, shape, cliff)
                estimates[label] = self._warm(label, slots, shape, settings, bound)
                if bound is not None and estimates[label] > bound:
                    cliffs[label] = estimates.pop(label) / estimates[INCUMBENT]
            except LauncherFailed as exc:
                self._lost(exc)
        return estimates, cliffs

    def _give_up(self, label: str, estimates: dict, shape, ratio: float | None) -> float | None:
        """The warm-up time past which `label` is a cliff (None: the incumbent, its control,
        PyTorch's launches, or no incumbent warmed yet)."""
        if label in (INCUMBENT, CONTROL) or label in self.unverified or INCUMBENT not in estimates:
            return None
        return cliff_bound(ratio, estimates[INCUMBENT], self._bracket_ms(shape))

    def _bracket_ms(self, shape) -> float:
        """The time of an empty batch at this shape (its calibrations' largest)."""
        return max((ms for (name, _), ms in self.overhead.items() if name == shape.name),
                   default=0.0)

    def _rounds(self, shape, labels, slots, n, settings, checked) -> dict:
        rounds: dict[str, list] = {label: [] for label in labels}
        first = self.rng.sample(labels, len(labels))   # (no role always goes first)
        for r in range(settings.rounds):
            order = first if r % 2 == 0 else list(reversed(first))
            for label in order:
                if label not in self._active(labels):
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
                    self._lost(exc)
        return {label: r for label, r in rounds.items() if label in self._active(labels)}

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

    # ---- the whole run --------------------------------------------------------------------
    def time_pass(self, labels: list[str], seed: int, cliffs: bool = True,
                  held_back: bool = True) -> dict:
        """Every variant of `labels` at every shape (`held_back` False: the benchmark's only;
        with spec "held_back" "if-gain", the held-back ones only where may_gain)."""
        settings = self.settings if cliffs else Measure(**{**vars(self.settings),
                                                           "cliff_ratio": None})
        shapes: dict[str, dict] = {}
        gainless = None
        for index, raw in enumerate(self.spec["shapes"]):
            self._replay_due(index, labels)  # (the first pass's: no timed batch holds one)
            shape = Shape.from_dict(raw)
            if shape.held_back and not held_back:
                continue
            if shape.held_back and self.spec.get("held_back") == "if-gain":
                if gainless is None:  # (the benchmark's shapes come first)
                    gainless = not may_gain(shapes, self._candidates(labels),
                                            self.spec.get("min_gain", 0.0))
                if gainless:
                    self.held_back_skipped = True
                    continue
            if INCUMBENT not in self._active(labels):
                break
            timed = self._time_shape(shape, labels, seed, index, settings)
            if timed is not None:
                shapes[shape.name] = timed
        self._replay_due(None, labels)
        return {"labels": labels, "shapes": shapes}

    def run(self) -> dict:
        env = envinfo.capture(self.gpu)
        self.ceilings = (ceilings.get(Path(self.spec["ceilings_cache"]), env, ceilings_clock())
                         if self.gpu else None)
        labels, seed = self.labels, self.spec.get("seed", 0)
        # with a selection pass to follow, the first chooses at the benchmark's shapes only:
        # the held-back ones, each a compile per variant, are timed for the chosen one
        selecting = self.select and len(self._candidates(labels)) > 1
        passes = [self.time_pass(labels, seed, held_back=not selecting)]
        for (label, name), ratio in self.cliffed.items():  # timed at every other shape
            self._fail(label, f"at {name} its warm-up ran {ratio:.1f}x slower than the "
                              "incumbent's: dropped as a cliff there", Outcome.SLOW)
        best = None
        candidates = self._candidates(labels)
        if self.select and len(candidates) > 1 and passes[0]["shapes"]:
            best = _fastest(passes[0], candidates, self.spec["headline"],
                            self.spec.get("regression_tolerance", 0.0))
        elif len(candidates) == 1:
            best = candidates[0]
        if best is not None and selecting:  # (re-timed at every shape, held-back ones too)
            passes.append(self.time_pass([INCUMBENT, CONTROL, best], seed + 1, cliffs=False))
        first_shape: dict = next(iter(passes[-1]["shapes"].values()), {})
        reps = first_shape.get("reps", 0)
        return {"environment": env, "ceilings": self.ceilings,
                "failed": {k: v for k, v in self.failed.items() if k in labels},
                "passes": passes, "best": best, "method": self._method(reps, len(passes))}

    def _candidates(self, labels: list[str]) -> list[str]:
        """The candidates of `labels` (after the incumbent and its control) not failed yet."""
        return [label for label in labels[2:] if label not in self.failed]

    def _method(self, reps: int, passes: int) -> dict:
        clock = ({"clock": "simulated: kernel.py's simulated_ms (perfloop's test kernels only; "
                           "nothing was timed)"} if self.simulated is not None
                 else self.clock.describe())
        return {**clock, **vars(self.settings), "reps_per_round": reps,
                "batch": "each variant in a launcher process of its own; per round one batch "
                         "of N launches on N slots of inputs drawn afresh for the batch",
                "order": "a random order per shape, reversed every round",
                "verified": f"{CHECKS_PER_BATCH} launches per batch of every variant, chosen at "
                            "random, against the float64 reference computed by the trusted "
                            "timer",
                "bracket": "the least of a few empty batches of a launcher that runs no "
                           "variant's code, taken off every variant's batches alike where each "
                           "ran at least twice as long (the shape's bracket_subtracted), else "
                           "off none",
                "selection": "best candidate re-timed in fresh rounds" if passes > 1
                else "single pass",
                "replayed": dict(self.replayed),
                **({"held_back": "not timed: no candidate was faster than the incumbent at "
                                 "any benchmark shape by a gain the rules count (min_gain), so "
                                 "none could be kept"}
                   if self.held_back_skipped else {})}

    def close(self) -> None:
        for launcher in self.launchers.values():
            launcher.kill()
        spawn.kill_descendants(spare=self._own)  # torch's manager may serve a process after us


def may_gain(shapes: dict, candidates: list[str], min_gain: float = 0.0) -> bool:
    """Whether some candidate passes the keep rule (perfloop.core.stats real_gain, without the
    A/A control's noise, so never stricter than the decision) against the incumbent at some
    shape timed so far: a keep needs that at a benchmark shape, so without it the held-back
    shapes, which only guard a keep, are not timed."""
    for shape in shapes.values():
        rounds = shape["rounds"]
        if INCUMBENT not in rounds:
            continue
        base = [statistics.median(r) for r in rounds[INCUMBENT]]
        for label in candidates:
            if label not in rounds or len(rounds[label]) != len(base):
                continue
            ratio = stats.compare(base, [statistics.median(r) for r in rounds[label]])
            if stats.real_gain(ratio, min_gain):   # (NaN: a lost batch proves nothing)
                return True
    return False


def _own_helpers() -> set[int]:
    """The processes the timer itself runs below it: torch's shared-memory manager, started
    here by sharing a first tensor, before any launcher."""
    import torch
    import torch.multiprocessing

    torch.multiprocessing.set_sharing_strategy("file_system")
    torch.zeros(1).share_memory_()
    return set(spawn.descendants())


def ceilings_clock():
    from perfloop.referee.clock import CudaClock

    return CudaClock()


def _describe_mismatch(failure: dict) -> str:
    if failure.get("error"):
        return failure["error"]
    which = f"output {failure['output']}: " if "output" in failure else ""
    return (f"{which}{failure['non_finite']} non-finite, {failure['outside_tolerance']} outside "
            f"atol={failure['atol']} rtol={failure['rtol']}, relative error "
            f"{failure['rel_err']:.3g}")


def _fastest(first_pass: dict, candidates: list[str], headline: str, tolerance: float) -> str:
    """The candidate to carry into the decision: the fastest at the headline among those no
    slower than the incumbent (beyond `tolerance`) at any shape; the fastest at the headline
    when every candidate loses somewhere (the decision then reverts, saying where)."""
    ratios: dict[str, dict] = {label: {} for label in candidates}
    for name, shape in first_pass["shapes"].items():
        inc = [statistics.median(r) for r in shape["rounds"][INCUMBENT]]
        for label in candidates:
            if label in shape["rounds"]:
                mine = [statistics.median(r) for r in shape["rounds"][label]]
                ratios[label][name] = stats.compare(inc, mine).ratio
            elif label in shape.get("cliffs", {}):
                ratios[label][name] = shape["cliffs"][label]
    alive = [c for c in candidates if ratios[c]]
    safe = [c for c in alive if max(ratios[c].values()) <= 1 + tolerance]
    return min(safe or alive or candidates,
               key=lambda label: ratios[label].get(headline, float("inf")))


# torch only, not cuda.tile: importing it makes cuTile's context, whose temporary folder
# (/tmp/tmp..., without CUDA_TILE_TEMP_DIR) the forked launchers would inherit and, confined,
# could not write (on an H100 every step after the baseline crashed: PermissionError)
PRELOAD = ("torch",)


def main(spec_path: str) -> int:
    guard_parent()
    spawn.become_subreaper()  # a launcher's daemons come back here, and die with the timer
    spawn.set_dumpable(False)  # its memory (the draws to come) and environment closed to them
    if not Path(spec_path).exists() and not wait_for_task(Path(spec_path), PRELOAD):
        return 3  # started ahead for an experiment that never came
    raw = Path(spec_path).read_bytes()
    spec = json.loads(raw)
    progress = Progress(Path(spec["progress"]))
    try:
        timer = Timer(spec)
    except UserError as exc:  # the contract itself is wrong (traffic()): its one line
        progress(None, "contract", reason=str(exc))
        return 6
    except LauncherFailed as exc:
        progress(exc.label, "failed", reason=exc.reason)
        return 5
    try:
        timer.wait_for_go()
        result = timer.run()
    except LauncherFailed as exc:  # the incumbent itself failed: nothing can be compared
        progress(exc.label, "failed", reason=exc.reason)
        return 5
    except hooks.ContractError as exc:  # a hook declared wrongly voids the benchmark
        progress(INCUMBENT, "failed", reason=str(exc))
        return 5
    finally:
        timer.close()
        if spec.get("imports_out"):
            from perfloop.isolation.imports import imported_files

            Path(spec["imports_out"]).write_text(json.dumps(imported_files()))
    write_json(Path(spec["out"]), {**result, "spec": digest(raw)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
