"""Recovery of an interrupted experiment, from the order of durable effects that
perfloop.run.experiment documents: with a record line the experiment is finished; without one
it is set aside under a ref and redone. Recovery moves the branch only past a commit it can
prove perfloop made (its parent is the incumbent and its message is the one the marker
announced), and restores files only where the change is perfloop's own."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from perfloop.core.errors import UserError
from perfloop.contract.kernel import KNOBS
from perfloop.contract.playbook import freeze
from perfloop.core.vocab import Kind, Status
from perfloop.plan import search
from perfloop.plan.proposal import Proposal
from perfloop.run.finish import finish, knobs_digest
from perfloop.store import gitops, table
from perfloop.store.records import Experiment
from perfloop.store.session import Session, State


def recover(s: Session) -> Proposal | None:
    """Bring an interrupted run back to a consistent state. Returns what must be redone.
    Refuses, changing nothing, when the branch or the folder holds work perfloop did not make."""
    state = s.state
    flight = state.in_flight
    recs = s.records()
    if flight is None:
        if len(table.read_rows(s.table_path)) < len(recs):  # killed between record and row
            _refinish(s, recs[-1])
        return None
    done = next((r for r in recs if r.iteration == flight["iteration"]), None)
    if done is not None:
        _refinish(s, done)
        return None
    proposal = _proposal_from_flight(s, flight)
    ours = _perfloops_commit(s, flight)
    inside = s.changes_inside_folder()
    knobs_rel = f"{s.folder_rel}/{KNOBS}"
    if ours and inside or proposal.kind == Kind.PLAYBOOK and inside and not (
            inside == [knobs_rel] and flight.get("knobs_sha256") ==
            knobs_digest((s.spec.folder / KNOBS).read_text(encoding="utf-8"))):
        raise UserError(f"refused: {gitops.listing(inside)} changed after perfloop was "
                        f"interrupted in iteration {flight['iteration']}; perfloop will not "
                        "overwrite it. Commit it elsewhere or stash it, then resume")
    if ours:
        gitops.set_ref(s.repo, _abandoned_ref(s, state, flight), ours)
        gitops.move_branch_to(s.repo, state.incumbent, s.folder_rel)
        if proposal.kind == Kind.AGENT:
            # the agent's edits go back to being uncommitted changes, as before the step
            gitops.restore_worktree(s.repo, ours, s.folder_rel)
    elif proposal.kind == Kind.PLAYBOOK and inside:
        gitops.restore_folder(s.repo, state.incumbent, s.folder_rel)  # perfloop's knobs.json
    state.in_flight = None
    s.save_state()
    return proposal


def _refinish(s: Session, record: Experiment) -> None:
    """finish() for a recorded experiment, once it is sure that moving the branch back (on a
    revert) takes away only perfloop's own commit, and no edit made since the interruption."""
    head = gitops.head(s.repo)
    if head not in (record.commit, s.state.incumbent):
        _, message = gitops.parent_and_message(s.repo, head)
        raise UserError(f"refused: branch {s.state.branch} has a commit perfloop did not make "
                        f"({head[:12]}: {message.splitlines()[0][:60]}) where iteration "
                        f"{record.iteration} was being finished; move it to another branch "
                        f"(`git branch mine; git reset --keep {s.state.incumbent[:12]}`), "
                        "then resume")
    inside = s.changes_inside_folder()
    if record.status != Status.KEEP and head != s.state.incumbent and inside:
        raise UserError(f"refused: {gitops.listing(inside)} changed after perfloop was "
                        f"interrupted in iteration {record.iteration}, whose revert would "
                        "overwrite it. Commit it elsewhere or stash it, then resume")
    finish(s, record)


def _made_by_perfloop(s: Session, sha: str, incumbent: str, flight: dict) -> bool:
    """`sha` is the in-flight experiment's commit: on the incumbent, with the commit or the
    message that the marker announced before committing."""
    parent, message = gitops.parent_and_message(s.repo, sha)
    return parent == incumbent and (sha == flight.get("commit") or bool(
        flight.get("message")) and message == flight["message"])


