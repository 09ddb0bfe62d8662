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
import sys
import time
from pathlib import Path

from perfloop.contract import hooks, traffic
from perfloop.contract.kernel import Shape, import_module
from perfloop.contract.playbook import Measure
from perfloop.core.atomic import digest, write_json
from perfloop.core.errors import UserError
from perfloop.core.vocab import INCUMBENT
from perfloop.isolation import spawn
from perfloop.isolation.lifeline import guard_parent, wait_for_task
from perfloop.referee.launchers import GpuClock, LauncherFailed, Roster, WallClock
from perfloop.referee.replay import Replays
from perfloop.referee.selection import Selection
from perfloop.referee.shape_timing import ShapeTimer


class Progress:
    """One line per step into the progress file, flushed before the step runs."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8")

    def __call__(self, label, stage: str, **extra) -> None:
        self.file.write(json.dumps({"label": label, "stage": stage, **extra,
                                    "t": round(time.monotonic(), 3)}) + "\n")
        self.file.flush()


class Timer:
    """One timing run's parts, built in the order that keeps each launcher blind: the
    launchers (perfloop.referee.launchers) forked first, then the contract imported, the clock
    started and the launchers built; one shape's timing (perfloop.referee.shape_timing), the
    judge's cases replayed (perfloop.referee.replay) and the passes (perfloop.referee.selection)
    share them."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.settings = Measure(**spec["measure"])
        self.progress = Progress(Path(spec["progress"]))
        self.roster = Roster(spec, self.progress)  # first: see perfloop.referee.launchers
        rng = random.Random(os.urandom(16))
        contract = import_module(Path(spec["contract_folder"]), "contract")
        for raw in spec["shapes"]:  # a wrong traffic() stops the timer before any timing
            traffic.of(contract, Shape.from_dict(raw), Path(spec["contract_folder"]).name)
        device = getattr(contract, "DEVICE", "cuda")
        clock = GpuClock() if device == "cuda" else WallClock()
        self.roster.start(device)
        self.shapes = ShapeTimer(spec, contract, self.roster, clock, rng, self.progress)
        self.replays = Replays(self.roster, clock, rng, self.progress)

    def wait_for_go(self) -> None:
        """Wait until the parent names the variants that passed the judge; plan the replay of
        the judge's cases of those whose outputs are checked."""
        self.release = self.roster.go()
        verified = [label for label in self.release.labels if label not in self.shapes.unverified]
        self.replays.plan(self.release.replay, verified, self.spec["variants"],
                          len(self.spec["shapes"]))

    def run(self) -> dict:
        return Selection(self.spec, self.settings, self.release, self.roster, self.shapes,
                         self.replays).run()

    def close(self) -> None:
        self.roster.close()


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
