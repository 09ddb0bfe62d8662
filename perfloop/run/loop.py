"""The run: setup (branch, baseline), then one optimization per iteration until a stop rule.

This is the whole of `perfloop run`; `init` and `step` drive the same pieces one at a time.
Every check that can refuse runs before anything is written; a baseline that fails is undone
(back on the user's branch, the attempt archived), so a failed start leaves nothing half made.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import Callable

from perfloop.contract import kernel, knobspace, traffic, workload
from perfloop.core.errors import Terminated, UserError
from perfloop.core.faults import crashpoint
from perfloop.core.vocab import Kind, Status, Stop, StopReason
from perfloop.plan import planner
from perfloop.plan.proposal import Proposal
from perfloop.run import ahead, confirm, experiment, planning, recorded, recovery
from perfloop.store import gitops, pins, records
from perfloop.store.session import Session, State, sha256_file


def _archive(s: Session, existing: State) -> Path:
    archive = s.archive / f"{existing.branch}-{int(existing.started_at)}"
    archive.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(s.sandbox), archive)
    return archive


@contextmanager
def interruptible(s: Session):
    """Ctrl-C (KeyboardInterrupt) or SIGTERM (Terminated) in the block is written into the
    run's state, whose in-flight marker, if any, `run --resume` or `step --resume` finishes;
    then it goes on (the CLI exits 130, or 143 for SIGTERM)."""
    try:
        yield
    except KeyboardInterrupt as exc:
        if s.has_state():  # (no run was made yet: nothing to say)
            how = " by SIGTERM" if isinstance(exc, Terminated) else ""
            s.state.interrupted = Stop(StopReason.INTERRUPTED,
                                       f"interrupted at {time.strftime('%H:%M:%S')}{how}")
            s.save_state()
        raise


def _require_startable(s: Session, new: bool) -> tuple[State | None, recovery.Aside]:
    """Everything init checks before it writes anything; returns the run to set aside (with
    --new) and how."""
    gitops.current_branch(s.repo)
    existing = s.load_state(strict=not new)
    aside = recovery.plan_aside(s, existing if new else None)
    s.preflight(aside.base)
    knobs = [f"{s.folder_rel}/{kernel.KNOBS}"] if aside.knobs else []  # perfloop's, put back
    gitops.require_clean(s.repo, excused=knobs)
    folder = s.folder_rel
    loose = [p for p in s.changes_inside_folder() if p not in knobs]
    missing = [name for name in (kernel.MANIFEST, kernel.KNOBS, kernel.MODULE)
               if gitops.file_at(s.repo, aside.base, f"{folder}/{name}") is None]
    if missing or loose:
        raise UserError(f"the kernel folder {folder}/ is not committed "
                        f"({gitops.listing(missing or loose)}); perfloop records experiments as "
                        "commits on top of it: `git add` and `git commit` it first")
    judge = s.spec.judge_rel
    if not gitops.tracked(s.repo, [judge]) or s.repo.ignored(judge):
        raise UserError(f"the judge {judge} is not a tracked file; commit it (not under an "
                        "ignored path), so that the run can pin it")
    s.spec.read_knobs()  # a committed knobs.json that is not valid JSON: say so now
    shadows = pins.unpinned_modules(s.repo, s.root, s.spec.judge, "HEAD",
                                     [s.spec.folder, s.root / "sandbox"])
    if shadows:
        raise UserError(f"{gitops.listing(shadows)} could be imported by the judge but is not "
                        "committed (new, ignored or changed); commit or remove it first")
    if existing is not None and existing.stop is None and not new:
        what = "was interrupted" if existing.interrupted or existing.in_flight else "is in progress"
        raise UserError(f"a run of '{s.spec.name}' {what} on branch {existing.branch}; continue "
                        "it with `perfloop run --resume`, or pass --new to archive it and start over")
    if existing is not None and not new:  # (archiving a finished run is the user's call)
        raise UserError(f"a run of '{s.spec.name}' has finished on branch {existing.branch} "
                        f"(stopped: {existing.stop}); `perfloop status` and `perfloop report` "
                        "read it; pass --new to archive it under sandbox/_archive/ and start a "
                        "new run")
    return existing, aside


def start(s: Session, new: bool = False) -> tuple[records.Experiment, str | None]:
    """Create the run's branch and state, and measure the baseline (iteration 0). A baseline
    that does not pass is undone: the user is back on their branch, the attempt archived;
    returns the baseline's record, and what was undone (None when it passed)."""
    existing, aside = _require_startable(s, new)
    seed = workload.choose_seed(s.spec.workload)  # the held-out shapes', recorded in the state
    # the benchmark's traffic() is read by the timing process; a wrong one is refused here,
    # in one line, before a branch or a record is written. Read from the commit the run
    # starts on, as every experiment reads the contract (perfloop.store.pinned), from a
    # copy that goes with the check (a refused start leaves nothing in sandbox/)
    with tempfile.TemporaryDirectory(prefix="perfloop-start-") as tmp:
        contract = s.export_commit(aside.base, Path(tmp))
        traffic.check(kernel.load_module(contract, f"contract_{s.spec.name}",
                                         f"{s.folder_rel}/{kernel.MODULE}"), s.spec,
                      workload.held_out(s.spec, seed))
        planner.check_space(s.playbook.optimizations, s.spec.read_knobs(contract),
                            s.spec.candidates, knobspace.space_for(contract),
                            s.spec.tags)  # (likewise canonical(), restrict())
    previous = gitops.current_branch(s.repo)
    if existing is not None:
        recovery.set_aside(s, aside)
        _archive(s, existing)
    s.ensure_sandbox_ignored()
    tree = s.pinned(base=aside.base, fresh=True)   # (an old run's sandbox was set aside)
    ahead.start(s, tree)  # the baseline's judges and timer, while the run's branch is made
    _make_run(s, previous, seed, aside.base)
    record = experiment.run(s, Proposal(Kind.BASELINE))
    planning.settle(s)
    if record.status == Status.KEEP:
        return record, None
    branch = s.state.branch
    gitops.switch_back(s.repo, previous, branch)
    archive = _archive(s, s.state)
    s.forget_state()  # (no run is left: nothing to write an interruption into)
    return record, (f"the baseline did not pass, so the run was undone: back on {previous}, "
                    f"branch {branch} deleted, the attempt's record in {archive}")


