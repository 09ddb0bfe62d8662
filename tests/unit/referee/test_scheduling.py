"""perfloop.referee.scheduling: a launcher's threads set back to the timer's scheduling before
its batch, and a launcher that took more than the timer's while timed named."""

import os
import signal
import time

import pytest
from conftest import HANG_S

from perfloop.referee import scheduling

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")


@pytest.fixture
def child():
    pid = os.fork()
    if pid == 0:
        time.sleep(HANG_S)   # (killed once the test is done, however long that takes)
        os._exit(0)
    yield pid
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_a_launcher_deprioritized_by_another_is_set_back_or_said(child):
    want = scheduling.own()
    os.sched_setscheduler(child, os.SCHED_IDLE, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, child, 19)
    os.sched_setaffinity(child, {min(want.cpus)})
    assert scheduling.of_thread(child) == scheduling.Sched(
        os.SCHED_IDLE, 19, frozenset({min(want.cpus)}), scheduling.autogroup(child))
    failed = scheduling.reset([child], want)
    if os.geteuid() == 0:        # root may raise a priority again
        assert failed == [] and scheduling.of_thread(child) == want
    else:                        # others may not: the timer then times nothing of it
        assert failed and "SCHED_IDLE" in failed[0]


def test_a_launcher_that_took_more_than_the_timer_is_named(child):
    want = scheduling.own()
    assert scheduling.gained([child], want) == []
    os.sched_setaffinity(child, {min(want.cpus)})    # fewer CPUs only slow it: not named
    assert scheduling.gained([child], want) == []
    os.sched_setscheduler(child, os.SCHED_BATCH, os.sched_param(0))
    assert "SCHED_BATCH" in scheduling.gained([child], want)[0]
    if os.geteuid() == 0:
        os.sched_setscheduler(child, want.policy, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, child, want.nice - 1)
        assert f"nice {want.nice - 1}" in scheduling.gained([child], want)[0]


@pytest.fixture
def session_child():
    """A process in a session (and so an autogroup) of its own, as a launcher is."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.write(write, b"x")
        time.sleep(60)
        os._exit(0)
    os.read(read, 1)
    yield pid
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


@pytest.mark.skipif(scheduling.autogroup("self") is None, reason="no autogroups here")
def test_a_launcher_that_weighted_its_own_session_is_named_and_set_back(session_child):
    """`echo -20 > /proc/self/autogroup` gives a launcher's session more of a busy CPU, unseen
    by its nice value; the timer sets it back before a batch and names it after one."""
    want = scheduling.own()
    try:
        with open(f"/proc/{session_child}/autogroup", "w") as f:
            f.write(str(want.autogroup - 1))
    except OSError:
        pytest.skip("a weightier autogroup needs CAP_SYS_NICE")
    assert f"autogroup nice {want.autogroup - 1}" in scheduling.gained([session_child], want)[0]
    assert scheduling.reset([session_child], want) == []
    assert scheduling.autogroup(session_child) == want.autogroup
    assert scheduling.gained([session_child], want) == []


def test_the_timers_own_limits_and_priority_changed_by_another_are_named_and_set_back():
    """A launcher may lower the timer's resource limits or priority (any process of its user
    may): after each turn the timer finds the change, sets it back and fails that launcher."""
    import resource

    want, limits = scheduling.own(), scheduling.own_limits()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 1, hard))
    changed = scheduling.restore_own(want, limits)
    assert changed and "RLIMIT_NOFILE" in changed[0]
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)
    os.setpriority(os.PRIO_PROCESS, 0, want.nice + 1)
    changed = scheduling.restore_own(want, limits)
    assert changed and f"nice {want.nice + 1}" in changed[0]
    if os.geteuid() == 0:   # (only root may raise its own priority again)
        assert scheduling.own() == want
        assert scheduling.restore_own(want, limits) == []


def test_a_stopped_process_still_working_in_the_kernel_is_waited_for(child):
    """A stopped launcher still finishes the system call it is in; the next batch waits for
    it, and one that keeps working past the grace is named."""
    os.kill(child, signal.SIGSTOP)
    assert scheduling.busy_until_stopped([child], 5.0) == []
    os.kill(child, signal.SIGCONT)
    spinner = os.fork()
    if spinner == 0:
        while True:
            pass
    try:
        assert scheduling.busy_until_stopped([spinner], 0.2) == [spinner]   # running: busy
        os.kill(spinner, signal.SIGSTOP)
        assert scheduling.busy_until_stopped([spinner], 5.0) == []
    finally:
        os.kill(spinner, signal.SIGKILL)
        os.waitpid(spinner, 0)


def test_a_launcher_is_stopped_again_once_it_has_answered(monkeypatch):
    """Sharing a shape's slots (an ask) continues every launcher; one left running then ran
    beside the incumbent's warm-up and first rounds (a red-team kernel's thread saw it)."""
    import signal

    from perfloop.referee import launchers

    sent = []
    monkeypatch.setattr(launchers, "_signal_group", lambda pgid, sig: sent.append(sig))

    class Channel:
        def send_pickle(self, message, pickler=None):
            pass

        def recv_json(self, timeout_s):
            return {"ok": True}

    class Proc:
        pid = 10 ** 7

        def poll(self):
            return None

    launcher = object.__new__(launchers.Launcher)
    launcher.label, launcher.reply_s, launcher.running = "candidate-0", 5.0, False
    launcher.channel, launcher.proc = Channel(), Proc()
    assert launcher.ask({"op": "slots", "slots": []}) == {"ok": True}
    assert sent == [signal.SIGCONT, signal.SIGSTOP] and not launcher.running
