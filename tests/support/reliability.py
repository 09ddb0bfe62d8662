"""Helpers for the reliability tests: perfloop in a process group of its own (so a Ctrl-C can
be sent to the group as a terminal sends it), a holder of perfloop's lock, and perfloop run
where a folder is read-only or small (a private mount namespace: nothing outside changes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import pythonpath


def _env(extra: dict | None) -> dict:
    return {**os.environ, "PYTHONPATH": pythonpath(), **(extra or {})}


def _sigint_back() -> None:
    # a shell that started the tests in the background ignores SIGINT, and its children
    # inherit that: give perfloop Ctrl-C back
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn(repo: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """`python -m perfloop ARGS --json`, leading a process group of its own, as a shell's
    foreground job does."""
    return subprocess.Popen([sys.executable, "-m", "perfloop", *args, "--json"], cwd=repo,
                            env=_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, process_group=0, preexec_fn=_sigint_back)


def answer(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, dict | None, str]:
    out, err = proc.communicate(timeout=timeout)
    lines = out.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if lines else None), err


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def hold_lock(path: Path, command: str = "perfloop run --kernel scripted") -> subprocess.Popen:
    """Another process holding perfloop's lock at `path`, until killed."""
    code = ("import sys, time; from pathlib import Path; from perfloop.store import lock\n"
            f"with lock.hold(Path({str(path)!r}), 'x', command={command!r}):\n"
            "    print('held', flush=True); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(None),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def namespace_prefix() -> list[str]:
    """A private mount namespace for one command (skips the test where none can be made)."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to make a folder read-only or small for one command")
    for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
        probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                               capture_output=True)
        if probe.returncode == 0:
            return prefix
    pytest.skip("cannot make a mount namespace here (unshare -m / -rm refused)")


def in_namespace(repo: Path, setup: str, *args: str, env: dict | None = None,
                 timeout: float = 600) -> tuple[int, dict | None, str]:
    """`python -m perfloop ARGS --json` after the shell commands `setup` (run in the
    repository, in a mount namespace of this command alone)."""
    script = f'set -e; {setup}; exec "$@"'
    proc = subprocess.run([*namespace_prefix(), "sh", "-c", script, "sh", sys.executable,
                           "-m", "perfloop", *args, "--json"], cwd=repo, env=_env(env),
                          capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if lines else None), proc.stderr


def read_only(path: str) -> str:
    """Shell commands that make `path` (relative to the repository) read-only."""
    return f"mount --bind {path} {path}; mount -o remount,bind,ro {path}"


def small(path: str, size_mb: int, fill_mb: int = 0) -> str:
    """Shell commands that put `path`'s files on a filesystem of size_mb MB, fill_mb of it
    taken by a file."""
    return (f"mkdir -p {path}; keep=$(mktemp -d); cp -a {path}/. $keep/; "
            f"mount -t tmpfs -o size={size_mb}m tmpfs {path}; cp -a $keep/. {path}/; "
            f"rm -rf $keep; dd if=/dev/zero of={path}/.filler bs=1M count={fill_mb} "
            "status=none")


def wait_until_timing(repo: Path, seconds: float) -> None:
    """Until iteration 1's timing child has its spec (a Ctrl-C then lands while it runs)."""
    work = repo / "sandbox/scripted/work"
    deadline = time.monotonic() + seconds
    while not list(work.glob("iter-01-*/timing-*-spec.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert time.monotonic() < deadline
    time.sleep(0.5)  # the timing child is running now