def _perfloops_commit(s: Session, flight: dict) -> str | None:
    """HEAD, if it is the experiment's commit that perfloop made (else None, when HEAD is the
    incumbent); raises if the branch holds a commit that is not perfloop's."""
    head = gitops.head(s.repo)
    if head == s.state.incumbent:
        return None
    if _made_by_perfloop(s, head, s.state.incumbent, flight):
        return head
    _, message = gitops.parent_and_message(s.repo, head)
    raise UserError(f"refused: branch {s.state.branch} has a commit perfloop did not make "
                    f"({head[:12]}: {message.splitlines()[0][:60]}) on top of the incumbent "
                    f"{s.state.incumbent[:12]}; move it to another branch (`git branch mine; "
                    f"git reset --keep {s.state.incumbent[:12]}`), then resume")


def _proposal_from_flight(s: Session, flight: dict) -> Proposal:
    if flight["kind"] == Kind.PLAYBOOK:
        values = tuple(freeze(v) for v in flight["values"])
        opt = (search.optimization(flight["optimization"], values)
               if flight["optimization"] in search.IDS else s.playbook.get(flight["optimization"]))
        return Proposal(Kind.PLAYBOOK, opt, values, describe=flight.get("describe", ""),
                        sampler=flight.get("sampler"))
    return Proposal(Kind(flight["kind"]), describe=flight.get("describe", ""))


def _abandoned_ref(s: Session, state: State, flight: dict) -> str:
    return (s.ref_name(flight["iteration"], "abandoned", state.branch)
            + f"-{flight.get('tag', 'x')[-8:]}")


@dataclass(frozen=True)
class Aside:
    """How `--new` sets an old run's interrupted experiment aside, whatever its record says:
    the new run starts from `base`; `keep` is the experiment's commit, to be kept under
    `ref`; `knobs` marks knobs.json as perfloop's own uncommitted write, to be put back."""
    base: str
    keep: str | None = None
    ref: str | None = None
    knobs: bool = False


def plan_aside(s: Session, old: State | None) -> Aside:
    """What `--new` must do first, read without writing: the old run's branch is left as it
    is; a commit perfloop made for the experiment in flight gets a ref (it is then reachable
    even if that branch goes), and a new run made on that branch starts from the incumbent,
    not from an experiment that was never judged to the end."""
    head = gitops.head(s.repo)
    flight = old and old.in_flight
    if old is None or not flight or not gitops.branch_exists(s.repo, old.branch):
        return Aside(head)
    tip = s.repo.heads[old.branch].commit.hexsha
    ours = tip if tip != old.incumbent and _made_by_perfloop(s, tip, old.incumbent,
                                                              flight) else None
    on_run = gitops.current_branch(s.repo) == old.branch
    base = old.incumbent if on_run and ours else head
    knobs_rel = f"{s.folder_rel}/{KNOBS}"
    knobs = (on_run and head == old.incumbent and flight["kind"] == Kind.PLAYBOOK
             and s.changes_inside_folder() == [knobs_rel]
             and flight.get("knobs_sha256") == knobs_digest(
                 (s.spec.folder / KNOBS).read_text(encoding="utf-8")))
    return Aside(base, ours, ours and _abandoned_ref(s, old, flight), knobs)


def set_aside(s: Session, aside: Aside) -> None:
    """Do what plan_aside found (after every check of the new run has passed)."""
    if aside.keep:
        gitops.set_ref(s.repo, aside.ref, aside.keep)
        print(f"perfloop: the interrupted experiment's commit {aside.keep[:12]} is kept under "
              f"{aside.ref}", file=sys.stderr)
    if aside.knobs:
        gitops.restore_folder(s.repo, aside.base, s.folder_rel)
