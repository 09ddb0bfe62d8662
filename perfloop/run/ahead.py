"""Children started ahead: while one experiment is timed, the next one's judge processes and
timer start, import pytest, torch and cuda.tile, and wait for their task (GPU kernels in a run
of several experiments only: a CPU kernel's wall clock would feel them starting)."""

from __future__ import annotations

from perfloop.measure import judge, phases
from perfloop.store.pinned import Pinned
from perfloop.store.session import COPIES, Session


def start(s: Session, tree: Pinned | None = None) -> None:
    """Start the next experiment's judge processes and timer now, when the caller runs several
    experiments and the rules want them. `tree`: the pinned tree of a run about to start (the
    run's own otherwise)."""
    rules = s.playbook.rules  # (the run's pinned rules, once it has a state)
    if not (s.ahead and rules.start_ahead and s.spec.requires_gpu):
        return
    env = phases.child_env(s.playbook_dir, s.playbook.rules.pass_env)
    if s.judges is None:
        tree = tree or s.pinned()
        s.judges = judge.start_judges(
            tree, root=s.root, work=s.work / "ahead", env=env,
            processes=judge.processes_for(rules.judge_processes),
            confinement=s.confinement(tree.root, s.work / COPIES),
            # the next candidates' code is the working tree's (a catalog step's, a baseline's)
            cache=s.compile_cache, code_folder=s.spec.folder)
    if s.timer is None:
        s.timer = phases.start_timer_ahead(cwd=s.root, work=s.work / "ahead", env=env)


def discard(s: Session) -> None:
    """Kill what was started ahead for an experiment that will not come."""
    if s.judges is not None:
        s.judges.discard()
    if s.timer is not None:
        s.timer[1].kill()
    s.judges = s.timer = None
