"""The one-writer lock (perfloop.store.lock): a second holder is refused in one line naming
the first, and a dead holder's lock is free."""

import json
import os
import signal

import pytest
from support.reliability import hold_lock

from perfloop.core.errors import Busy
from perfloop.store import lock


def test_a_second_holder_is_refused_naming_the_first_and_a_dead_ones_lock_is_free(tmp_path):
    path = tmp_path / "locks" / "k.lock"
    holder = hold_lock(path, command="perfloop run --kernel k")
    try:
        with pytest.raises(Busy) as refused:
            with lock.hold(path, "kernel 'k'"):
                pass
        line = str(refused.value)
        assert f"pid {holder.pid}" in line and "`perfloop run --kernel k`" in line
        assert "since 20" in line and "kernel 'k' is in use" in line
    finally:
        holder.send_signal(signal.SIGKILL)  # a holder that dies without a word
        holder.wait()
    with lock.hold(path, "kernel 'k'", command="perfloop step"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert path.read_text() == ""  # (released: no holder left to name)
