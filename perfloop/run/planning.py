"""The planner's view of a session, read once (perfloop.plan.view), and the planner asked
through it: what the loop, `step` and `next` run next."""

from __future__ import annotations

from perfloop.contract import knobspace
from perfloop.core.errors import AfterRecord, UserError
from perfloop.core.vocab import Stop
from perfloop.plan import planner, profile_rank
from perfloop.plan.proposal import Proposal
from perfloop.plan.view import RunView
from perfloop.store.session import Session


def view(s: Session) -> RunView:
    profile = s.profile()
    return RunView(records=tuple(s.records()), knobs=s.incumbent_knobs(),
                   incumbent=s.state.incumbent, kernel_class=s.state.kernel_class, spec=s.spec,
                   playbook=s.playbook, space=knobspace.space_for(s.pinned().contract),
                   profile=profile,
                   profile_rules=profile_rank.load(s.playbook_dir) if profile else None)


def next_step(s: Session) -> Proposal | Stop:
    """What comes next, planned from the record as it is now (a profile taken since the last
    experiment re-ranks it)."""
    return planner.next_step(view(s))


def offered(s: Session) -> list:
    """Everything worth trying now, best first (perfloop.plan.decide.Suggestion)."""
    return planner.plan(view(s))[1]


def settle(s: Session) -> None:
    """After an experiment is finished: whether a stop rule fires now, saved in the run's
    state."""
    try:
        stop, _ = planner.plan(view(s))
    except UserError as exc:  # (kernel.py's canonical() or restrict() failed, say)
        s.state.stop = None
        s.save_state()
        last = s.records()[-1]
        raise AfterRecord(f"iteration {last.iteration} was recorded ({last.status}), but what "
                          f"comes next could not be decided: {exc}") from None
    s.state.stop = stop
    s.save_state()
