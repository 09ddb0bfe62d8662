"""Live progress on stderr for what takes more than a few seconds (a run's iterations, the
judge, the timing, compiling every variant): one line per phase saying what runs and how far
along it is, drawn by rich and erased when the phase ends.

Shown only when stderr is a terminal and the answer is not --json; otherwise every call here
does nothing, so what perfloop writes is byte for byte what it wrote without it. Set
PERFLOOP_PROGRESS=1 to draw it on a stderr that is not a terminal (tests), 0 never to.
The children's own progress files, which the parent reads for its hang watchdog, feed it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from perfloop.core import plainfile

ENV = "PERFLOOP_PROGRESS"

_lock = threading.RLock()
_enabled = False
_forced = False
_stream = None
_bar = None        # the rich Progress while any task is open
_open = 0


def configure(json_answer: bool, stream=None) -> bool:
    """Decide once per command whether progress is drawn; returns that."""
    global _enabled, _forced, _stream
    _stream = stream if stream is not None else sys.stderr
    wish = os.environ.get(ENV, "")
    _forced = wish == "1"
    try:
        tty = _stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    _enabled = not json_answer and wish != "0" and (_forced or tty)
    return _enabled


def enabled() -> bool:
    return _enabled


class Task:
    """One line of progress; every method is safe to call from any thread."""

    def __init__(self, task_id=None):
        self._id = task_id

    def update(self, text: str | None = None, *, completed: float | None = None,
               total: float | None = None, advance: float | None = None) -> None:
        if self._id is None:
            return
        fields = {"text": text} if text is not None else {}
        with _lock:
            if _bar is not None:
                _bar.update(self._id, completed=completed, total=total, advance=advance, **fields)

    def close(self) -> None:
        global _bar, _open
        if self._id is None:
            return
        with _lock:
            task_id, self._id = self._id, None
            if _bar is None:
                return
            _bar.refresh()  # its last state is drawn once, however short it was
            _bar.remove_task(task_id)
            _open -= 1
            if _open == 0:
                _bar.stop()
                _bar = None

    def __enter__(self) -> "Task":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


NULL = Task()


def _new_bar():
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(file=_stream, force_terminal=True if _forced else None, stderr=True)
    return Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"),
                    BarColumn(bar_width=20), TextColumn("{task.fields[text]}"),
                    TimeElapsedColumn(), console=console, transient=True,
                    redirect_stdout=False, redirect_stderr=False, refresh_per_second=4)


def task(description: str, text: str = "", total: float | None = None) -> Task:
    """A new progress line (a no-op one when progress is off); close it, or use it in `with`."""
    global _bar, _open
    if not _enabled:
        return NULL
    with _lock:
        if _bar is None:
            _bar = _new_bar()
            _bar.start()
        _open += 1
        return Task(_bar.add_task(description, total=total, text=text))


@contextlib.contextmanager
def paused():
    """Take the lines off the terminal while something else is written to it."""
    with _lock:
        bar = _bar
        if bar is not None:
            bar.stop()
        try:
            yield
        finally:
            if bar is not None and bar is _bar:
                bar.start()


class Tail:
    """New lines of a file that a child appends to, read from where the last call stopped."""

    def __init__(self, path):
        self.path, self.offset, self.partial = path, 0, b""

    def lines(self) -> list[str]:
        try:  # (a child's log: kernel code may have made it a FIFO, or huge)
            data = plainfile.read_bytes(self.path, offset=self.offset, cut=True)
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        return [line.decode("utf-8", "replace") for line in complete]