def _make_run(s: Session, previous: str, seed: int | None, sha: str) -> None:
    """The run's branch at commit `sha`, its base ref and its state, all or none: a failure
    or a Ctrl-C before the state is saved puts the user back on `previous`."""
    branch = gitops.unique_branch(s.repo, f"cutile-perf-{s.spec.name}-{date.today():%Y%m%d}")
    base = f"{gitops.REF_PREFIX}/{branch}/base"
    gitops.create_branch(s.repo, branch, sha)
    try:
        crashpoint("branched")
        gitops.set_ref(s.repo, base, sha)  # reserves the name
        s.begin(State(kernel=s.spec.name, folder=s.folder_rel, branch=branch,
                      base_commit=sha, incumbent=sha, judge=s.spec.judge_rel,
                      judge_sha256=sha256_file(s.spec.judge), manifest=s.spec.manifest_text,
                      perfloop_sha256=pins.perfloop_digest(),
                      rules=s.playbook.rules_dict(), overrides=dict(s.overrides),
                      workload_seed=seed,
                      worktree=str(s.root) if s.sandboxes != s.root / "sandbox" else ""))
    except BaseException:
        s.forget_state()
        s.state_path.unlink(missing_ok=True)
        gitops.switch_back(s.repo, previous, branch)
        gitops.delete_ref(s.repo, base)
        raise


def lifts_stop(s: Session) -> bool:
    """Whether the command's flags would let a run its time budget stopped go on."""
    stop = s.state.stop
    return bool(stop and stop.reason is StopReason.TIME_BUDGET and "time_budget_s" in s.overrides
                and s.overrides["time_budget_s"] != s.playbook.rules.stop.time_budget_s)


