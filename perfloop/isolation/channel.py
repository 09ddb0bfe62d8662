"""Messages between the trusted timer and a launcher, over a pair of pipes.

Each message is a frame: 4 bytes of length, then the body. The trusted side sends pickles
(its slots of shared tensors travel that way; the launcher trusts its parent); the launcher
answers with JSON only, which the trusted side parses as data and never executes.
"""

from __future__ import annotations

import json
import os
import pickle
import select
import time


NO_ANSWER = "no answer in time"


class Closed(Exception):
    """The other end went away (it died), or did not answer in time (NO_ANSWER)."""


class Channel:
    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd

    def _write(self, body: bytes) -> None:
        data = len(body).to_bytes(4, "little") + body
        try:
            while data:
                data = data[os.write(self.write_fd, data):]
        except (BrokenPipeError, OSError) as exc:
            raise Closed(f"the other end is gone ({type(exc).__name__})") from None

    def _read(self, n: int, deadline: float | None) -> bytes:
        out = b""
        while len(out) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                    raise Closed(NO_ANSWER)
            chunk = os.read(self.read_fd, n - len(out))
            if not chunk:
                raise Closed("the other end is gone")
            out += chunk
        return out

    def _frame(self, timeout_s: float | None) -> bytes:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        size = int.from_bytes(self._read(4, deadline), "little")
        return self._read(size, deadline)

    # the trusted side
    def send_pickle(self, obj, pickler=None) -> None:
        self._write(bytes(pickler(obj)) if pickler else pickle.dumps(obj))

    def recv_json(self, timeout_s: float | None = None):
        body = self._frame(timeout_s)
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise Closed("an answer that is not JSON") from None

    # the launcher's side
    def send_json(self, obj) -> None:
        self._write(json.dumps(obj).encode())

    def recv_pickle(self, timeout_s: float | None = None):
        return pickle.loads(self._frame(timeout_s))
