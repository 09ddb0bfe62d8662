"""perfloop's CLI as a person runs it (no --json), and the one-line error it must answer."""

import os
import subprocess
import sys

from conftest import pythonpath


def human(repo, *args):
    """The CLI without --json: the error must be one line on stderr."""
    proc = subprocess.run([sys.executable, "-m", "perfloop", *args], cwd=repo, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": pythonpath()})
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_line(stderr: str, *words: str):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perfloop: error: "), stderr
    assert "Traceback" not in stderr and all(w in lines[0] for w in words), stderr
