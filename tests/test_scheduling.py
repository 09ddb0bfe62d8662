"""perfloop.referee.scheduling: a launcher's threads set back to the timer's scheduling before
its batch, and a launcher that took more than the timer's while timed named."""

import os
import signal
import time

import pytest

from perfloop.referee import scheduling

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")


@pytest.fixture
def child():
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
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
        os.SCHED_IDLE, 19, frozenset({min(want.cpus)}))
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
