"""Errors that end a command with one clear line instead of a traceback."""

import os
import tempfile
import traceback
from pathlib import Path


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line, for a one-line answer."""
    return (str(exc).strip().splitlines() or [""])[0][:200]


def keep_traceback(tag: str = "") -> str:
    """The exception being handled's traceback, kept in a file for a bug report (the user sees
    one line); where it went."""
    log = Path(tempfile.gettempdir()) / f"perfloop-crash-{os.getpid()}{'-' * bool(tag)}{tag}.log"
    try:
        log.write_text(traceback.format_exc())
    except OSError:  # (a full /tmp): the line still goes out
        return "nowhere: the temporary folder is not writable"
    return str(log)


class UserError(Exception):
    """Bad input or a refused operation; the message is shown to the user as is."""

    exit_code = 2


class NeedsGPU(UserError):
    exit_code = 3


class CorruptRecord(UserError):
    pass


class AfterRecord(UserError):
    """The experiment was recorded and the run is consistent, but what comes after it (the
    stop rules, the next suggestions) could not be decided: not 'nothing changed'."""

    exit_code = 1


class Busy(UserError):
    """Another perfloop command holds the lock this one needs; nothing was changed."""


class EnvironmentFailure(UserError):
    """The machine, not the candidate, failed (no space, read-only files, a git lock, a missing
    tool): the line names what to fix. Raised before work starts, nothing changed (exit 2);
    `during` one, the experiment was left unrecorded for `perfloop run --resume` (exit 1)."""

    def __init__(self, message: str, during: bool = False, cause: str | None = None):
        super().__init__(message)
        self.exit_code = 1 if during else 2
        self.cause = cause or message  # what failed and its fix, without how to go on


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill PID`, a scheduler's time limit): an interruption like Ctrl-C, so it
    takes the same way out (the experiment set aside or left in flight, the interruption
    written into state.json), and exits 143, the status a shell gives a SIGTERM."""

    exit_code = 143
