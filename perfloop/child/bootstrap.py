"""Runs first in every judge and timing child, as `python -c <this file's text> ROOT MODE ARGS...`
(perfloop.measure.process.python builds the command line; it is never imported).

Modules whose source lies in the repository (not in the Python environment, even one inside
it) are compiled from their source, never from a cached .pyc, which anyone can plant with a
forged timestamp; pytest's cache of rewritten test modules is ignored the same way. MODE is
"pytest" (the judge) or a module to run as __main__ (a launcher, a warmer, the timer).
A child that runs kernel code is then confined (perfloop.isolation.sandbox) before anything else
runs: PERFLOOP_CONFINE, set by its parent, names where it may write and read.
"""

import importlib.machinery
import os
import site
import sys

root, mode = os.path.realpath(sys.argv[1]), sys.argv[2]
env = [os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, site.getusersitepackages(),
                                     *site.getsitepackages()}]
def repo_file(path):
    path = os.path.realpath(path)
    return path.startswith(root + os.sep) and not any(path.startswith(e + os.sep) for e in env)
class SourceOnly(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        return self.source_to_code(self.get_data(self.path), self.path)
class RepositorySource:
    @staticmethod
    def find_spec(name, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and (spec.origin or "").endswith(".py") and repo_file(spec.origin):
            spec.loader = SourceOnly(spec.name, spec.origin)
            return spec
        return None
sys.meta_path.insert(0, RepositorySource)
from perfloop.isolation import (
    sandbox,  # (compiled from its source, like every repository file)
)

confined = sandbox.apply_from_environ()
if confined:
    print(f"perfloop: confined: {confined}", flush=True)
if mode == "pytest":
    import _pytest.assertion.rewrite
    import pytest
    _pytest.assertion.rewrite._read_pyc = lambda *args, **kwargs: None
    sys.exit(pytest.main(sys.argv[3:]))
import runpy

sys.argv = [mode, *sys.argv[3:]]
runpy.run_module(mode, run_name="__main__", alter_sys=True)
