"""The run: setup (branch, baseline), then one optimization per iteration until a stop rule.

This is the whole of `perfloop run`; `init` and `step` drive the same pieces one at a time.
"""

from __future__ import annotations

import shutil
import time
from datetime import date
from typing import Callable

from perfloop import gitops, iteration
from perfloop.errors import UserError
from perfloop.iteration import BASELINE, PLAYBOOK, Proposal
from perfloop.session import Session, State
from perfloop.suggest import suggestions


def start(s: Session, new: bool = False) -> dict:
    """Create the run's branch and state, and measure the baseline (iteration 0)."""
    gitops.current_branch(s.repo)
    gitops.require_clean(s.repo)
    existing = s.load_state()
    if existing is not None:
        if not existing.stopped and not new:
            raise UserError(f"a run of '{s.spec.name}' is in progress on branch "
                            f"{existing.branch}; continue it with `perfloop run --resume`, or "
                            "pass --new to archive it and start over")
        archive = (s.sandbox.parent / "_archive" / s.spec.name /
                   f"{existing.branch}-{int(existing.started_at)}")
        archive.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(s.sandbox), archive)
    s.ensure_sandbox_ignored()
    base = f"cutile-perf-{s.spec.name}-{date.today():%Y%m%d}"
    branch = gitops.unique_branch(s.repo, base)
    sha = gitops.head(s.repo)
    gitops.create_branch(s.repo, branch)
    s.begin(State(kernel=s.spec.name, folder=s.folder_rel, branch=branch, base_commit=sha,
                  incumbent=sha))
    return iteration.run(s, Proposal(BASELINE))


def prepare_step(s: Session) -> None:
    """Checks before any experiment: the run exists, nothing is half done, the tree is ours."""
    if s.state.in_flight:
        raise UserError(f"iteration {s.state.in_flight['iteration']} of '{s.spec.name}' was "
                        "interrupted; finish it with `perfloop run --resume` or "
                        "`perfloop step --resume`")
    s.check_records_match_table()
    s.require_on_branch()
    s.require_no_outside_changes()


def resume(s: Session) -> dict | None:
    """Make an interrupted run consistent and redo the interrupted experiment, if any."""
    if gitops.current_branch(s.repo) != s.state.branch:
        gitops.checkout(s.repo, s.state.branch)
    s.require_no_outside_changes()
    redo = iteration.recover(s)
    if s.state.stopped and s.state.stopped.startswith("interrupted"):
        s.state.stopped = None
        s.save_state()
    return iteration.run(s, redo) if redo else None


def next_proposal(s: Session) -> Proposal | None:
    ranked = suggestions(s)
    if not ranked:
        return None
    top = ranked[0]
    return Proposal(PLAYBOOK, top.optimization, top.candidates)


def run(s: Session, report: Callable[[dict], None], max_iterations: int | None = None) -> str:
    """Iterate until a stop rule fires; returns the stop reason."""
    done = 0
    try:
        while not s.state.stopped:
            if max_iterations is not None and done >= max_iterations:
                return f"stopped after {done} iterations as asked (--max-iterations)"
            proposal = next_proposal(s)
            if proposal is None:
                s.state.stopped = "nothing left to try"
                s.save_state()
                break
            prepare_step(s)
            report(iteration.run(s, proposal))
            done += 1
    except KeyboardInterrupt:
        iteration.recover(s)  # sets the half-done experiment aside; resume redoes it
        s.state.stopped = f"interrupted at {time.strftime('%H:%M:%S')}"
        s.save_state()
        raise
    return s.state.stopped
