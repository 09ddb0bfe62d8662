"""Failures after an experiment's record line. The experiment stands: it is in the record, and
recovery finishes whatever follows it. So the answer says that it was recorded, with exit 1
(docs/agent-protocol.md), never "nothing changed" (exit 2) or "nothing was recorded"."""

from __future__ import annotations

from contextlib import contextmanager

from perfloop.core.errors import AfterRecord, EnvironmentFailure, UserError
from perfloop.store import preflight
from perfloop.store.records import Experiment

NOTE = "perfloop_recorded"   # the attribute a bug's exception carries the line's start in
FINISH = "`perfloop run --resume` (or `perfloop step --resume`) finishes it"
CONFIRM = ("`perfloop run --resume` times it again (the baseline against the final incumbent, "
           "in one process)")


def recorded(record: Experiment) -> str:
    return f"iteration {record.iteration} was recorded ({record.status})"


def line(record: Experiment, what: str, why: str, then: str) -> str:
    """'iteration N was recorded (status), but WHAT failed: WHY; THEN'."""
    return f"{recorded(record)}, but {what} failed: {why}; {then}"


@contextmanager
def past(record: Experiment, what: str, then: str):
    """A failure in the block, which runs after `record`'s line was written, says so:
    AfterRecord for a refusal or the machine's failure; a bug keeps its traceback and carries
    (the line's start, `then`) in NOTE for the CLI's line."""
    try:
        yield
    except (AfterRecord, KeyboardInterrupt):
        raise
    except EnvironmentFailure as exc:  # (its own words would say nothing was recorded)
        raise AfterRecord(line(record, what, exc.cause, then)) from None
    except UserError as exc:
        raise AfterRecord(line(record, what, str(exc), then)) from None
    except Exception as exc:
        failure = preflight.from_os_error(exc) if isinstance(exc, OSError) else None
        if failure is not None:
            raise AfterRecord(line(record, what, failure.cause, then)) from None
        setattr(exc, NOTE, (recorded(record), then))
        raise
