"""Live progress lines: drawn on stderr only for a terminal (or when forced), never under --json,
fed by the same progress files as the hang watchdog; otherwise nothing changes in the output."""

import io
import json
import os
import subprocess
import sys

import pytest
from conftest import HANG_S, pythonpath

from perfloop.core import progress
from perfloop.measure import process as child

ANSI = "\x1b["
COMPILE_AHEAD = '''

def compile_ahead(knobs, shapes, arch):
    import time
    time.sleep(0.05)
'''


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def quiet_again(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    yield
    progress.configure(json_answer=True)   # leave the module off for other tests


def test_progress_is_drawn_only_for_a_terminal_and_never_under_json(monkeypatch):
    pipe = io.StringIO()
    assert not progress.configure(json_answer=False, stream=pipe)
    with progress.task("judge", "3 candidates") as bar:
        assert bar is progress.NULL
        bar.update("anything", advance=1)
    assert pipe.getvalue() == ""
    terminal = Terminal()
    assert not progress.configure(json_answer=True, stream=terminal)
    assert progress.configure(json_answer=False, stream=terminal)
    with progress.task("judge", "3 candidates in 1 process") as bar:
        bar.update("3 candidates in 1 process: 7 cases checked")
    assert "judge" in terminal.getvalue() and "7 cases checked" in terminal.getvalue()
    monkeypatch.setenv(progress.ENV, "0")
    assert not progress.configure(json_answer=False, stream=Terminal())
    monkeypatch.setenv(progress.ENV, "1")
    forced = io.StringIO()
    assert progress.configure(json_answer=False, stream=forced)
    with progress.task("compile", total=2) as bar:
        bar.update("sm_90 tile=1x1024", advance=1)
        with progress.paused():
            pass
    assert "compile" in forced.getvalue() and ANSI in forced.getvalue()
    assert not progress.configure(json_answer=True, stream=forced)


def test_the_watchdogs_reading_of_a_childs_progress_feeds_the_line(tmp_path):
    # each line waits until the watchdog has passed the one before it on: read as written,
    # however slowly a loaded machine runs either side
    written, read = tmp_path / "progress.jsonl", tmp_path / "read"
    code = ("import json, os, sys, time\n"
            "until = time.monotonic() + float(sys.argv[3])\n"
            "for i in range(4):\n"
            "    open(sys.argv[1], 'a').write(json.dumps({'stage': 'time', 'n': i}) + '\\n')\n"
            "    while not (os.path.exists(sys.argv[2]) and open(sys.argv[2]).read() == str(i)):\n"
            "        if time.monotonic() > until:\n"
            "            sys.exit(3)\n"
            "        time.sleep(0.01)\n")
    tail, seen = progress.Tail(written), []

    def on_progress():
        seen.extend(json.loads(x)["n"] for x in tail.lines())
        if seen:
            read.write_text(str(seen[-1]))

    res = child.run([sys.executable, "-c", code, str(written), str(read), str(HANG_S)],
                    timeout_s=HANG_S, log=tmp_path / "log", progress=[written], stall_s=HANG_S,
                    on_progress=on_progress)
    assert res.returncode == 0
    assert seen == [0, 1, 2, 3]


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
