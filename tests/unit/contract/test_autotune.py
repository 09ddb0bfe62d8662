"""The autotune layer without a GPU: the search, the kernel and the launch are fakes."""

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import ROOT

from perfloop.contract import autotune
from perfloop.contract.autotune import (
    AutotuneError,
    Autotuner,
    DiskCache,
    prepare_space,
    space_for,
)

IDENTITY = {"kernel": "k", "source_sha256": "abc", "gpu": "NVIDIA H200", "arch": "sm_90",
            "cutile": "1.7.0", "tileiras": "release 13.4", "key": "((4096, 11008), 'bf16')",
            "space": [{"occupancy": None}, {"occupancy": 1}, {"occupancy": 2}]}


class FakeKernel:
    def __init__(self, hints=None):
        self.hints, self.replaced = hints or {}, []

    def replace_hints(self, **hints):
        self.replaced.append(hints)
        return FakeKernel(hints)


class FakeSearch:
    """Records what it was given; the last config 'wins'."""

    def __init__(self):
        self.calls = []

    def __call__(self, space, stream, grid_fn, kernel, args_fn, hints_fn, quiet):
        self.calls.append(space)
        measured = [SimpleNamespace(config=c, mean_us=10.0 - i, error_margin_us=0.1)
                    for i, c in enumerate(space)]
        return SimpleNamespace(best=measured[-1], successes=measured)


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    for var in autotune.DISABLE_VARS:
        monkeypatch.delenv(var, raising=False)
    autotune._memory.clear()


def tuner(tmp_path, space=({"occupancy": 1}, {"occupancy": 2}), **kw):
    search, launched = FakeSearch(), []
    t = Autotuner(FakeKernel(), space=space, fixed={"occupancy": None}, name="k", source=b"src",
                  cache=DiskCache(tmp_path / "cache"), search=search,
                  launch=lambda stream, grid, kern, args: launched.append((grid, kern.hints, args)),
                  identify=lambda key: {**IDENTITY, "key": repr(key), "space": t.space}, **kw)
    return t, search, launched


def go(t, key="shape-a"):
    return t.launch("stream", key, grid_fn=lambda cfg: (7,), args_fn=lambda cfg: ("x", cfg["occupancy"]))


def test_more_than_30_configs_are_refused_with_a_clear_message():
    assert len(prepare_space([{"occupancy": i} for i in range(1, 30)], {"occupancy": None})) == 30
    with pytest.raises(AutotuneError, match="31 configs .* the limit is 30"):
        prepare_space([{"occupancy": i} for i in range(1, 31)], {"occupancy": None})


def test_the_fixed_config_is_always_in_the_space_once_and_first():
    assert prepare_space([{"occupancy": 2}, {"occupancy": 4}], {"occupancy": 4}) == \
        [{"occupancy": 4}, {"occupancy": 2}]
    assert prepare_space([{"occupancy": 2}], {"occupancy": None})[0] == {"occupancy": None}


def test_a_generator_is_accepted_and_the_search_gets_a_list(tmp_path):
    t, search, _ = tuner(tmp_path, space=({"occupancy": o} for o in (1, 2, 4)))
    go(t)
    assert type(search.calls[0]) is list and len(search.calls[0]) == 4


def test_tune_once_then_launch_from_memory_with_one_replace_hints_per_config(tmp_path):
    t, search, launched = tuner(tmp_path)
    assert go(t) == {"occupancy": 2} and go(t) == {"occupancy": 2}
    assert len(search.calls) == 1 and t.searches == 1
    assert t.kernel.replaced == [{"occupancy": 2}]          # once, not per launch
    assert launched == [((7,), {"occupancy": 2}, ("x", 2))] * 2
    go(t, key="shape-b")                                       # another key searches again
    assert t.searches == 2 and t.kernel.replaced == [{"occupancy": 2}]
    other, other_search, _ = tuner(tmp_path)                  # a new tuner, same process
    go(other)
    assert other_search.calls == []


def test_a_second_process_finds_the_winner_on_disk(tmp_path):
    t, _, _ = tuner(tmp_path)
    go(t)
    autotune._memory.clear()                                   # what a new process starts with
    fresh, search, launched = tuner(tmp_path)
    assert go(fresh) == {"occupancy": 2} and search.calls == []


def test_split_buffer_arguments_are_used_for_the_search_only(tmp_path):
    seen = []
    t, search, launched = tuner(tmp_path)
    t._search = lambda space, stream, grid_fn, kernel, args_fn, hints_fn, quiet: (
        seen.append(args_fn(space[0])) or FakeSearch()(space, stream, grid_fn, kernel, args_fn,
                                                       hints_fn, quiet))
    t.launch("s", "k", grid_fn=lambda c: (1,), args_fn=lambda c: ("x", "x"),
             search_args_fn=lambda c: ("x", "scratch"))
    assert seen == [("x", "scratch")] and launched[0][2] == ("x", "x")


