"""CUDA events that two processes share, through the driver API (libcuda, by ctypes: PyTorch's
own interprocess events fail to record once opened in another process).

The trusted timer brackets a launcher's batch with its own timing events: it records `go` on
its stream, the launcher's stream waits for `go`, launches, and records `done`; the timer's
stream waits for `done` before its closing event. Interprocess events cannot time, so every
time stamp is the trusted process's. A stream waits for the record of an event issued last
before the wait is issued (on the host), which is why the two sides exchange a message
between each record and the matching wait.
"""

from __future__ import annotations

import ctypes

CU_EVENT_DISABLE_TIMING, CU_EVENT_INTERPROCESS = 0x2, 0x4
_lib = None


def _cuda():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL("libcuda.so.1")
    return _lib


def _check(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what} failed: CUresult {result}")


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class IpcEvent:
    """An interprocess event: made here (handle() for the other process), or opened from the
    handle another process made. Use it after torch has made the device's context current."""

    def __init__(self, handle: bytes | None = None):
        self.event = ctypes.c_void_p()
        if handle is None:
            _check(_cuda().cuEventCreate(ctypes.byref(self.event),
                                         CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS),
                   "cuEventCreate")
        else:
            _check(_cuda().cuIpcOpenEventHandle(ctypes.byref(self.event),
                                                _Handle.from_buffer_copy(handle)),
                   "cuIpcOpenEventHandle")

    def handle(self) -> bytes:
        out = _Handle()
        _check(_cuda().cuIpcGetEventHandle(ctypes.byref(out), self.event), "cuIpcGetEventHandle")
        return bytes(out)

    def record(self, stream) -> None:
        """`stream`: a torch.cuda.Stream."""
        _check(_cuda().cuEventRecord(self.event, ctypes.c_void_p(stream.cuda_stream)),
               "cuEventRecord")

    def wait(self, stream) -> None:
        """Work issued on `stream` from now on waits for this event's last record."""
        _check(_cuda().cuStreamWaitEvent(ctypes.c_void_p(stream.cuda_stream), self.event, 0),
               "cuStreamWaitEvent")
