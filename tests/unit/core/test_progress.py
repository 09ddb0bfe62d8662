"""Live progress lines: drawn on stderr only for a terminal (or when forced), never under --json,
fed by the same progress files as the hang watchdog; otherwise nothing changes in the output."""

import io
import json
import sys

import pytest
from conftest import HANG_S

from perfloop.core import progress
from perfloop.measure import process as child

ANSI = "\x1b["


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
