"""The sandbox itself (perfloop.isolation.sandbox): a confined child writes and reads only where
it is allowed, opens the devices and the shared memory it needs and makes nothing in /dev, and
a timer started ahead leaves cuda.tile's context to its launchers, which could not make it
confined. tests/e2e/test_trust.py tries the attacks it stops through perfloop's commands."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, pythonpath

from perfloop.isolation import sandbox

LANDLOCK = pytest.mark.skipif(sandbox.abi() < 1, reason="this kernel has no Landlock")


def _confined_attempts(confine: str, attempts: dict, env: dict, cwd) -> str:
    """In a fresh interpreter, `confine` (an expression that confines it and says how), then
    each attempt (name -> an expression that touches a file): "name: done" or "name: refused"
    for each, joined by ";"."""
    tries = ", ".join(f"({name!r}, lambda: {expr})" for name, expr in attempts.items())
    code = (f"import os\nfrom perfloop.isolation import sandbox\nprint({confine})\nout = []\n"
            f"for what, fn in ({tries},):\n    try:\n        fn()\n"
            f"        out.append(what + ': done')\n    except OSError:\n"
            f"        out.append(what + ': refused')\nprint(';'.join(out))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=cwd)
    lines = result.stdout.strip().splitlines()
    assert lines and lines[0].startswith("landlock ABI"), result
    return lines[1]


@LANDLOCK
def test_a_child_that_runs_kernel_code_is_confined_where_the_kernel_allows(tmp_path):
    """The sandbox itself: writes only beneath the allowed folders, reads only the allowed."""
    ok, secret = tmp_path / "ok", tmp_path / "secret"
    ok.mkdir()
    secret.mkdir()
    (secret / "s.txt").write_text("secret")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    said = _confined_attempts(
        f"sandbox.confine([{str(ok)!r}], sandbox.environment_reads({str(tmp_path)!r}))",
        {"write ok": f"open({str(ok / 'a')!r}, 'w').write('x')",
         "write secret": f"open({str(secret / 'b')!r}, 'w').write('x')",
         "read secret": f"open({str(secret / 's.txt')!r}).read()"}, env, tmp_path)
    assert said == "write ok: done;write secret: refused;read secret: refused"


@LANDLOCK
def test_a_confined_child_opens_devices_and_shared_memory_but_makes_nothing_in_dev(tmp_path):
    """/dev/null and memory the trusted side shared (a file it made in /dev/shm) open for
    writing, and the file may be removed (torch unlinks what it was the last to use); a new
    file in /dev/shm, and any other device, do not."""
    shared = Path("/dev/shm") / f"perfloop_test_{os.getpid()}_{tmp_path.name}"
    made = shared.with_name(shared.name + "_made.py")
    removed = shared.with_name(shared.name + "_removed")
    shared.write_bytes(b"\0" * 64)
    removed.write_bytes(b"\0")
    env = sandbox.child_environment({**os.environ, "PYTHONPATH": pythonpath()},
                                    tmp_path / "child", reads=[], root=tmp_path)
    try:
        said = _confined_attempts(
            "sandbox.apply_from_environ()",
            {"null": "open('/dev/null', 'w').write('x')",
             "shared": f"open({str(shared)!r}, 'r+b').write(b'y')",
             "made": f"open({str(made)!r}, 'w').write('VALUE = 1')",
             "removed": f"os.unlink({str(removed)!r})",
             "random": "open('/dev/random', 'wb').write(b'x')"}, env, tmp_path)
        assert said == "null: done;shared: done;made: refused;removed: done;random: refused"
        assert shared.read_bytes()[:1] == b"y" and not made.exists() and not removed.exists()
    finally:
        for path in (shared, made, removed):
            path.unlink(missing_ok=True)


def test_a_timer_started_ahead_leaves_cutile_to_its_launchers(tmp_path):
    # cuda.tile imported in the timer makes its context (a temporary folder in /tmp) before the
    # launchers are forked: confined, they could not write there
    task = tmp_path / "task.json"
    task.write_text("{}")
    code = ("import sys; from perfloop.isolation.lifeline import wait_for_task; "
            "from perfloop.referee import timer; from pathlib import Path; "
            f"assert wait_for_task(Path({str(task)!r}), timer.PRELOAD); "
            "print('cuda.tile' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": pythonpath()}, check=True).stdout
    assert out.split() == ["False", "True"]
