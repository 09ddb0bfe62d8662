"""The package's layers, checked from its import graph (every import, lazy ones included):
no circles, at most 10 levels, and the code that runs beside kernel code (perfloop/child/)
imports nothing from perfloop but itself and perfloop/core/."""

import ast
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "perfloop"
# public import paths kept for kernels and judges
ALIASES = {"perfloop.dispatch", "perfloop.autotune", "perfloop.correctness",
           "perfloop.playbook", "perfloop.kernel_tools"}


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph() -> dict[str, set[str]]:
    modules = {_name(p): p for p in PACKAGE.rglob("*.py")}
    out = {}
    for name, path in modules.items():
        deps = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                    + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        out[name] = {d for d in deps if not (d == "perfloop" or d.count(".") == 1 and
                                              modules[d].name == "__init__.py")}
    return out


def test_no_module_imports_itself_back():
    g = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node, path):
        state[node] = 1
        for dep in sorted(g[node]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep] if dep in path else [node, dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_at_most_ten_import_levels():
    g = graph()

    @lru_cache(None)
    def depth(node):
        return 1 + max((depth(d) for d in g[node]), default=0)

    deepest = max(g, key=depth)
    assert depth(deepest) <= 10, (deepest, depth(deepest))


def test_the_child_side_imports_only_itself_and_core():
    g = graph()
    for name, deps in g.items():
        if name.startswith("perfloop.child."):
            outside = {d for d in deps if not d.startswith(("perfloop.child", "perfloop.core"))}
            assert not outside, (name, outside)


def test_core_imports_nothing_above_it():
    g = graph()
    for name, deps in g.items():
        if name.startswith("perfloop.core."):
            assert all(d.startswith("perfloop.core") for d in deps), (name, deps)


def test_the_public_import_paths_are_the_modules_themselves():
    import importlib

    for alias in ALIASES:
        module = importlib.import_module(alias)
        assert module.__name__.startswith("perfloop.") and module.__name__ != alias


def test_the_kernel_contract_keeps_its_public_path():
    from perfloop import kernel
    from perfloop.core import kernel as core_kernel
    from perfloop.core import manifest

    assert kernel.load_spec is manifest.load_spec
    assert kernel.triton_competitor is core_kernel.triton_competitor
    assert kernel.Shape is core_kernel.Shape


def test_every_layer_is_packaged():
    """A folder missing from pyproject's package list is left out of a wheel (an editable
    install still finds it, so nothing else would notice)."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    folders = {"perfloop." + p.parent.name for p in (root / "perfloop").glob("*/__init__.py")}
    assert folders <= listed, folders - listed
