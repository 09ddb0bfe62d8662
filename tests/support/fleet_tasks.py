"""Tasks a test's fleet runs on its workers in place of measuring an experiment (pickled by
value: the workers do not import tests/)."""

import os
import time
from pathlib import Path


class Job:
    """A task as perfloop.fleet.driver.Remote.run takes one: it has a key."""

    def __init__(self, key: str, **data):
        self.key, self.data = key, data


def echo(job):
    """Its job back, with the worker that ran it."""
    return {"job": job.data, "pid": os.getpid()}


def dies_once(job):
    """Ends its worker process the first time it runs (a GPU that fails, a node lost), then
    answers as echo does."""
    # O_EXCL: two workers starting at once must not both see "first time" and both die.
    try:
        fd = os.open(job.data["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return echo(job)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os._exit(1)


def child_sleeps(job):
    """Starts a child as perfloop starts its judges and timers, and waits for it."""
    from perfloop.measure import process

    running = process.start(["sleep", "60"], log=Path(job.data["log"]))
    Path(job.data["pid"]).write_text(str(running.proc.pid))
    res = running.wait(deadline=time.monotonic() + 120)
    return {"returncode": res.returncode}
