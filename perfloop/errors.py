"""Errors that end a command with one clear line instead of a traceback."""


class UserError(Exception):
    """Bad input or a refused operation; the message is shown to the user as is."""

    exit_code = 2


class NeedsGPU(UserError):
    exit_code = 3


class CorruptRecord(UserError):
    pass
