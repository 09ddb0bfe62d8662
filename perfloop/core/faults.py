"""Fault injection for the resume tests: PERFLOOP_CRASH_AT=phase (or phase@iteration) makes
perfloop kill itself with SIGKILL at that point, as a power cut or `kill -9` would; with
PERFLOOP_CRASH_SIGNAL=INT it sends SIGINT instead, to its whole process group when it leads
one, as a terminal's Ctrl-C does (git helpers in the group get it too). It fires once per
process: `run` recovers in process after a Ctrl-C, and its recovery passes the same point
again (finish() after a record line), where a second signal would be a second Ctrl-C."""

import os
import signal

_fired = False


def crashpoint(name: str, iteration: int | None = None) -> None:
    global _fired
    want = os.environ.get("PERFLOOP_CRASH_AT")
    if _fired or not want or want not in (name, f"{name}@{iteration}"):
        return
    _fired = True
    if os.environ.get("PERFLOOP_CRASH_SIGNAL") != "INT":
        os.kill(os.getpid(), signal.SIGKILL)
    elif os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGINT)
    else:  # (not a group of its own: the signal would reach whoever started perfloop)
        os.kill(os.getpid(), signal.SIGINT)
