"""Files that kernel code could have made are read by trusted processes without waiting on a
FIFO, following a link, or reading without end (perfloop.core.plainfile)."""

import os
import threading

import pytest
from conftest import HANG_S

from perfloop.contract import kernel
from perfloop.core import plainfile, progress
from perfloop.core.errors import UserError
from perfloop.run import experiment


def _within(seconds: float, fn, *args):
    """fn(*args) run on a thread: its result, or a failure if it is still waiting (a read
    that waits on a FIFO waits forever: `seconds` only ends the test)."""
    box = {}

    def run():
        try:
            box["out"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 (raised again on the test's thread)
            box["raised"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__} still waiting after {seconds} s"
    if "raised" in box:
        raise box["raised"]
    return box.get("out")


def test_a_fifo_a_link_and_a_flood_are_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "plain.py").write_text("x = 1\n")
    os.symlink(tmp_path / "plain.py", tmp_path / "link.py")
    (tmp_path / "big").write_bytes(b"x" * 1000)
    for name in ("pipe.py", "link.py"):
        with pytest.raises(plainfile.NotPlain):
            _within(HANG_S, plainfile.read_bytes, tmp_path / name)
    assert plainfile.read_text(tmp_path / "plain.py") == "x = 1\n"
    with pytest.raises(plainfile.NotPlain):
        plainfile.read_bytes(tmp_path / "big", limit=999)
    assert plainfile.read_bytes(tmp_path / "big", limit=10, offset=995, cut=True) == b"xxxxx"
    with pytest.raises(FileNotFoundError):
        plainfile.read_bytes(tmp_path / "none")


def test_a_kernel_folder_with_a_fifo_neither_stalls_nor_compares_equal(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "kernel.py").write_text("x = 1\n")
    assert experiment._same_code(a, b)
    os.mkfifo(b / "pipe.py")
    assert _within(HANG_S, experiment._same_code, a, b) is False
    os.symlink("/dev/zero", b / "zero.bin")         # a link is digested by its target's name
    assert _within(HANG_S, kernel.code_digest, b) != kernel.code_digest(a)


def test_knobs_json_that_is_no_file_is_one_line(tmp_path):
    os.mkfifo(tmp_path / "knobs.json")
    with pytest.raises(UserError) as caught:
        _within(HANG_S, kernel.read_knobs, tmp_path / "knobs.json")
    assert "not a regular file" in str(caught.value) and "\n" not in str(caught.value)


def test_a_childs_log_made_a_fifo_shows_nothing(tmp_path):
    log = tmp_path / "log"
    log.write_text('{"a": 1}\n')
    tail = progress.Tail(log)
    assert tail.lines() == ['{"a": 1}']
    log.unlink()
    os.mkfifo(log)
    assert _within(HANG_S, tail.lines) == []
