"""A child's output reaches its log capped (perfloop.isolation.childlog): the first and the last
halves of the cap kept, the bytes between counted and dropped and the log saying so; a child
that prints a lot is never stalled by it, a quiet one never notices, and the parent never waits
on a child's output."""

import os
import signal
import subprocess
import sys
import threading

import pytest
from conftest import HANG_S, eventually

from perfloop.isolation import childlog

CAP = 64 * 1024


def _child(code: str, log: childlog.ChildLog, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=log.write_fd,
                            stderr=subprocess.STDOUT)
    log.started()
    return proc


def _printing(n: int) -> bytes:
    """What `PRINT` writes for n: numbered lines, so any cut shows where it was."""
    return b"".join(b"%08d\n" % i for i in range(n))


PRINT = ("import sys\nfor i in range(int(sys.argv[1])):\n"
         "    sys.stdout.buffer.write(b'%08d\\n' % i)\n")


def _run(tmp_path, n: int, cap: int = CAP) -> bytes:
    log = childlog.ChildLog(tmp_path / "child.log", cap=cap)
    proc = _child(PRINT, log, str(n))
    assert proc.wait(timeout=HANG_S) == 0
    log.close()
    return (tmp_path / "child.log").read_bytes()


def test_output_under_the_cap_is_kept_whole_and_silence_stays_silent(tmp_path):
    assert _run(tmp_path, 0) == b""
    assert _run(tmp_path, 1000) == _printing(1000)       # 9000 bytes, under the cap
    assert _run(tmp_path, CAP // 9) == _printing(CAP // 9)


def test_output_past_the_cap_keeps_its_first_and_last_halves_and_says_what_was_dropped(tmp_path):
    n = 600_000                                          # 5.4 MB
    full, got = _printing(n), _run(tmp_path, n)
    note = childlog.note(len(full) - CAP, CAP)
    assert got == full[:CAP // 2] + note + full[-(CAP // 2):]
    assert b"[perfloop: 5334464 bytes of output dropped here; a log keeps the first 32768 " \
        b"and the last 32768 bytes of a child's output ([limits] log_cap_mb = 0.0625)]" in got


def test_a_child_that_prints_without_end_is_never_stalled_by_its_log(tmp_path):
    # 8 MB through a 64 KB pipe and a 64 KB cap: undrained, the child would wait on it forever
    n = 8 * 2**20 // 9
    got = _run(tmp_path, n)
    assert len(got) == CAP + len(childlog.note(n * 9 - CAP, CAP))
    assert got.endswith(b"%08d\n" % (n - 1))


def test_the_log_moves_while_output_is_only_counted(tmp_path, monkeypatch):
    """The stall watch (perfloop.measure.process) takes a log that changes for progress."""
    monkeypatch.setattr(childlog, "TOUCH_S", 0.0)
    stop = tmp_path / "stop"
    code = ("import os, sys, time\n"
            "sys.stdout.buffer.write(b'x' * int(sys.argv[2])); sys.stdout.flush()\n"
            "while not os.path.exists(sys.argv[1]):\n"
            "    sys.stdout.buffer.write(b'y' * 100); sys.stdout.flush(); time.sleep(0.01)\n")
    path = tmp_path / "child.log"
    log = childlog.ChildLog(path, cap=CAP)
    proc = _child(code, log, str(stop), str(CAP // 2))
    eventually(lambda: path.stat().st_size == CAP // 2, "the head written")
    head = path.stat().st_mtime_ns
    eventually(lambda: path.stat().st_mtime_ns != head, "the log's time moving")
    assert path.stat().st_size == CAP // 2              # (nothing past the head written yet)
    stop.touch()
    assert proc.wait(timeout=HANG_S) == 0
    log.close()
    got = path.read_bytes()
    assert got.startswith(b"x" * (CAP // 2)) and got[CAP // 2:].strip(b"y") in (b"", b"\n")


def test_closing_does_not_wait_for_a_daemon_that_holds_the_pipe(tmp_path):
    code = ("import os, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.setsid()\n"
            "    while True:\n"
            "        os.write(1, b'tick\\n'); time.sleep(0.01)\n"
            "os.write(1, b'daemon %d\\n' % pid)\n")
    path = tmp_path / "child.log"
    log = childlog.ChildLog(path, cap=CAP)
    proc = _child(code, log)
    assert proc.wait(timeout=HANG_S) == 0
    eventually(lambda: b"daemon " in path.read_bytes() and b"tick" in path.read_bytes(),
               "the daemon ticking")
    daemon = int(path.read_text().split("daemon ", 1)[1].split()[0])
    try:
        closing = threading.Thread(target=log.close, daemon=True)
        closing.start()
        closing.join(HANG_S)
        assert not closing.is_alive()
    finally:
        os.kill(daemon, signal.SIGKILL)


def test_perfloops_children_log_through_the_cap_the_rules_set(tmp_path, monkeypatch):
    from perfloop.measure import process

    monkeypatch.setattr(childlog, "_cap_bytes", CAP)   # (what a session's rules configure)
    res = process.run([sys.executable, "-c", PRINT, "100000"], timeout_s=HANG_S,
                      log=tmp_path / "child.log")
    full = _printing(100000)
    assert res.returncode == 0 and (tmp_path / "child.log").read_bytes() == \
        full[:CAP // 2] + childlog.note(len(full) - CAP, CAP) + full[-(CAP // 2):]


def test_a_forked_child_finds_its_logs_pipe_by_the_logs_path(tmp_path):
    """The timer forks its launchers without exec: each finds the pipe its log was given
    (perfloop.referee.launchers) by the log's path, until the parent has closed its end."""
    log = childlog.ChildLog(tmp_path / "launcher.log")
    assert childlog.writer(str(tmp_path / "launcher.log"), -1) == log.write_fd >= 0
    assert childlog.writer(tmp_path / "other.log", -1) == -1
    pid = os.fork()
    if pid == 0:
        os.write(childlog.writer(tmp_path / "launcher.log", 2), b"from the fork\n")
        os._exit(0)
    log.started()
    assert childlog.writer(tmp_path / "launcher.log", -1) == -1
    os.waitpid(pid, 0)
    log.close()
    assert (tmp_path / "launcher.log").read_bytes() == b"from the fork\n"


def test_a_log_that_cannot_be_written_still_drains_the_child(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full, a file every write to fails with ENOSPC")
    log = childlog.ChildLog("/dev/full", cap=CAP)
    proc = _child(PRINT, log, "100000")
    assert proc.wait(timeout=HANG_S) == 0
    log.close()
    assert log.failed is not None and log.failed.errno == 28   # ENOSPC


def test_a_cap_of_nothing_is_refused_in_one_line(tmp_path):
    import shutil

    from conftest import ROOT

    from perfloop.contract import playbook
    from perfloop.core.errors import UserError

    shutil.copytree(ROOT / "playbook", tmp_path / "playbook")
    rules = tmp_path / "playbook" / "rules.toml"
    assert playbook.load(tmp_path / "playbook").rules.log_cap_mb == 8
    rules.write_text(rules.read_text().replace("log_cap_mb = 8 ", "log_cap_mb = 0 "))
    with pytest.raises(UserError, match=r"\[limits\] log_cap_mb must be above 0, not 0$"):
        playbook.load(tmp_path / "playbook")
