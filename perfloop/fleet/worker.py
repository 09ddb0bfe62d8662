"""What a fleet's worker measures: an experiment the driver sends as data
(perfloop.fleet.task.Task), returned as data (perfloop.measure.trial.Measured).

A worker never gets a path into the driver's tree: the run's pinned tree and each variant's
code come as files, which it writes under a folder of its own at their content address, then
judges and times them with the same judge, timer and confined children as the machine that
holds the repository (perfloop.measure.measurement).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from perfloop.isolation.sandbox import Confinement, environment_reads
from perfloop.fleet import host
from perfloop.measure import measurement, phases, process
from perfloop.measure.trial import Measured, Place
from perfloop.store import pinned, snapshot

SHIPPED_PLAYBOOK = Path(__file__).resolve().parents[2] / "playbook"


def _foreign(root: Path, allowed: list[Path]):
    env = [Path(p) for p in environment_reads(root)]

    def foreign(imported: set) -> list[str]:
        out = []
        for name in sorted(imported):
            path = Path(name)
            # (a module may name a file that is not there: torch.ops says "_ops.py")
            if root in path.parents and path.is_file() and not any(
                    a == path or a in path.parents for a in [*allowed, *env]):
                out.append(str(path.relative_to(root)))
        return out
    return foreign


_EXPORTED: dict = {}   # (task key, content address) -> its export on this worker


def _exports(task, root: Path) -> dict:
    """Each variant's folder here: a new export, or the one the task it reuses ran from (its
    kernels are then in the compile cache) where that still holds exactly its files."""
    key = task.reuse or task.key
    out = {}
    for digest, files in task.code.items():
        folder = _EXPORTED.get((key, digest))
        if folder is None or not folder.is_dir() or snapshot.read_back(folder) != files:
            folder = snapshot.export(files, root / "code" / key, task.folder_rel)
            _EXPORTED[(key, digest)] = folder
        out[digest] = folder
    return out


def address() -> str | None:
    """This Dask worker's address (None outside one)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return None


def measure_task(task) -> Measured:
    """Measure one Task here; returns what was measured, with where."""
    root = host.scratch()
    tree = pinned.written(task.pinned, ini=task.ini, judge_rel=task.judge_rel,
                          folder_rel=task.folder_rel, under=root / "pins")
    folders = _exports(task, root)
    work = root / "work" / task.key
    work.mkdir(parents=True, exist_ok=True)

    def here(v: dict) -> dict:
        return {**v, "folder": folders[v["folder"]]}

    plan = dataclasses.replace(
        task.plan, incumbent=here(task.plan.incumbent), control=here(task.plan.control),
        candidates=[here(v) for v in task.plan.candidates],
        finalists={k: [here(v) for v in vs] for k, vs in task.plan.finalists.items()},
        deadline=time.monotonic() + task.deadline_s)
    place = Place(
        root=root, work=work, pinned=tree,
        env=phases.child_env(SHIPPED_PLAYBOOK, task.pass_env),
        confinement=Confinement(task.confine, (str(tree.root), str(root / "code"))),
        cache=root / "cache", ceilings_cache=root / "device_ceilings.json",
        foreign=_foreign(root, [root / "code", root / "pins", work, root / "cache"]))
    try:
        got = measurement.measure(plan, place)
    finally:
        process.kill_strays()
    ident = host.identity_cached()
    got.where = {"host": ident["host"], "gpu": (ident["gpus"] or [None])[0],
                 "worker_pid": os.getpid(), "task": task.key, "worker": address()}
    return got
