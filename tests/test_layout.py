"""The package's layers, checked from its import graph (every import, lazy ones included):
no circles, at most 10 levels, and who may stand on what: the isolation machinery
(perfloop/isolation/) and the small core (perfloop/core/) import nothing of perfloop but
themselves, the contract kernels and judges import (perfloop/contract/) only core/, and the
code that runs beside kernel code (perfloop/child/) nothing from perfloop but itself, core/,
contract/ and isolation/."""

import ast
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "perfloop"
# public import paths kept for kernels and judges
ALIASES = {"perfloop.dispatch", "perfloop.autotune", "perfloop.correctness",
           "perfloop.playbook", "perfloop.kernel_tools",
           # their old paths in core/, which kernels' scripts were written against
           "perfloop.core.kernel", "perfloop.core.manifest", "perfloop.core.playbook",
           "perfloop.core.autotune"}


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


# who may stand on what: what each of these layers imports of perfloop besides itself (a
# module, or a layer and everything in it)
MAY_IMPORT = {
    "perfloop.isolation": (),   # starting and confining a child: stands on nothing of perfloop
    "perfloop.core": (),        # vocabulary, errors, atomic writes, naming, stats, ...
    "perfloop.contract": ("perfloop.core",),   # what kernels and judges import
    "perfloop.child": ("perfloop.core", "perfloop.contract", "perfloop.isolation"),
    # (and child/launcher: the module a launcher it forks runs)
    "perfloop.referee": ("perfloop.core", "perfloop.contract", "perfloop.isolation",
                         "perfloop.child.launcher"),
}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _outside(layer: str) -> dict[str, set[str]]:
    """{module of `layer`: what it imports that the layer may not}."""
    allowed = (layer, *MAY_IMPORT[layer])
    return {name: bad for name, deps in graph().items()
            if _within(name, layer) and name not in ALIASES
            and (bad := {d for d in deps if not any(_within(d, a) for a in allowed)})}


def test_isolation_imports_nothing_of_perfloop_but_itself():
    assert not _outside("perfloop.isolation")


def test_core_imports_nothing_above_it():
    assert not _outside("perfloop.core")


def test_the_contract_imports_only_core():
    assert not _outside("perfloop.contract")


def test_the_child_side_imports_only_itself_core_contract_and_isolation():
    assert not _outside("perfloop.child")


def test_the_referee_imports_no_layer_above_it_and_of_child_only_the_launcher():
    assert not _outside("perfloop.referee")


def test_referee_and_child_are_started_as_processes_never_imported_from_outside():
    """measure/ starts them by name; only a referee forks a launcher (child/launcher)."""
    for name, deps in graph().items():
        if not _within(name, "perfloop.referee"):
            assert not {d for d in deps if _within(d, "perfloop.referee")}, name
        if not _within(name, "perfloop.referee") and not _within(name, "perfloop.child"):
            assert not {d for d in deps if _within(d, "perfloop.child")}, name


def test_the_public_import_paths_are_the_modules_themselves():
    import importlib

    for alias in ALIASES:
        module = importlib.import_module(alias)
        assert module.__name__.startswith("perfloop.") and module.__name__ != alias


def test_the_kernel_contract_keeps_its_public_path():
    from perfloop import kernel
    from perfloop.contract import kernel as contract_kernel
    from perfloop.contract import manifest

    assert kernel.load_spec is manifest.load_spec
    assert kernel.triton_competitor is contract_kernel.triton_competitor
    assert kernel.Shape is contract_kernel.Shape


def test_the_old_core_paths_are_the_contracts_modules():
    from perfloop.contract import autotune, kernel, manifest, playbook
    from perfloop.core import autotune as old_autotune
    from perfloop.core import kernel as old_kernel
    from perfloop.core import manifest as old_manifest
    from perfloop.core import playbook as old_playbook
    from perfloop.core.kernel import import_module, read_knobs  # noqa: F401  (as scripts do)

    assert (old_autotune, old_kernel, old_manifest, old_playbook) == (autotune, kernel,
                                                                      manifest, playbook)
    assert old_kernel is kernel and old_playbook is playbook


def test_every_layer_is_packaged():
    """A folder missing from pyproject's package list is left out of a wheel (an editable
    install still finds it, so nothing else would notice)."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    folders = {"perfloop." + p.parent.name for p in (root / "perfloop").glob("*/__init__.py")}
    assert folders <= listed, folders - listed
