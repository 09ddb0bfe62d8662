"""Noticing kernel code that replaces the functions which time and check it.

Kernel code runs in the timing process (and in the judge's), so it could monkeypatch the
clock, the output check or the result writer. A snapshot of those functions is taken before
any kernel code is imported and compared after every import and every timed batch (in the
judge: once, at the end); a difference names the variant whose code ran last. This stops
the plain attack (assigning a new function), not code that rewrites memory through ctypes:
against that, only the checks that run in the parent (statistics, the physical floor, the
judge in its own process) stand.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

WATCHED_MODULES = ("perfloop.child.clock", "perfloop.core.outputs", "perfloop.child.timer", "perfloop.core.atomic",
                   "perfloop.child.streams", "perfloop.child.tamper")
JUDGE_MODULES = ("perfloop.child.judge_api", "perfloop.core.outputs", "perfloop.child.judge_plugin", "perfloop.child.tamper")
WATCHED_OBJECTS = {"builtins": builtins, "json": json, "os": os, "time": time,
                   "random": random, "statistics": statistics}
WATCHED_NAMES = {"builtins": ("open",), "json": ("dumps", "dump"), "os": ("replace", "fsync"),
                 "time": ("perf_counter", "monotonic"), "random": ("Random",),
                 "statistics": ("median",)}


def _members(obj, prefix: str) -> dict:
    out = {}
    for name, value in vars(obj).items():
        if name.startswith("__") or not (callable(value) or isinstance(value, (staticmethod,
                                                                               classmethod))):
            continue
        out[f"{prefix}.{name}"] = id(value)
        if inspect.isclass(value) and value.__module__ == getattr(obj, "__name__", None):
            out.update(_members(value, f"{prefix}.{name}"))
    return out


def snapshot(extra: dict | None = None, modules: tuple = WATCHED_MODULES) -> dict:
    """ids of every function and method of perfloop's timing (or judging) modules, of the
    library functions they call, and of `extra` {name: object} (e.g. torch's event and sync)."""
    ids = {}
    for name in modules:
        ids.update(_members(importlib.import_module(name), name))
    for mod, names in WATCHED_NAMES.items():
        for attr in names:
            ids[f"{mod}.{attr}"] = id(getattr(WATCHED_OBJECTS[mod], attr))
    for name, obj in (extra or {}).items():
        ids[name] = id(obj)
    return ids


def changed(before: dict, extra_now: dict | None = None,
            modules: tuple = WATCHED_MODULES) -> list[str]:
    """Names whose object is no longer the one in `before`."""
    now = snapshot(extra_now, modules)
    return sorted(name for name, ident in before.items() if now.get(name) != ident)


def imported_files() -> list[str]:
    """Source files of every module loaded in this process (what the loop compares with the
    run's base commit after the judge and the timer)."""
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path:
            files.add(str(Path(path).resolve()))
    return sorted(files)
