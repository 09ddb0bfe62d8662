import os
import sys

# `python -m perfloop` puts the current directory first on sys.path, so a file there named like
# a module perfloop imports (random.py, json.py) would replace it. perfloop is loaded by now.
_here = os.getcwd()
sys.path[:] = [p for p in sys.path if p not in ("", ".", _here)]

from perfloop.cli import main  # noqa: E402

if __name__ == "__main__":   # (a fleet's worker processes start by importing this module)
    raise SystemExit(main())
