"""Keeping the judge the judge: nothing its process imports may have been changed or added
since the run was pinned.

Before a judge runs, the places Python and pytest import from inside the repository (the root,
which `python -m` puts first on sys.path; every directory from the root down to the judge,
where pytest loads conftest.py and which it puts on sys.path; PYTHONPATH entries inside the
repository) must hold no module that is untracked, ignored or modified: such a file could
shadow `perfloop`, `torch` or a conftest. After a judge or timing child has run, every file
it imported from inside the repository must be in the kernel folder under test, in one of
perfloop's own exports of a commit, or identical to the run's pinned base commit.
"""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path

import git

from perfloop.store import gitops

MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")


def import_dirs(root: Path, judge: Path) -> list[Path]:
    dirs = [root]
    for parent in reversed(judge.parents):
        if parent != root and root in parent.parents:
            dirs.append(parent)
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        path = Path(entry).resolve() if entry else None
        if path and (path == root or root in path.parents) and path not in dirs:
            dirs.append(path)
    return dirs


def _importable(entry: os.DirEntry) -> str | None:
    """The file that makes this directory entry importable, if it is a module or package."""
    if entry.name == "__pycache__" or entry.name.startswith("."):
        return None
    if entry.is_file() and entry.name.endswith(MODULE_SUFFIXES):
        return entry.path
    init = Path(entry.path) / "__init__.py"
    if entry.is_dir() and init.is_file():
        return str(init)
    return None


def unpinned_modules(repo: git.Repo, root: Path, judge: Path, base: str,
                     allowed: list[Path]) -> list[str]:
    """Modules (repository-relative) in the judge's import path that differ from `base`."""
    files = []
    for directory in import_dirs(root, judge):
        if not directory.is_dir():
            continue
        for entry in os.scandir(directory):
            path = _importable(entry)
            if path and not any(a == Path(path) or a in Path(path).parents for a in allowed):
                files.append(Path(path))
    return changed_files(repo, root, files, base)


def changed_files(repo: git.Repo, root: Path, files: list[Path], base: str) -> list[str]:
    """The files (inside root) whose content is not the one they have in commit `base`."""
    rels = sorted({f.resolve().relative_to(root).as_posix() for f in files
                   if f.resolve() == root or root in f.resolve().parents})
    existing = [r for r in rels if (root / r).is_file()]
    pinned = gitops.blob_ids(repo, base, existing)
    now = gitops.working_ids(repo, existing)
    return [r for r in existing if pinned.get(r) != now.get(r)]


def environment_dirs() -> list[Path]:
    """Where the Python environment lives (a virtualenv may sit inside the repository): what
    is installed there is the environment, not the repository's code."""
    return [Path(p).resolve() for p in {sys.prefix, sys.base_prefix, site.getusersitepackages(),
                                        *site.getsitepackages()}]


def unpinned_imports(repo: git.Repo, root: Path, imported: list[str], base: str,
                     allowed: list[Path]) -> list[str]:
    """Of the files a child imported, those inside the repository that are neither allowed
    (the kernel folder under test, perfloop's exports) nor identical to commit `base`."""
    env = environment_dirs()
    files = []
    for name in imported:
        path = Path(name)
        if path.suffix not in MODULE_SUFFIXES or not (root in path.parents):
            continue
        if any(a in path.parents for a in [*allowed, *env]):
            continue
        files.append(path)
    return changed_files(repo, root, files, base)


def perfloop_digest() -> str:
    """The digest of perfloop's own source files as installed: what a run pins when it starts,
    so that code which rewrote them (where no sandbox stopped it) is noticed."""
    import hashlib

    package = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()
