"""The old import paths of the modules that moved to perfloop.contract and that kernels' scripts
were written against (perfloop.core.kernel, ...): each is the contract's module itself, as the
public paths at the top are (perfloop/dispatch.py). Found by name, so no file stands in core/."""

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = ("autotune", "kernel", "manifest", "playbook")


class _OldPath(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        package, _, module = name.rpartition(".")
        if package == __name__ and module in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        moved = importlib.import_module("perfloop.contract." + module.__name__.rpartition(".")[2])
        sys.modules[module.__name__] = moved


sys.meta_path.append(_OldPath())
