"""The pytest plugin through which the loop runs a judge: `pytest JUDGE -p perfloop.child.judge_plugin
--perfloop-request FILE`. The request (a JSON file) names the variants to judge and where to
log each case; nothing about it reaches the kernel's environment, which is the same as the
timing child's. At the end of the session the plugin writes down every file the judge
imported, so the loop can check that none of them was changed behind its back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest  # the judge's plugin only: the timing worker must not load pytest (kernel

# code could tell the phases apart by it), so it imports nothing from here
from _pytest import outcomes, skipping

from perfloop.core.atomic import digest

REQUEST: dict | None = None
REQUEST_DIGEST = ""          # of the request file's bytes as read (atomic.digest)
SELECTED: int | None = None  # the cases this process was given, after any shard's cut
COLLECTED = ""               # digest of every case collected, in order, before the cut
FINISHED = 0                 # the cases whose test ran to its end (passed, failed or skipped)
SKIPPED_RUNNING = 0          # tests skipped (or xfailed) by code, in their body or a fixture
_BEFORE: dict = {}  # perfloop's judging functions as they were before any kernel code ran


def pytest_addoption(parser):
    parser.addoption("--perfloop-request", default=None, help="perfloop's judging request (JSON)")


def pytest_configure(config):
    global REQUEST, REQUEST_DIGEST
    path = config.getoption("--perfloop-request")
    if path:
        from perfloop.child import tamper
        from perfloop.child.lifeline import guard_parent, wait_for_task

        guard_parent()
        if not Path(path).exists():  # started ahead of its experiment (phases.JudgePool)
            if not wait_for_task(Path(path)):
                pytest.exit("perfloop: no judging request came", returncode=3)
        raw = Path(path).read_bytes()
        REQUEST, REQUEST_DIGEST = json.loads(raw), digest(raw)
        _hide_pytest_from_the_environment()
        _BEFORE.update(tamper.snapshot(modules=tamper.JUDGE_MODULES))


def _hide_pytest_from_the_environment() -> None:
    """pytest announces itself in os.environ (PYTEST_VERSION, PYTEST_CURRENT_TEST); the timing
    worker has neither, so kernel code could tell the phases apart by them."""
    import os

    import _pytest.runner

    os.environ.pop("PYTEST_VERSION", None)
    if hasattr(_pytest.runner, "_update_current_test_var"):
        _pytest.runner._update_current_test_var = lambda item, when: None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """A shard [k, m] of the request keeps the k-th of m contiguous runs of the collected
    cases; the loop judges one variant in m processes that way."""
    global SELECTED, COLLECTED
    COLLECTED = digest("\n".join(item.nodeid for item in items).encode())
    shard = (REQUEST or {}).get("shard")
    if shard:
        k, m = shard
        keep = items[k * len(items) // m:(k + 1) * len(items) // m]
        kept = set(map(id, keep))
        dropped = [item for item in items if id(item) not in kept]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    SELECTED = len(items)


def pytest_runtest_logfinish(nodeid, location):
    global FINISHED
    FINISHED += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that skips itself (pytest.skip or pytest.xfail called in its body or in a
    fixture, as a judge that builds the kernel in a fixture does) may have been skipped by
    kernel code, which can see that pytest is loaded: the judge's own skips are marks."""
    global SKIPPED_RUNNING
    outcome = yield
    if outcome.get_result().skipped and not _by_a_mark(item, call):
        SKIPPED_RUNNING += 1


def _by_a_mark(item, call) -> bool:
    """Whether a skipped report comes from the item's skip, skipif or xfail marks: a skip
    mark in force at setup, an xfail(run=False) mark, or a failure an xfail mark expected."""
    error = call.excinfo.value if call.excinfo is not None else None
    if call.when == "setup":
        if isinstance(error, outcomes.XFailed):
            xfail = skipping.evaluate_xfail_marks(item)
            return xfail is not None and not xfail.run
        return isinstance(error, outcomes.Skipped) and skipping.evaluate_skip_marks(item) is not None
    return (call.when == "call" and item.get_closest_marker("xfail") is not None
            and not isinstance(error, (outcomes.Skipped, outcomes.XFailed)))


def pytest_sessionfinish(session, exitstatus):
    """What the loop checks after the judge: every file it imported, whether code that ran in
    it replaced perfloop's judging functions, and whether every case it was given ran to its
    end (kernel code that ends the process early, e.g. with os._exit(0) or pytest.exit, must
    not leave its later cases unjudged)."""
    if REQUEST and REQUEST.get("shard") and SELECTED == 0 and exitstatus == 5:
        session.exitstatus = 0  # a shard cut to nothing: nothing to judge, nothing failed
    if REQUEST and REQUEST.get("imports_out"):
        from perfloop.child import tamper

        Path(REQUEST["imports_out"]).write_text(json.dumps(
            {"imports": tamper.imported_files(), "selected": SELECTED, "finished": FINISHED,
             "skipped_running": SKIPPED_RUNNING, "request": REQUEST_DIGEST,
             "collected": COLLECTED,
             "tampered": tamper.changed(_BEFORE, modules=tamper.JUDGE_MODULES)}))
