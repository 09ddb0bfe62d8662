"""A perfloop child's side of its lifetime: die with its whole process group when the parent
goes away, and, when started ahead of its task, wait for it.

If perfloop dies, even by SIGKILL, the kernel sends the child SIGTERM (Linux's parent-death
signal, set by perfloop.measure.process); `guard_parent()`, which every perfloop child calls
first, turns that into SIGKILL for the child's whole group, and a watchdog thread does the same
if the parent disappears another way. So nothing keeps running, or writes files, after its
parent is gone.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path


def _kill_own_group(*_args) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def guard_parent() -> None:
    """In a perfloop child: die with the whole process group when the parent goes away."""
    if os.getpgrp() != os.getpid():
        return  # not started by perfloop.measure.process (a judge run by hand): nothing to guard
    parent = os.getppid()
    signal.signal(signal.SIGTERM, _kill_own_group)

    def watch():
        while True:
            if os.getppid() != parent:
                _kill_own_group()
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True, name="perfloop-parent-watch").start()
    if os.getppid() != parent:  # the parent died before the handler was in place
        _kill_own_group()


# what every judge and timing worker of a GPU kernel imports, and takes seconds to (torch alone
# 4.5 s on an H100 host): a child started ahead imports it while the previous experiment runs
PRELOAD = ("torch", "cuda.tile")
WAIT_LIMIT_S = 3600  # a child started ahead whose task never comes gives up


def wait_for_task(path: Path, preload=PRELOAD) -> bool:
    """In a child started ahead of its task (its task file named on its command line, not
    written yet): import `preload`, then wait for the file. Nothing here touches the GPU or
    imports kernel code: that is the task's. False if no task came in WAIT_LIMIT_S."""
    import importlib
    import importlib.util

    for name in preload:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    until = time.monotonic() + WAIT_LIMIT_S
    while not path.exists():
        if time.monotonic() > until:
            return False
        time.sleep(0.01)
    return True
