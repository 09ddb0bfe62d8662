"""Fault injection for the resume tests: PERFLOOP_CRASH_AT=phase (or phase@iteration) makes
perfloop kill itself with SIGKILL at that point, as a power cut or `kill -9` would."""

import os
import signal


def crashpoint(name: str, iteration: int | None = None) -> None:
    want = os.environ.get("PERFLOOP_CRASH_AT")
    if want and want in (name, f"{name}@{iteration}"):
        os.kill(os.getpid(), signal.SIGKILL)
