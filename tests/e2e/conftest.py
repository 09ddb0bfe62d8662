"""Every test in this folder runs perfloop's commands end to end in a scratch repository: a
judge and a timer with their children for each experiment (15-30 CPU seconds on the 2-core CPU
machine). So each is `slow` (`-m slow` runs them; CI runs both) unless marked `smoke`, which
the default run keeps."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # (before -m deselects by marker)
def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.resolve().is_relative_to(HERE) and not item.get_closest_marker("smoke"):
            item.add_marker(pytest.mark.slow)
