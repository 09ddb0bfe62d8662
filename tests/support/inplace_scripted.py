"""A test-only in-place kernel on the CPU, copied over the scripted kernel's kernel.py by
tests/test_hooks.py: y += x (y is input 2, declared in INPLACE) and out = 2 x.

Its knob "mode" makes it misbehave where only the timer can see it (the judge launches once):
  once       updates y on its first launch only, as if y then already held the result
  scribble   uses x as working memory: zeroes it after computing (x is not declared in-place)
"""

import math
import random

DEVICE = "cpu"
INPLACE = (2,)


class Clock:
    """The launch returns its latency; the clock reports it."""

    def time_batch(self, fn, reps, before=None):
        out = []
        for i in range(reps):
            if before is not None:
                before(i)
            out.append(fn())
        return out

    def describe(self):
        return {"clock": "scripted"}


def build(knobs: dict):
    mode = knobs.get("mode", "ok")
    calls = []

    def launch(inputs, out):
        _, x, y = inputs
        out[:] = [2 * v for v in x]
        if mode != "once" or not calls:
            y[:] = [a + b for a, b in zip(y, x)]
        if mode == "scribble":
            x[:] = [0.0] * len(x)
        calls.append(1)
        return 1.0 + 0.001 * math.sin(len(calls))

    return launch


def make_inputs(shape, seed, device):
    rng = random.Random(seed)
    x, y = ([float(rng.randrange(-1000, 1000)) / 8 for _ in range(shape.dims[0])]
            for _ in range(2))
    return (shape.name, x, y)


def empty_output(inputs):
    return [float("nan")] * len(inputs[1])


def reference(shape, x, y):
    """The output, then the new value of each INPLACE input."""
    return ([2 * v for v in x], [a + b for a, b in zip(y, x)])


def traffic(shape):
    return 16 * shape.dims[0], 2 * shape.dims[0]