def retune(s: Session) -> dict:
    """The command's flags that a run in progress takes (the time budget) into its pinned
    rules (Session.retune), once the command's checks have passed; a run its time budget
    stopped goes on, for the planner to stop again if the new budget has no room either.
    Returns {key: (before, after)}."""
    lifted = lifts_stop(s)
    changed = s.retune()
    if lifted:
        s.state.stop = None
        s.save_state()
    return changed


def prepare_step(s: Session, kind: Kind) -> None:
    """Checks before any experiment: the run exists, nothing is half done, the tree holds only
    what this step may commit, and the judge and contract are as pinned."""
    if s.state.in_flight:
        raise UserError(f"iteration {s.state.in_flight['iteration']} of '{s.spec.name}' was "
                        "interrupted; finish it with `perfloop run --resume` or "
                        "`perfloop step --resume`")
    s.preflight(s.state.incumbent)
    s.require_on_branch()
    s.require_at_incumbent()
    s.require_no_outside_changes()
    s.require_pinned()
    inside = s.changes_inside_folder()
    if kind == Kind.AGENT and not (inside and gitops.differs_from_head(s.repo, s.folder_rel)):
        raise UserError(f"nothing to judge: no uncommitted changes inside {s.folder_rel}/")
    if kind == Kind.PLAYBOOK and inside:
        _refuse_edits_inside(s, inside)


def _refuse_edits_inside(s: Session, inside: list[str]) -> None:
    raise UserError(f"refused: uncommitted edits inside {s.folder_rel}/ "
                    f"({gitops.listing(inside)}); judge them with `perfloop step --describe`, "
                    "or commit or discard them, before a playbook step")


def require_no_edits_before_steps(s: Session) -> None:
    """`run --resume` goes on with playbook steps, which refuse uncommitted edits inside the
    kernel folder: refuse them before the recovery finishes anything, so that a refused command
    changes nothing. Edits that an interrupted, unrecorded experiment left are recovery's to
    judge (perfloop's own knobs.json, an agent step's edits)."""
    flight = s.state.in_flight
    if flight and not any(r.iteration == flight["iteration"] for r in s.records()):
        return
    inside = s.changes_inside_folder()
    if inside:
        _refuse_edits_inside(s, inside)


def resume(s: Session) -> records.Experiment | None:
    """Make an interrupted run consistent and redo the interrupted experiment, if any."""
    s.preflight(s.state.incumbent)
    s.require_on_branch()
    s.require_no_outside_changes()
    s.require_pinned()
    if s.state.in_flight is None:
        s.require_at_incumbent()
    redo = recovery.recover(s)
    if s.state.interrupted:
        s.state.interrupted = None
        s.save_state()
    if not redo:
        return None  # a recorded stop stays as it was recorded
    record = experiment.run(s, redo)
    planning.settle(s)
    return record


def run(s: Session, report: Callable[[records.Experiment], None],
        max_iterations: int | None = None, recorded_before: bool = False) -> Stop:
    """Iterate until a stop rule fires, or `max_iterations` ran; returns why it stopped. When
    a rule fires, the baseline and the final incumbent are timed against each other in one
    process. `recorded_before`: this command recorded an experiment before (a baseline, a
    resumed one), so a failure here follows a record line."""
    done = 0
    try:
        while s.state.stop is None:
            if max_iterations is not None and done >= max_iterations:
                return Stop(StopReason.ITERATIONS_ASKED,
                            f"stopped after {done} iterations as asked (--max-iterations)")
            proposal = planning.next_step(s)
            if isinstance(proposal, Stop):
                s.state.stop = proposal
                s.save_state()
                break
            prepare_step(s, Kind.PLAYBOOK)
            record = experiment.run(s, proposal)
            planning.settle(s)
            report(record)
            done += 1
    except KeyboardInterrupt:
        recovery.recover(s)  # sets the half-done experiment aside; resume redoes it
        raise  # (the caller's interruptible() writes the interruption)
    finally:
        ahead.discard(s)  # started for an experiment that will not come
    if not (done or recorded_before):  # (a failure here then changed nothing)
        confirm.ensure(s)
        return s.state.stop
    with recorded.past(s.records()[-1], f"timing the run's result (it stopped: "
                                        f"{s.state.stop})", recorded.CONFIRM):
        confirm.ensure(s)
    return s.state.stop
