"""Recovery of an interrupted experiment, from the order of durable effects that
perfloop.run.experiment documents: with a record line the experiment is finished; without one
it is set aside under a ref and redone. Recovery moves the branch only past a commit it can
prove perfloop made (its parent is the incumbent and its message is the one the marker
announced), and restores files only where the change is perfloop's own."""

from __future__ import annotations

from perfloop.core.errors import UserError
from perfloop.core.kernel import KNOBS
from perfloop.core.playbook import freeze
from perfloop.core.vocab import Kind, Status
from perfloop.plan import search
from perfloop.plan.proposal import Proposal
from perfloop.run.finish import finish, knobs_digest
from perfloop.store import gitops, table
from perfloop.store.records import Experiment
from perfloop.store.session import Session


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
        gitops.set_ref(s.repo, s.ref_name(flight["iteration"], "abandoned") +
                       f"-{flight.get('tag', 'x')[-8:]}", ours)
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


def _perfloops_commit(s: Session, flight: dict) -> str | None:
    """HEAD, if it is the experiment's commit that perfloop made (else None, when HEAD is the
    incumbent); raises if the branch holds a commit that is not perfloop's."""
    head = gitops.head(s.repo)
    if head == s.state.incumbent:
        return None
    parent, message = gitops.parent_and_message(s.repo, head)
    if parent == s.state.incumbent and (head == flight.get("commit")
                                        or flight.get("message") and message == flight["message"]):
        return head
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