@pytest.mark.parametrize("var", autotune.DISABLE_VARS)
def test_disable_autotune_launches_the_fixed_config_without_searching(tmp_path, monkeypatch, var):
    monkeypatch.setenv(var, "1")
    t, search, launched = tuner(tmp_path)
    t._search = lambda *a, **k: pytest.fail("the search must not run")
    assert go(t) == {"occupancy": None} and go(t) == {"occupancy": None}
    assert launched[0][1] == {} and not list((tmp_path / "cache").glob("*"))


def test_cache_keys_differ_by_what_decides_the_winner(tmp_path):
    cache = DiskCache(tmp_path)
    assert cache.path(IDENTITY) == cache.path(dict(IDENTITY))
    assert cache.path(IDENTITY) != cache.path({**IDENTITY, "key": "((4096, 11008), 'fp16')"})


@pytest.mark.parametrize("field", ["gpu", "arch", "cutile", "tileiras", "source_sha256", "key",
                                   "kernel", "space"])
def test_disk_entry_is_invalidated_by_a_change_of_any_field(tmp_path, field):
    cache = DiskCache(tmp_path)
    cache.put(IDENTITY, {"occupancy": 2}, {})
    assert cache.get(IDENTITY) == {"occupancy": 2}
    changed = {**IDENTITY, field: [{"occupancy": 4}] if field == "space" else "other"}
    assert cache.get(changed) is None


def test_an_entry_whose_config_left_the_space_is_ignored(tmp_path):
    cache = DiskCache(tmp_path)
    cache.put(IDENTITY, {"occupancy": 16}, {})
    assert cache.get(IDENTITY) is None


WRITER = """
import sys, time, os
sys.path.insert(0, {root!r})
import perfloop.core.atomic as atomic
from perfloop.contract.autotune import DiskCache
atomic.os.fsync = lambda fd: (open({marker!r}, "w").close(), time.sleep(60))
DiskCache({cache!r}).put(json_ident, {{"occupancy": 8}}, {{"pad": "x" * 1000000}})
"""


def test_a_killed_writer_leaves_the_old_entry_whole_and_no_half_file(tmp_path):
    cache = DiskCache(tmp_path / "cache")
    cache.put(IDENTITY, {"occupancy": 2}, {})
    marker = tmp_path / "writing"
    code = "json_ident = " + json.dumps(IDENTITY).replace("null", "None") + "\n" + \
        WRITER.format(root=str(ROOT), marker=str(marker), cache=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), "the writer never reached the write"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert cache.get(IDENTITY) == {"occupancy": 2}             # the old entry, whole
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")] == \
        [cache.path(IDENTITY).name]                             # only a hidden temp file beside it


def measured(config, mean_us, margin=0.1):
    return SimpleNamespace(config=config, mean_us=mean_us, error_margin_us=margin)


def test_the_fixed_config_stays_unless_beaten_beyond_the_error_margins():
    fixed, other = {"occupancy": None}, {"occupancy": 1}

    def result(fixed_us, other_us, margin):
        a, b = measured(fixed, fixed_us, margin), measured(other, other_us, margin)
        return SimpleNamespace(best=min(a, b, key=lambda m: m.mean_us), successes=[a, b])

    assert autotune.prefer_fixed(result(100.0, 99.9, 0.2), fixed) == fixed    # inside the noise
    assert autotune.prefer_fixed(result(100.0, 99.0, 0.2), fixed) == other    # beyond it
    assert autotune.prefer_fixed(result(100.0, 101.0, 0.2), fixed) == fixed   # fixed is best


def test_spaces_per_class_and_architecture():
    assert space_for("memory-bound", (9, 0)) == [{"occupancy": o} for o in (1, 2, 4, 8)]
    hopper = space_for("compute-bound", (9, 0))
    ampere = space_for("compute-bound", (8, 0))
    assert {c["num_ctas"] for c in hopper} == {1, 2} and all("num_ctas" not in c for c in ampere)
    assert len(hopper) <= 30
    big = {"space": {"memory-bound": {"occupancy": list(range(1, 33))}}, "arch": {}}
    with pytest.raises(AutotuneError, match="limit is 30"):
        space_for("memory-bound", (9, 0), big)


def test_a_cache_that_cannot_be_written_says_so_and_the_launch_goes_on(tmp_path):
    """A confined child may not write the cache PERFLOOP_AUTOTUNE_CACHE names: the winner is
    then kept for the process, never a crash of the launch."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    cache = DiskCache(blocked)      # a file where the directory should be
    ident = {"kernel": "k", "key": "x", "space": ["a"]}
    with pytest.warns(UserWarning, match="cannot be written"):
        cache.put(ident, "a", {})
    assert cache.get(ident) is None
