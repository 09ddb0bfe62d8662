"""What the timer says of a launcher that stopped answering (perfloop.referee.launchers): a
channel that closed is a process on its way out, not a hang."""

import os
import signal
import subprocess
import time

import pytest
from conftest import HANG_S, eventually

from perfloop.isolation.channel import NO_ANSWER
from perfloop.referee import launchers


def launcher_of(child) -> launchers.Launcher:
    """A Launcher around a forked process running `child` in a session of its own."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            child()
        finally:
            os._exit(0)
    # (kill() kills its group)
    eventually(lambda: os.getpgid(pid) == pid, "the forked child leading its group")
    out = object.__new__(launchers.Launcher)
    out.label, out.reply_s, out.running = "candidate-0", 90.0, True
    out.proc = launchers.Forked(pid)
    out.log = open(os.devnull, "ab")
    return out


def segfault_soon():
    time.sleep(0.3)   # the channel reads closed before the process can be reaped
    os.kill(os.getpid(), signal.SIGSEGV)


def test_a_launcher_whose_channel_closed_is_waited_for_and_its_signal_named(monkeypatch):
    monkeypatch.setattr(launchers, "EXIT_GRACE_S", HANG_S)   # (it dies soon, however loaded)
    launcher = launcher_of(segfault_soon)
    failed = launcher._failed("the other end is gone")
    assert failed.reason == "died from signal SIGSEGV"


def test_a_launcher_that_did_not_answer_in_time_is_a_hang_and_is_killed():
    launcher = launcher_of(lambda: time.sleep(HANG_S))
    failed = launcher._failed(NO_ANSWER)
    assert failed.reason == "did not answer in 90 s (a hang)"
    assert launcher.proc.poll_for(HANG_S) == -signal.SIGKILL


def test_a_launcher_that_closed_its_channel_and_lives_on_is_killed_and_said_so(monkeypatch):
    monkeypatch.setattr(launchers, "EXIT_GRACE_S", 0.2)   # (it lives until killed)
    launcher = launcher_of(lambda: time.sleep(HANG_S))
    failed = launcher._failed("an answer that is not JSON")
    assert failed.reason == "an answer that is not JSON, and it did not exit: killed"
    assert launcher.proc.poll_for(HANG_S) == -signal.SIGKILL


def test_waiting_on_a_launcher_with_a_timeout_raises_rather_than_blocks():
    # a wait that blocked would return the child's status once it ended, not raise
    launcher = launcher_of(lambda: time.sleep(HANG_S))
    with pytest.raises(subprocess.TimeoutExpired):
        launcher.proc.wait(timeout=0.2)
    os.kill(launcher.proc.pid, signal.SIGKILL)
    assert launcher.proc.wait(timeout=HANG_S) == -signal.SIGKILL
    assert launcher.proc.wait() == -signal.SIGKILL
