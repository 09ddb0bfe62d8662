"""A test-only in-place kernel on the CPU, copied over the scripted kernel's kernel.py by
tests/e2e/test_hooks.py: y += x (y is input 2, declared in INPLACE) and out = 2 x, on tensors.

Its knob "mode" makes it misbehave where only the timer can see it (the judge launches once):
  once       updates y on its first launch only, as if y then already held the result
  scribble   uses x as working memory: zeroes it after computing (x is not declared in-place)
"""

import math
import random

import torch

DEVICE = "cpu"
INPLACE = (2,)


def simulated_ms(knobs: dict, shape, n: int) -> float:
    """Its time, modelled (perfloop's test kernels): the timer's, never the launch's."""
    return 1.0 + 0.001 * math.sin(n)


def build(knobs: dict):
    mode = knobs.get("mode", "ok")
    calls = []

    def launch(inputs, out):
        _, x, y = inputs
        out.copy_(2 * x)
        if mode != "once" or not calls:
            y.add_(x)
        if mode == "scribble":
            x.zero_()
        calls.append(1)

    return launch


def make_inputs(shape, seed, device):
    rng = random.Random(seed)
    x, y = (torch.tensor([float(rng.randrange(-1000, 1000)) / 8 for _ in range(shape.dims[0])],
                         dtype=torch.float64) for _ in range(2))
    return (shape.name, x, y)


def empty_output(inputs):
    return torch.full_like(inputs[1], float("nan"))


def reference(shape, x, y):
    """The output, then the new value of each INPLACE input."""
    return (2 * x, y + x)


def traffic(shape):
    return 16 * shape.dims[0], 2 * shape.dims[0]
