"""One experiment's measurement as data for a worker (Task), and the split of a step's
candidates across several workers: each group judged and timed on one GPU against the
incumbent and its A/A control timed there too, the fastest of all carried into the decision
after a fresh selection pass on one GPU. Ratios are formed within one GPU only: each group's
candidates against that GPU's incumbent. Pure functions over plain records."""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass

from perfloop.core.vocab import Kind
from perfloop.measure.trial import Measured, Plan
from perfloop.store import snapshot


@dataclass(frozen=True)
class Task:
    key: str                  # names the worker's folders for it
    kernel: str
    folder_rel: str
    pinned: dict              # the run's pinned tree: repository path -> (mode, bytes)
    ini: str                  # its pytest configuration's path
    judge_rel: str
    code: dict                # content address -> the files of one variant's folder
    plan: Plan                # each variant's "folder" is its code's content address
    deadline_s: float         # the experiment's time left
    stop: str                 # the driver's stop event
    pass_env: tuple = ()
    confine: str = "read-write"
    reuse: str = ""           # a task of this experiment whose exports it runs from, if here


def groups(candidates: list, width: int) -> list[list]:
    """The candidates dealt out to `width` workers at most, in turn (so neighbours, which
    differ least, go to different GPUs), none empty."""
    width = max(1, min(width, len(candidates)))
    return [candidates[i::width] for i in range(width)]


def tasks(plan: Plan, *, files: dict, kernel: str, folder_rel: str, pinned_files: dict,
          ini: str, judge_rel: str, deadline_s: float, stop: str, width: int,
          pass_env: tuple = (), confine: str = "read-write") -> list[Task]:
    """The plan as one Task per group of its candidates (`files`: label -> the files of its
    export). A baseline, which judges the incumbent itself, is one task."""
    parts = groups(plan.candidates, width) if plan.kind != Kind.BASELINE and plan.candidates \
        else [plan.candidates]
    out = []
    for part in parts:
        code: dict = {}

        def addressed(v: dict) -> dict:
            digest = snapshot.digest(files[v["label"]])
            code[digest] = files[v["label"]]
            return {**v, "folder": digest}

        labels = {v["label"] for v in part}
        sub = dataclasses.replace(
            plan, incumbent=addressed(plan.incumbent), control=addressed(plan.control),
            candidates=[addressed(v) for v in part],
            finalists={k: [{**f, "folder": snapshot.digest(files[k])} for f in vs]
                       for k, vs in plan.finalists.items() if k in labels},
            deadline=0.0)
        out.append(Task(f"{kernel}-{plan.iteration:02d}-{secrets.token_hex(4)}", kernel,
                        folder_rel, pinned_files, ini, judge_rel, code, sub, deadline_s, stop,
                        tuple(pass_env), confine))
    return out


def _headline_ratio(got: Measured, choosing: str) -> float:
    summary = got.passes[-1] if got.passes else None
    if not summary or got.best is None or choosing not in summary:
        return math.inf
    ratio = summary[choosing]["vs_incumbent"].get(got.best, {}).get("ratio")
    return ratio if ratio is not None and ratio == ratio else math.inf


def _regresses(got: Measured, tolerance: float) -> bool:
    summary = got.passes[-1]
    return any(shape["vs_incumbent"].get(got.best, {}).get("ratio", 0) > 1 + tolerance
               for shape in summary.values())


def merge(results: list[Measured], choosing: str, tolerance: float) -> tuple[Measured, bool]:
    """One Measured from each group's: every candidate's outcome, and the group whose best
    candidate is fastest at `choosing` against its own GPU's incumbent (no slower than it
    anywhere, beyond `tolerance`, where any such is), as the decision's. Returns it and whether
    the decision needs a fresh selection pass (several groups had a best)."""
    merged = Measured()
    for got in results:
        merged.outcome.update(got.outcome)
        merged.judge_passed |= got.judge_passed
        for name, seconds in got.phase_s.items():
            merged.phase_s[name] = max(merged.phase_s.get(name, 0.0), seconds)
    timed = [got for got in results if got.best is not None]
    if not timed:
        first = next((got for got in results if got.timing is not None), results[0])
        merged.timing, merged.compile_ahead = first.timing, first.compile_ahead
        merged.judged = _judged(results)
        return merged, False
    safe = [got for got in timed if not _regresses(got, tolerance)]
    chosen = min(safe or timed, key=lambda got: _headline_ratio(got, choosing))
    merged.judged = _judged(results)
    merged.timing, merged.passes, merged.best = chosen.timing, chosen.passes, chosen.best
    merged.compile_ahead, merged.where = chosen.compile_ahead, chosen.where
    return merged, len(timed) > 1


def _judged(results: list[Measured]):
    """The groups' judge results as one (each label judged in one group)."""
    from perfloop.measure.judge import JudgeResult

    out = JudgeResult(processes=0)
    for j in (got.judged for got in results if got.judged is not None):
        for name in ("crashed", "passed", "cases", "doubted"):
            getattr(out, name).update(getattr(j, name))
        out.imports |= j.imports
        out.wall_s, out.passes_s = max(out.wall_s, j.wall_s), max(out.passes_s, j.passes_s)
        out.detail = out.detail or j.detail
        out.processes += j.processes
    return out


def selection(task: Task, best: str) -> Task:
    """The task of the fresh pass that decides: the incumbent, its control and the chosen
    candidate, on one GPU, timed at every shape; judged before, so not again. On the worker
    that ran `task` it runs from that task's exports, whose kernels are compiled there
    (cuTile's cache key holds the source's path)."""
    plan = task.plan
    cand = next(v for v in plan.candidates if v["label"] == best)
    return dataclasses.replace(
        task, key=task.key + "-selection", reuse=task.key,
        plan=dataclasses.replace(plan, candidates=[cand], finalists={}, judge=False),
        code={d: f for d, f in task.code.items()
              if d in (plan.incumbent["folder"], plan.control["folder"], cand["folder"])})
