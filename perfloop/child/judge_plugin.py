"""The judge's kernel pass: `pytest JUDGE -p perfloop.child.judge_plugin --perfloop-request FILE`.

It runs beside kernel code, so nothing it says can make a variant pass: perfloop.correctness
`check` delivers each case's output as data (a file per case), which the reference pass
(perfloop.referee.judge_plugin, no kernel code) compares. What this process reports at the
end (its audit) can only fail a variant or void the process: the tests that failed here and
the variants they belong to, how many of its cases ran to their end, every file it imported.
The request travels in a file named on the command line; nothing about it reaches the
kernel's environment, which is the same as the timing launchers'.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfloop.contract import judging
from perfloop.core.atomic import digest, write_json

REQUEST_DIGEST = ""          # of the request file's bytes as read (atomic.digest)
SELECTED: int | None = None  # the cases this process was given, after any shard's cut
COLLECTED = ""               # digest of every case collected, in order, before the cut
FINISHED = 0                 # the cases whose test ran to its end (passed, failed or skipped)
FAILED: dict = {}            # test id -> the variant label it judged (None: not known)


def pytest_addoption(parser):
    parser.addoption("--perfloop-request", default=None, help="perfloop's judging request (JSON)")


def pytest_configure(config):
    global REQUEST_DIGEST
    path = config.getoption("--perfloop-request")
    if path:
        from perfloop.isolation.lifeline import guard_parent, wait_for_task

        guard_parent()
        if not Path(path).exists():  # started ahead of its experiment (measure.judge)
            if not wait_for_task(Path(path)):
                pytest.exit("perfloop: no judging request came", returncode=3)
        raw = Path(path).read_bytes()
        judging.REQUEST, REQUEST_DIGEST = json.loads(raw), digest(raw)
        judging.MODE = judging.KERNEL
        _hide_pytest_from_the_environment()


def _hide_pytest_from_the_environment() -> None:
    """pytest announces itself in os.environ (PYTEST_VERSION, PYTEST_CURRENT_TEST); the timing
    launchers have neither."""
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
    shard = (judging.REQUEST or {}).get("shard")
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
    outcome = yield
    if judging.REQUEST and outcome.get_result().failed:
        FAILED[item.nodeid] = _label_of(item)


def _label_of(item) -> str | None:
    """The variant a test judged: the parameter that is one of the requested variants."""
    labels = {v["label"] for v in judging.REQUEST["variants"]}
    for value in getattr(getattr(item, "callspec", None), "params", {}).values():
        if isinstance(value, dict) and value.get("label") in labels:
            return value["label"]
    return None


def pytest_sessionfinish(session, exitstatus):
    """The audit: every file imported, the cases run, the tests that failed and whose."""
    request = judging.REQUEST
    if request and request.get("shard") and SELECTED == 0 and exitstatus == 5:
        session.exitstatus = 0  # a shard cut to nothing: nothing to judge, nothing failed
    if request and request.get("imports_out"):
        from perfloop.isolation.imports import imported_files

        write_json(Path(request["imports_out"]), {
            "imports": imported_files(), "selected": SELECTED, "finished": FINISHED,
            "request": REQUEST_DIGEST, "collected": COLLECTED, "failed": FAILED,
            "exitstatus": int(session.exitstatus)})
