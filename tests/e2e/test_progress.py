"""Live progress lines of `perfloop step` and `perfloop check`: on stderr only when forced (as on
a terminal), never under --json, and the answer on stdout unchanged (the lines alone:
tests/unit/core/test_progress.py)."""

import json
import os
import subprocess
import sys

import pytest
from conftest import pythonpath

from perfloop.core import progress

ANSI = "\x1b["


@pytest.fixture(autouse=True)
def quiet_again(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    yield
    progress.configure(json_answer=True)   # leave the module off for other tests


COMPILE_AHEAD = '''

def compile_ahead(knobs, shapes, arch):
    import time
    time.sleep(0.05)
'''


def perfloop(scratch, *args, **env):
    proc = subprocess.run([sys.executable, "-m", "perfloop", *args], cwd=scratch.path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": pythonpath(), **env})
    return proc.returncode, proc.stdout, proc.stderr


def test_a_step_shows_the_judge_and_the_timing_only_when_asked(scratch):
    scratch.script([{"when": {"tile": [1, 2048]}, "factor": {"*": 0.9}}])
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    # stdout and stderr are pipes here: nothing but the answer
    code, out, err = perfloop(scratch, "step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 0 and err == "" and ANSI not in out
    assert out.splitlines()[0].startswith("iteration 1 ") and out.splitlines()[1].startswith("next: ")
    # forced, as on a terminal: the lines appear on stderr, the answer on stdout is unchanged
    code, out, err = perfloop(scratch, "step", "--kernel", "scripted", "--opt", "tile_shape",
                              PERFLOOP_PROGRESS="1")
    assert code == 0 and ANSI not in out and "judge" not in out
    assert out.splitlines()[0].startswith("iteration 2 ") and len(out.splitlines()) == 2
    for words in ("iteration 2", "tile_shape", "judge", "cases run", "timing"):
        assert words in err, words
    # under --json, never: one JSON object and an empty stderr, forced or not
    for env in ({}, {"PERFLOOP_PROGRESS": "1"}):
        code, out, err = perfloop(scratch, "step", "--kernel", "scripted", "--opt", "occupancy",
                                  "--json", **env)
        assert err == "" and len(out.splitlines()) == 1 and json.loads(out)["ok"]
    assert [r["optimization"] for r in scratch.records()[-2:]] == ["occupancy", "occupancy"]


def test_check_shows_what_it_compiles(scratch):
    with open(scratch.kernel / "kernel.py", "a") as f:
        f.write(COMPILE_AHEAD)
    scratch.commit_all("compile ahead")
    code, quiet, err = perfloop(scratch, "check", "--kernel", "scripted", "--arch", "sm_90")
    assert code == 0 and err == "" and ANSI not in quiet
    code, shown, err = perfloop(scratch, "check", "--kernel", "scripted", "--arch", "sm_90",
                                PERFLOOP_PROGRESS="1")
    assert code == 0 and "compile" in err and "sm_90 fast_math=" in err
    assert ANSI not in shown and shown.split(" in ")[0] == quiet.split(" in ")[0]
    code, out, err = perfloop(scratch, "check", "--kernel", "scripted", "--arch", "sm_90",
                              "--json", PERFLOOP_PROGRESS="1")
    assert code == 0 and err == "" and json.loads(out)["failures"] == []
