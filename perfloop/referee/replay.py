"""The judge's cases, replayed by the trusted timer in each variant's launcher.

The judge's kernel pass runs pytest beside kernel code, which can see it: a kernel right only
while judged passed its judge and, where every timed shape was one it was right at, its
timing too. The reference pass writes the cases it could record (perfloop.contract.judge_replay);
the timer reads them here as data (torch.load with weights_only, through plainfile), makes
each case's inputs and poisoned output, and has the variant's own launcher run them, in a
batch like any other, where no pytest runs. The comparison with the judge's expected value
happens in the timer, at the case's tolerance.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from perfloop.contract import judge_replay, outputs
from perfloop.core import plainfile
from perfloop.core.atomic import digest
from perfloop.referee.launchers import GpuClock, LauncherFailed, Roster, WallClock
from perfloop.referee.slots import describe_mismatch

LIMIT = 2 * judge_replay.CAP_BYTES + (16 << 20)   # the cases and torch.save's framing


class Unreadable(Exception):
    """The case file is missing, changed since the reference pass wrote it, or not the data
    it should be."""


@dataclass
class Case:
    label: str
    name: str
    inputs: object      # judge_replay's plain-data form
    out: dict           # shape, stride, dtype, device
    expected: object
    tolerance: dict

    def buffers(self, gpu: bool) -> tuple:
        """(inputs, poisoned output, no extra): what a launcher's slot holds."""
        import torch

        dtype = getattr(torch, self.out["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise Unreadable(f"case {self.name}: no dtype {self.out['dtype']!r}")
        out = torch.empty_strided(tuple(self.out["shape"]), tuple(self.out["stride"]),
                                  dtype=dtype, device=_device(self.out["device"], gpu))
        outputs.poison(out)
        return _build(self.inputs, gpu), out, ()

    def compare(self, got) -> dict:
        return outputs.compare(got, self.expected, {}, "", fixed=self.tolerance)


def _device(kind: str | None, gpu: bool) -> str:
    if kind == "cuda" and gpu:
        return "cuda"
    if kind == "cpu":
        return "cpu"
    raise Unreadable(f"a case on {kind!r}, which this timer has no device for")


def _build(x, gpu: bool):
    """judge_replay's plain-data form back to the launch's inputs (tensors on their device)."""
    if not isinstance(x, dict) or len(x) not in (1, 2):
        raise Unreadable("an input that is not plain data")
    if "tensor" in x:
        t = x["tensor"]
        return t.to(_device(x.get("device"), gpu), copy=True)  # (keeps a dense tensor's strides)
    if "value" in x:
        if not isinstance(x["value"], judge_replay.SCALARS):
            raise Unreadable("an input that is not plain data")
        return x["value"]
    for kind, make in (("tuple", tuple), ("list", list)):
        if kind in x and isinstance(x[kind], list):
            return make(_build(v, gpu) for v in x[kind])
    raise Unreadable("an input that is not plain data")


def load(where: dict, variants: list[dict]) -> dict[str, list[Case]]:
    """{label: its cases} for the variants whose knobs and folder in the judge's request are
    those the timer builds (the loop asks the judge for exactly the candidates it times)."""
    import torch

    try:
        raw = plainfile.read_bytes(Path(where["path"]), LIMIT)
    except (OSError, KeyError, TypeError) as exc:
        raise Unreadable(f"{type(exc).__name__}: {exc}") from None
    if digest(raw) != where.get("digest"):
        raise Unreadable("it differs from what the judge's reference pass wrote")
    try:
        body = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        judged = body["variants"]
        mine = {v["label"]: v for v in variants}
        same = {label for label, v in judged.items() if label in mine
                and v["knobs"] == judge_replay.knobs_key(mine[label].get("knobs", {}))
                and Path(v["folder"]).resolve() == Path(mine[label].get("folder") or "").resolve()}
        out: dict = {}
        for c in body["cases"]:
            if c["label"] in same:
                out.setdefault(c["label"], []).append(Case(
                    c["label"], str(c["case"]), c["inputs"], dict(c["out"]), c["expected"],
                    dict(c["tolerance"])))
        return out
    except Unreadable:
        raise
    except Exception as exc:  # (plain data of another shape than the reference pass writes)
        raise Unreadable(f"not the reference pass's cases ({type(exc).__name__})") from None


class Replays:
    """Each verified variant's judge cases, planned at the go and replayed during the first
    pass: before a shape drawn at random, or after the last one."""

    def __init__(self, roster: Roster, clock: GpuClock | WallClock, rng: random.Random,
                 progress: Callable[..., None]):
        self.roster, self.clock, self.rng, self.progress = roster, clock, rng, progress
        self.gpu = isinstance(clock, GpuClock)
        self.pending: dict[str, list[Case]] = {}   # label -> its cases not replayed yet
        self.spots: dict[str, int] = {}    # label -> the shape index its replay runs before
        self.replayed: dict[str, int] = {}   # label -> how many of its cases were replayed

    def plan(self, where: dict | None, verified: list[str], variants: list[dict],
             shapes: int) -> None:
        """The cases of the `verified` labels, each set to run before one of `shapes` shapes
        or after the last."""
        self.pending, self.spots, self.replayed = {}, {}, {}
        if not where:
            return
        try:
            self.pending = load(where, variants)
        except Unreadable as exc:
            for label in verified:
                self.roster.fail(label, f"the judge's cases could not be replayed: {exc}")
            return
        self.pending = {k: v for k, v in self.pending.items() if k in verified}
        self.spots = {label: self.rng.randrange(shapes + 1) for label in self.pending}

    def due(self, index: int | None, labels: list[str]) -> None:
        """The replays planned before shape `index` of the pass (None: every one left)."""
        for label in labels:
            if label in self.pending and (index is None or self.spots[label] == index):
                self.replay(label, self.pending.pop(label))

    def replay(self, label: str, cases: list[Case]) -> None:
        """One untimed batch of the variant's judge cases in its launcher: shared as slots
        are, outputs poisoned, launched as a timed batch is, then compared here."""
        if label not in self.roster.active([label]):
            return
        from multiprocessing.reduction import ForkingPickler

        self.progress(label, "replay", cases=len(cases))
        launcher = self.roster.launchers[label]
        try:
            buffers = [case.buffers(self.gpu) for case in cases]
        except Unreadable as exc:
            self.roster.fail(label, f"the judge's cases could not be replayed: {exc}")
            return
        copy = lambda: [outputs.clone(out) for _, out, _ in buffers]  # noqa: E731
        try:
            self.roster.ask(label, {"op": "slots", "slots": buffers},
                            pickler=ForkingPickler.dumps)
            mine = self.roster.turn(label)
            for _, out, _ in buffers:
                outputs.poison(out, self.rng)
            if isinstance(self.clock, GpuClock):
                batch = self.clock.batch(launcher, len(buffers), copy, 200.0,
                                         self.roster.reply_s)
            else:
                batch = self.clock.batch(launcher, len(buffers), copy)
            self.roster.after_turn(label, mine)
            self.roster.ask(label, {"op": "slots", "slots": []})
        except LauncherFailed as exc:
            self.roster.lost(LauncherFailed(label, f"{exc.reason} (replaying the judge's cases)"))
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
                self.roster.fail(label, f"replayed judge case {case.name} differs from the "
                                        f"judge's expected value ({describe_mismatch(result)}): "
                                        "launched where no pytest runs, it computed another "
                                        "output")
                return
