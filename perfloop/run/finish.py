"""Everything after an experiment's record line: its ref, the branch back to the incumbent on a
revert (the incumbent moved on a keep), the table's row, the in-flight marker cleared.
Idempotent, so recovery can call it again after a kill. What comes next (a stop rule?) is the
planner's, asked by the caller (perfloop.run.planning.settle)."""

from __future__ import annotations

import hashlib

from perfloop.contract import roofline, traffic
from perfloop.core import naming
from perfloop.core.faults import crashpoint
from perfloop.core.vocab import Kind, Status
from perfloop.plan import decide
from perfloop.store import gitops, records, snapshot, table
from perfloop.store.session import Session


def knobs_digest(text: str) -> str:
    """What the in-flight marker holds of the knobs.json perfloop writes (recovery compares)."""
    return hashlib.sha256(text.encode()).hexdigest()


def finish(s: Session, record: records.Experiment) -> None:
    """Everything after the record line; idempotent."""
    state = s.state
    gitops.set_ref(s.repo, record.ref, record.commit)
    if record.status == Status.KEEP:
        state.incumbent = record.commit
        if record.kind == Kind.BASELINE:
            _classify(s, record)
    elif gitops.head(s.repo) != state.incumbent:
        # the working tree follows where it holds just the commit set aside: an edit made
        # while the step ran is left as it is, uncommitted
        ours = snapshot.matches(s.repo, gitops.head(s.repo), s.folder_rel)
        gitops.move_branch_to(s.repo, state.incumbent, s.folder_rel, worktree=ours)
    crashpoint("git", record.iteration)
    if len(table.read_rows(s.table_path)) == record.iteration:
        table.append_row(s.table_path, table.format_row(
            record.iteration, naming.experiment(record), record.latency_ms, record.correctness,
            record.status))
    crashpoint("table", record.iteration)
    state.in_flight = None
    s.save_state()


def _classify(s: Session, record: records.Experiment) -> None:
    """The class from the headline's work, against the ridge points of the device that timed
    the baseline (fixed bounds where it has none: a CPU clock)."""
    assert record.timing is not None   # (a timed baseline's)
    shape = record.timing.shapes[s.spec.headline.name]
    done = traffic.from_record(shape.to_dict())
    peaks, bandwidth = roofline.roofline(record.timing.ceilings, done.flops)
    found = decide.classify(done.bytes, done.flops, peaks, bandwidth, s.playbook.rules.classes)
    s.state.kernel_class, s.state.intensity, s.state.class_basis = found


