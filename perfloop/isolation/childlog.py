"""A child's output into its log file, capped: the child writes to a pipe, and a thread of the
parent copies the first half of the cap into the log as it comes, keeps the last half in
memory, and counts and drops what lies between; at the end the log gets a line saying how many
bytes were dropped and what the cap is, then the last bytes. A kernel that printed 2 MB per
launch once made one `init` write 954 MB of logs.

The thread sleeps in poll() while the child is quiet, so a child that prints nothing costs
nothing, and it drains the pipe as fast as the child fills it, so one that prints a lot never
waits long on it. Nothing the parent does waits on the child's output: `close` ends the copy
once the child is gone (a daemon the child left holding the pipe may keep it open: then what
is in the pipe is read, and the rest is not waited for).

`[limits] log_cap_mb` in rules.toml sets the cap (`configure`, from the run's rules).
"""

from __future__ import annotations

import collections
import os
import select
import threading
import time
from pathlib import Path

DEFAULT_CAP_MB = 8.0   # rules.toml's [limits] log_cap_mb, where no rules say otherwise
CHUNK = 1 << 16
LAST_READS = 256       # at the end, at most this many reads of what the pipe holds (16 MB: a
                       # pipe holds 1 MB at most, a daemon left writing to it may never stop)
TOUCH_S = 1.0          # while output is only counted, the log's time moves at most this often:
                       # the stall watch (perfloop.measure.process) reads output as progress
_cap_bytes = int(DEFAULT_CAP_MB * 2**20)
_WRITERS: dict[str, int] = {}   # a log's path -> its pipe's end for the child, until it has it


def configure(cap_mb: float) -> None:
    """The cap of the logs opened from now on in this process (the run's [limits] log_cap_mb)."""
    global _cap_bytes
    _cap_bytes = int(cap_mb * 2**20)


def writer(path: Path, default: int) -> int:
    """In a child forked from this process (not started by exec): the end of the pipe that
    the parent made for the log at `path` before it forked, else `default`."""
    return _WRITERS.get(str(Path(path)), default)


def note(dropped: int, cap: int) -> bytes:
    """The line that stands where output was dropped."""
    return (f"\n[perfloop: {dropped} bytes of output dropped here; a log keeps the first "
            f"{cap - cap // 2} and the last {cap // 2} bytes of a child's output ([limits] "
            f"log_cap_mb = {cap / 2**20:g})]\n").encode()


class ChildLog:
    """Give `write_fd` to the child as its stdout and stderr, then call `started` (the parent's
    copy of it is closed there), and `close` once the child has ended."""

    def __init__(self, path: Path, *, append: bool = False, cap: int | None = None):
        self.path, self.cap = Path(path), _cap_bytes if cap is None else int(cap)
        self.head_left, self.tail_max = self.cap - self.cap // 2, self.cap // 2
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_bytes = self.dropped = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        self._file = os.open(self.path, flags, 0o644)
        self._read, self.write_fd = os.pipe()
        _WRITERS[str(self.path)] = self.write_fd
        self._wake_read, self._wake = os.pipe()
        self._thread = threading.Thread(target=self._copy, daemon=True,
                                        name=f"perfloop-log-{self.path.name}")
        self._closed = False
        self.failed: OSError | None = None   # the log could not be written (a full disk)

    def started(self) -> None:
        """The child holds the pipe now: the parent's end is closed (the copy ends when the
        child's does) and the copy begins."""
        _WRITERS.pop(str(self.path), None)
        os.close(self.write_fd)
        self.write_fd = -1
        self._thread.start()

    def close(self) -> None:
        """Once the child has ended: what is in the pipe, then the note and the last bytes."""
        if self._closed:
            return
        self._closed = True
        if self.write_fd >= 0:   # (never started: no child got it)
            _WRITERS.pop(str(self.path), None)
            os.close(self.write_fd)
            self.write_fd = -1
        os.write(self._wake, b"x")
        if self._thread.ident is None:
            self._thread.start()
        self._thread.join()
        for fd in (self._read, self._wake_read, self._wake):
            os.close(fd)

    # ---- the thread ---------------------------------------------------------------------------
    def _copy(self) -> None:
        try:
            poller = select.poll()
            poller.register(self._read, select.POLLIN)
            poller.register(self._wake_read, select.POLLIN)
            touched = 0.0
            while True:
                ready = {fd for fd, _ in poller.poll()}
                if self._wake_read in ready:
                    self._drain_now()
                    break
                chunk = os.read(self._read, CHUNK)
                if not chunk:
                    break
                if self._take(chunk) and time.monotonic() - touched > TOUCH_S:
                    touched = time.monotonic()
                    try:
                        os.utime(self._file)
                    except OSError:
                        pass
        finally:
            self._finish()

    def _drain_now(self) -> None:
        """Asked to end: what the pipe holds now, no more (a daemon may keep writing)."""
        os.set_blocking(self._read, False)
        for _ in range(LAST_READS):
            try:
                chunk = os.read(self._read, CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._take(chunk)

    def _take(self, chunk: bytes) -> bool:
        """Into the log while the head has room, the rest into the tail; True if any of it
        went to the tail (the log's size did not change)."""
        if self.head_left:
            head = chunk[:self.head_left]
            self._write(head)
            self.head_left -= len(head)
            chunk = chunk[len(head):]
        if not chunk:
            return False
        self.tail.append(chunk)
        self.tail_bytes += len(chunk)
        while self.tail and self.tail_bytes - len(self.tail[0]) >= self.tail_max:
            self.dropped += len(self.tail[0])
            self.tail_bytes -= len(self.tail.popleft())
        return True

    def _finish(self) -> None:
        try:
            rest = b"".join(self.tail)
            cut = max(len(rest) - self.tail_max, 0)
            if self.dropped + cut:
                self._write(note(self.dropped + cut, self.cap))
            self._write(rest[cut:])
        finally:
            os.close(self._file)

    def _write(self, data: bytes) -> None:
        """Into the log; once a write fails (a full disk), the rest of the output is only
        drained, so the child never waits on its pipe for want of a log."""
        view = memoryview(data)
        while view and self.failed is None:
            try:
                view = view[os.write(self._file, view):]
            except OSError as exc:
                self.failed = exc
