"""The pytest plugin through which the loop runs a judge: `pytest JUDGE -p perfloop.judging
--perfloop-request FILE`. The request (a JSON file) names the variants to judge and where to
log each case; nothing about it reaches the kernel's environment, which is the same as the
timing child's. At the end of the session the plugin writes down every file the judge
imported, so the loop can check that none of them was changed behind its back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REQUEST: dict | None = None
_BEFORE: dict = {}  # perfloop's judging functions as they were before any kernel code ran


def pytest_addoption(parser):
    parser.addoption("--perfloop-request", default=None, help="perfloop's judging request (JSON)")


def pytest_configure(config):
    global REQUEST
    path = config.getoption("--perfloop-request")
    if path:
        from perfloop import tamper
        from perfloop.child import guard_parent

        guard_parent()
        REQUEST = json.loads(Path(path).read_text())
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


def pytest_sessionfinish(session, exitstatus):
    """What the loop checks after the judge: every file it imported, and whether code that ran
    in it replaced perfloop's judging functions."""
    if REQUEST and REQUEST.get("imports_out"):
        from perfloop import tamper

        Path(REQUEST["imports_out"]).write_text(json.dumps(
            {"imports": imported_files(),
             "tampered": tamper.changed(_BEFORE, modules=tamper.JUDGE_MODULES)}))


def imported_files() -> list[str]:
    """Source files of every module loaded in this process."""
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path:
            files.add(str(Path(path).resolve()))
    return sorted(files)
