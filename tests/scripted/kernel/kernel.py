"""A test-only kernel: it doubles a list, and its 'latency' is scripted in script.json.

Knob "mode" injects faults: "wrong" (triples instead), "crash"/"hang" (in any phase), or
"crash-timing"/"hang-timing"/"crash-correctness"/... for one phase only. SCRIPTED_DELAY_S
slows every timed launch down, so a test can interrupt a timing in progress.
"""

import itertools
import json
import math
import os
import signal
import time
from pathlib import Path

DEVICE = "cpu"
SCRIPT = json.loads((Path(__file__).parent / "script.json").read_text())


def _freeze(v):
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v


class Clock:
    """The launch returns its scripted latency; the clock reports it."""

    def time_batch(self, fn, reps):
        return [fn() for _ in range(reps)]

    def describe(self):
        return {"clock": "scripted"}


def latency(knobs: dict, shape: str, n: int) -> float:
    ms = SCRIPT["base_ms"].get(shape, 1.0)
    for effect in SCRIPT["effects"]:
        if all(knobs.get(k) == _freeze(v) for k, v in effect["when"].items()):
            ms *= effect["factor"].get(shape, effect["factor"].get("*", 1.0))
    return ms * (1 + SCRIPT["jitter"] * math.sin(n))


def build(knobs: dict):
    mode = knobs.get("mode", "ok")
    phase = os.environ.get("PERFLOOP_PHASE", "")
    delay = float(os.environ.get("SCRIPTED_DELAY_S", "0")) if phase == "timing" else 0.0
    counter = itertools.count()

    def launch(inputs, out):
        if mode in ("crash", f"crash-{phase}"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode in ("hang", f"hang-{phase}"):
            time.sleep(3600)
        time.sleep(delay)
        shape, values = inputs
        out[:] = [v * (3 if mode == "wrong" else 2) for v in values]
        return latency(knobs, shape, next(counter))

    return launch


def make_inputs(shape, seed, device):
    return (shape.name, [float((i * 7 + seed) % 13) for i in range(shape.dims[0])])


def empty_output(inputs):
    return [float("nan")] * len(inputs[1])


def reference(shape, values):
    return [2 * v for v in values]


def traffic(shape):
    return 12 * shape.dims[0], 2 * shape.dims[0]   # bytes, flops: memory-bound
