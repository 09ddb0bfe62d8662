"""Errors that end a command with one clear line instead of a traceback."""


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
