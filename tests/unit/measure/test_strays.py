"""Daemons that kernel code leaves are killed when its phase ends, with everything below them:
a daemon that keeps a child of its own (the child's parent is the daemon when perfloop sweeps,
so it is no stray yet) must not come back to perfloop alive after the sweep, as a red-team
kernel's did (it then slowed the incumbent's launchers through the timing phase)."""

import json
import subprocess
import sys

from conftest import HANG_S, pythonpath

# A subreaper (as perfloop's CLI is) runs a "judge" in a session of its own; kernel code there
# leaves a decoy in a new session, and below the decoy a second daemon in another. The judge
# ends; the decoy comes to the subreaper; kill_strays runs. Then: is anything of theirs alive?
SCENE = r"""
import json, os, signal, sys, time
from perfloop.isolation import spawn
from perfloop.measure import process

spawn.become_subreaper()
r, w = os.pipe()
judge = os.fork()
if judge == 0:
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):             # (the test reads this process's output to its end)
        os.dup2(null, fd)
    if os.fork() == 0:               # the decoy, a session of its own
        os.setsid()
        os.write(w, f"{os.getpid()}\n".encode())
        if os.fork() == 0:           # below it, the daemon that matters
            os.setsid()
            os.write(w, f"{os.getpid()}\n".encode())
            while True:
                time.sleep(1)
        while True:
            time.sleep(1)
    time.sleep(0.2)
    os._exit(0)
pids = os.fdopen(r)
decoy, deep = int(pids.readline()), int(pids.readline())
os.waitpid(judge, 0)
same = os.fork()                      # perfloop's own child, in its own session: no stray
if same == 0:
    while True:
        time.sleep(1)
keeper = None
if sys.argv[1] == "live":            # a child perfloop runs (a phase), with one of its own
    keeper = os.fork()
    if keeper == 0:
        os.setsid()
        while True:
            time.sleep(1)
    process._LIVE.add(keeper)
def parent(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[1])

until = time.monotonic() + float(sys.argv[2])   # (a hang guard: it comes at once, if slowly)
while time.monotonic() < until and parent(decoy) != os.getpid():
    time.sleep(0.01)
killed = process.kill_strays()

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False

print(json.dumps({"killed": killed, "deep_alive": alive(deep), "same_alive": alive(same),
                  "keeper_alive": keeper is not None and alive(keeper)}))
for pid in (decoy, deep, keeper, same):
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
"""


def _scene(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SCENE, mode, str(HANG_S)], capture_output=True,
                          text=True, timeout=2 * HANG_S, env={"PYTHONPATH": pythonpath(), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_daemon_below_a_daemon_dies_with_it():
    seen = _scene("plain")
    assert not seen["deep_alive"], seen
    assert seen["killed"] >= 2, seen
    assert seen["same_alive"], seen


def test_a_phase_still_running_is_no_stray():
    seen = _scene("live")
    assert seen["keeper_alive"] and not seen["deep_alive"], seen


def test_no_program_is_spared_by_its_name(monkeypatch):
    """A daemon that kernel code left running torch's shared-memory manager (a red-team one
    did, with a library of its own preloaded, and slowed the incumbent's launchers through
    the timing phase) is a stray like any other: only helpers perfloop registered are not."""
    import os

    from perfloop.isolation import spawn
    from perfloop.measure import process

    me, daemon, helper = os.getpid(), 10 ** 7 + 1, 10 ** 7 + 2
    table = {pid: spawn.Proc(me, pid, pid) for pid in (daemon, helper)}
    monkeypatch.setattr(spawn, "process_table", lambda: table)
    monkeypatch.setattr(spawn, "torch_shm_manager", lambda pid: True, raising=False)
    monkeypatch.setattr(spawn, "OWN_HELPERS", {helper})
    assert process._strays() == [daemon]
