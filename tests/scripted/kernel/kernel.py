"""A test-only kernel: it doubles a list, and its 'latency' is scripted in script.json.

The knob "mode" makes it misbehave, the way a buggy kernel or an agent gaming the judge would.
None of it depends on being told the phase (perfloop tells nobody); the faults key on what a
kernel can see for itself: how often a built launcher was called and how large its input is.
  wrong            triples instead of doubling
  crash / hang     on every launch
  crash-after-N    SIGSEGV / sleep forever from the (N+1)-th launch of one built launcher: the
  hang-after-N     judge builds a launcher per case and calls it once; the timer calls it often
  wrong-above-N    triples inputs longer than N (the judge's cases are at most 1000 long)
  skip-above-N     writes only the first half of inputs longer than N
  cache            computes once, then returns without writing
  memo             remembers results by input content: repeated inputs cost a tenth
  sniff            correct only when pytest is loaded (judged), wrong otherwise (timed)
  tamper           replaces perfloop's batch timer with one that reports half the time
  tamper-judge     replaces perfloop's output comparison with one that always passes
  env              writes its environment to $SCRIPTED_ENV_DUMP/<pid>.json, then doubles
  compile-error    raises when built, as a kernel that fails to compile does
  exit-at-N        ends the process with status 0 (os._exit) when given exactly N values: a
                   size the judge has and the timer has not, so its later cases never run
  skip-at-N        calls pytest.skip when given exactly N values and pytest is loaded (judged)
  stop-at-N        calls pytest.exit(returncode=0) there: pytest ends its session cleanly
Calls dispatch per bucket (perfloop.dispatch): "big" for inputs of 600 values or more.
SCRIPTED_DELAY_S slows every launch down, so a test can interrupt a timing in progress.
"""

import itertools
import json
import math
import os
import random
import signal
import sys
import time
from pathlib import Path

from perfloop import dispatch

DEVICE = "cpu"
SCRIPT = json.loads((Path(__file__).parent / "script.json").read_text())


def _freeze(v):
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v


class Clock:
    """The launch returns its scripted latency; the clock reports it."""

    def time_batch(self, fn, reps, before=None):
        out = []
        for i in range(reps):
            if before is not None:
                before(i)
            out.append(fn())
        return out

    def describe(self):
        return {"clock": "scripted"}


def latency(knobs: dict, shape: str, n: int) -> float:
    ms = SCRIPT["base_ms"].get(shape, 1.0)
    for effect in SCRIPT["effects"]:
        if all(knobs.get(k) == _freeze(v) for k, v in effect["when"].items()):
            ms *= effect["factor"].get(shape, effect["factor"].get("*", 1.0))
    return ms * (1 + SCRIPT["jitter"] * math.sin(n))


def _threshold(mode: str, prefix: str) -> int | None:
    return int(mode[len(prefix):]) if mode.startswith(prefix) else None


def bucket(inputs) -> str:
    return "big" if len(inputs[1]) >= 600 else "small"


def build(knobs: dict):
    return dispatch.build(knobs, _build_one, bucket)


def _build_one(knobs: dict):
    mode = knobs.get("mode", "ok")
    if mode == "compile-error":
        raise RuntimeError("tileiras: error: register allocation failed")
    delay = float(os.environ.get("SCRIPTED_DELAY_S", "0"))
    counter = itertools.count()
    seen: set = set()
    if mode == "tamper-judge" and "perfloop.core.outputs" in sys.modules:
        sys.modules["perfloop.core.outputs"].compare = lambda *args, **kw: {"passed": True}
    if mode == "tamper" and "perfloop.child.clock" in sys.modules:
        m = sys.modules["perfloop.child.clock"]
        real = m._batch
        m._batch = lambda *args, **kw: [t / 2 for t in real(*args, **kw)]
    if mode == "env" and os.environ.get("SCRIPTED_ENV_DUMP"):
        dump = Path(os.environ["SCRIPTED_ENV_DUMP"]) / f"{os.getpid()}.json"
        dump.write_text(json.dumps(dict(os.environ), sort_keys=True))

    def launch(inputs, out):
        calls = next(counter)
        after_crash, after_hang = _threshold(mode, "crash-after-"), _threshold(mode, "hang-after-")
        if mode == "crash" or after_crash is not None and calls >= after_crash:
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "hang" or after_hang is not None and calls >= after_hang:
            time.sleep(3600)
        if delay:
            time.sleep(delay)
        shape, values = inputs
        if _threshold(mode, "exit-at-") == len(values):
            os._exit(0)
        if _threshold(mode, "skip-at-") == len(values) and "pytest" in sys.modules:
            sys.modules["pytest"].skip("not this one")
        if _threshold(mode, "stop-at-") == len(values) and "pytest" in sys.modules:
            sys.modules["pytest"].exit("done", returncode=0)
        factor = 2
        if mode == "wrong" or mode == "sniff" and "pytest" not in sys.modules:
            factor = 3
        wrong_above, skip_above = _threshold(mode, "wrong-above-"), _threshold(mode, "skip-above-")
        if wrong_above is not None and len(values) > wrong_above:
            factor = 3
        ms = latency(knobs, shape, calls)
        if mode == "cache" and calls > 0:
            return ms * 0.5
        if mode == "memo":
            key = tuple(values)
            if key in seen:
                return ms * 0.1
            seen.add(key)
        written = len(values) // 2 if skip_above is not None and len(values) > skip_above else len(values)
        out[:written] = [v * factor for v in values[:written]]
        return ms

    return launch


def make_inputs(shape, seed, device):
    rng = random.Random(seed)
    return (shape.name, [float(rng.randrange(-1000, 1000)) / 8 for _ in range(shape.dims[0])])


def empty_output(inputs):
    return [float("nan")] * len(inputs[1])


def reference(shape, values):
    return [2 * v for v in values]


def traffic(shape):
    return 12 * shape.dims[0], 2 * shape.dims[0]   # bytes, flops: memory-bound
