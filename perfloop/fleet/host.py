"""What every fleet worker process is, whatever it measures: a trusted process set up to run
perfloop's children (a subreaper, not dumpable, on its share of the CPUs, its own GPU alone in
view), that says which machine and GPU it has, and whose children die once the driver says
stop (Ctrl-C there)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from distributed import WorkerPlugin

from perfloop.isolation import spawn
from perfloop.measure import process

STOP_POLL_S = 0.5


def _probe_gpus() -> list[str]:
    """The UUIDs of the GPUs this process would see (asked of a child, so that this trusted
    process makes no CUDA context of its own)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return []
    code = ("import torch\nn = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
            "print('\\n'.join(str(torch.cuda.get_device_properties(i).uuid) for i in range(n)))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def identity() -> dict:
    """Which machine and GPU this worker has (asked once, when the fleet starts)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "gpus": _probe_gpus(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cpus": sorted(os.sched_getaffinity(0))}


class Setup(WorkerPlugin):
    """A Dask worker plugin: makes the worker process fit to run perfloop's children."""

    name = "perfloop"

    def __init__(self, cores: list[int]):
        self.cores = list(cores)

    def setup(self, worker=None) -> None:
        # its own GPU only: dask-cuda lists every GPU, its own first
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        if seen and "," in seen:
            os.environ["CUDA_VISIBLE_DEVICES"] = seen.split(",")[0].strip()
        spawn.become_subreaper()   # daemons kernel code leaves come back here, to be killed
        spawn.set_dumpable(False)  # its environment and memory closed to them
        if self.cores:
            os.sched_setaffinity(0, self.cores)

    def teardown(self, worker=None) -> None:
        stop_children()


def scratch() -> Path:
    """This worker's own folder: the pinned trees, the exports, the experiments' files."""
    root = Path(tempfile.gettempdir()) / f"perfloop-fleet-{os.getuid()}" / str(os.getpid())
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


def stop_children() -> None:
    """Kill every child this worker started, and what they left."""
    for pid in list(process._LIVE):
        try:
            os.killpg(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
    process.kill_strays()


def _watch(event, done: threading.Event) -> None:
    """Until `done`: once the driver sets its stop `event`, stop every child (Ctrl-C there)."""
    while not done.wait(STOP_POLL_S):
        try:
            if event.is_set():
                stop_children()
                return
        except Exception:  # (the scheduler gone: the task will be lost anyway)
            return


def watched(fn, job, stop: str):
    """fn(job) on this worker, its children killed once the driver sets its `stop` event."""
    from distributed import Event, get_client

    done = threading.Event()
    event = Event(stop, client=get_client())   # (made here: the task's thread has a client)
    watcher = threading.Thread(target=_watch, args=(event, done), daemon=True)
    watcher.start()
    try:
        return fn(job)
    finally:
        done.set()


_IDENTITY: dict = {}


def identity_cached() -> dict:
    if not _IDENTITY:
        _IDENTITY.update(identity())
    return _IDENTITY
