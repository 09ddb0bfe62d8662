"""One variant's launches, on command of the trusted timer: `python -m perfloop.child.launcher
READ_FD WRITE_FD` (perfloop.referee.timer starts it, one per variant).

This process runs kernel code, so it holds nothing that decides: no clock, no reference, no
other variant. It builds its variant, maps the slots of inputs and outputs the timer shares,
and on "batch" launches once per slot and answers. On a GPU its stream first waits for the
timer's `go` event and ends by recording `done`: the timer times the batch with its own events
around them. Between its turns the timer stops this process (SIGSTOP).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

from perfloop.contract import dispatch
from perfloop.isolation.channel import Channel, Closed
from perfloop.contract.kernel import import_module
from perfloop.isolation.lifeline import guard_parent
from perfloop.core.values import freeze


COMPILE_LIMIT = 1024   # torch.compile's compiles of one function (one per shape) kept


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def build(setup: dict):
    """The launcher of this variant: launch(inputs, out, *extra)."""
    kind = setup["kind"]
    if kind == "empty":   # the timer's own: its empty batches time the bracket alone
        return lambda inputs, out, *extra: None
    if kind == "kernel":
        module = import_module(setup["folder"], "variant")
        # routed by bucket as the loop decided, also where kernel.py's build ignores the table
        return dispatch.launcher(module, {k: freeze(v) for k, v in setup["knobs"].items()},
                                 Path(setup["folder"]))
    contract = import_module(setup["contract_folder"], "contract")
    if kind.startswith("competitor:"):
        other = contract.competitors()[kind.removeprefix("competitor:")]
        return lambda inputs, out, *extra: other(*inputs)
    if kind == "eager":
        return lambda inputs, out, *extra: contract.reference(*inputs)
    if kind == "compile":  # compiled once per shape, dynamic=False, as for a fixed shape
        import torch
        import torch._dynamo

        # Every shape's compile guards the same code object: past dynamo's recompile limit
        # (8) a further shape would silently run uncompiled, so lift it (a bench of 9 or
        # more shapes, as softmax's with its held-out ones, passes it).
        for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name),
                                                        COMPILE_LIMIT))
        compiled: dict = {}

        def launch(inputs, out, *extra):
            key = tuple((tuple(x.shape), x.dtype) if hasattr(x, "shape") else x for x in inputs)
            if key not in compiled:
                compiled[key] = torch.compile(contract.reference, dynamic=False)
            return compiled[key](*inputs)
        return launch
    raise ValueError(f"unknown launcher kind {kind!r}")


class Server:
    def __init__(self, channel: Channel, setup: dict):
        self.channel, self.setup = channel, setup
        self.slots: list = []
        self.gpu = setup["device"] == "cuda"
        self.launch = build(setup)
        if self.gpu:
            import torch

            from perfloop.isolation.gpu_ipc import IpcEvent

            torch.zeros(1, device="cuda")  # the context, before the events are opened
            self.stream = torch.cuda.Stream()
            self.go, self.done = (IpcEvent(setup["events"][k]) for k in ("go", "done"))

    def _launch(self, i: int) -> None:
        inputs, out, extra = self.slots[i]
        self.launch(inputs, out, *extra)

    def run_batch(self, n: int) -> dict:
        t0 = time.perf_counter()
        if not self.gpu:
            for i in range(n):
                self._launch(i)
            return {"done": True, "host_s": time.perf_counter() - t0}
        import torch

        self.go.wait(self.stream)
        with torch.cuda.stream(self.stream):
            for i in range(n):
                self._launch(i)
        self.done.record(self.stream)
        return {"recorded": True, "host_s": time.perf_counter() - t0}

    def prime(self) -> dict:
        """The first launch (compiling, loading) at a shape, waited for, never timed."""
        if self.gpu:
            import torch

            with torch.cuda.stream(self.stream):
                self._launch(0)
            self.stream.synchronize()
        else:
            self._launch(0)
        return {"primed": True}

    def serve(self) -> None:
        while True:
            try:
                message = self.channel.recv_pickle()
            except Closed:
                return
            except Exception as exc:  # (a message it could not read: say so, go on)
                traceback.print_exc()
                self.channel.send_json({"raised": f"could not read its task: {_one_line(exc)}"})
                continue
            op = message["op"]
            if op == "quit":
                return
            try:
                if op == "slots":
                    self.slots = message["slots"]
                    answer = {"ok": True}
                elif op == "prime":
                    answer = self.prime()
                else:
                    answer = self.run_batch(message["n"])
            except Exception as exc:
                answer = {"raised": f"raised while timed: {_one_line(exc)}"}
            self.channel.send_json(answer)


def main(read_fd: int, write_fd: int) -> int:
    guard_parent()
    channel = Channel(read_fd, write_fd)
    try:
        setup = channel.recv_pickle(timeout_s=3600)
    except Closed:
        return 3
    try:
        server = Server(channel, setup)
    except Exception as exc:
        traceback.print_exc()
        channel.send_json({"failed": f"could not be built: {_one_line(exc)}"})
        return 0
    channel.send_json({"built": True, "pid": os.getpid()})
    server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
