"""The run's pinned tree: the judge and the contract as the run's base commit holds them,
written once under sandbox/<kernel>/pins/<content address>/ in the repository's own layout.

Everything a judge's pass and the trusted timer read of the kernel's contract comes from here,
never from the working tree during a step: the judge file and its folder (its helpers and
data), the conftest.py and pytest configuration files on the way down from the root, and the
kernel folder at the base commit (kernel.toml's tolerances, kernel.py's reference, inputs and
hooks). A judge that finds the kernel folder beside itself (`Path(__file__).parent.parent /
"kernels" / name`) finds the pinned copy. The tree is written from the base commit's blobs and
checked against its content address before each experiment; a copy that changed is written
again from git.
"""

from __future__ import annotations

import configparser
import posixpath
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import git

from perfloop.core.errors import UserError
from perfloop.store import snapshot

# what pytest reads on the way down from the rootdir to a test file
CHAIN_FILES = ("conftest.py", "pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
INI = ".perfloop-pytest.ini"   # written where the repository has no pytest configuration


@dataclass(frozen=True)
class Pinned:
    root: Path       # the tree: the repository's layout
    judge: Path      # the judge's copy
    contract: Path   # the kernel folder's copy, at the base commit
    ini: Path        # the pytest configuration the judge runs with (pytest's -c)


def _has_pytest_section(name: str, data: bytes) -> bool:
    """Whether pytest would take this file as its configuration (as pytest looks for one)."""
    text = data.decode("utf-8", "replace")
    if name == "pytest.ini":
        return True
    if name == "pyproject.toml":
        try:
            return "ini_options" in tomllib.loads(text).get("tool", {}).get("pytest", {})
        except tomllib.TOMLDecodeError:
            return False
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return False
    return parser.has_section("pytest" if name == "tox.ini" else "tool:pytest")


def files_for(repo: git.Repo, base: str, folder_rel: str, judge_rel: str) -> tuple[dict, str]:
    """(the tree's files by repository path, the path of pytest's configuration among them)."""
    judge_rel = posixpath.normpath(judge_rel)
    judge_dir = PurePosixPath(judge_rel).parent.as_posix()
    chain = ["."] + [p.as_posix() for p in reversed(PurePosixPath(judge_dir).parents)
                     if p.as_posix() != "."] + ([judge_dir] if judge_dir != "." else [])
    out: dict = {}
    for directory in chain:   # what pytest reads on the way down to the judge
        top = snapshot.top_level(repo, base, directory)
        out.update({_join(directory, name): top[name] for name in CHAIN_FILES if name in top})
    if judge_dir == ".":   # a judge at the root: the root's own files, not the repository
        out.update(snapshot.top_level(repo, base, "."))
    else:   # its folder, with its helpers and data
        out.update({_join(judge_dir, p): v
                    for p, v in snapshot.from_commit(repo, base, judge_dir).items()})
    if judge_rel not in out:
        raise UserError(f"the judge {judge_rel} is not in commit {base[:12]}; commit it first")
    out.update({f"{folder_rel}/{p}": v
                for p, v in snapshot.from_commit(repo, base, folder_rel).items()})
    if sum(len(d) for _, d in out.values()) > snapshot.FOLDER_LIMIT:
        raise UserError(f"the judge's folder {judge_dir}/ holds more than "
                        f"{snapshot.FOLDER_LIMIT >> 20} MiB at {base[:12]}: a run pins it whole; "
                        "give the judge a folder of its own")
    ini = None
    for directory in reversed(chain):   # the nearest, as pytest finds it
        for name in ("pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg"):
            rel = _join(directory, name)
            if rel in out and _has_pytest_section(name, out[rel][1]):
                ini = rel
                break
        if ini:
            break
    if ini is None:
        ini = INI
        out[INI] = (snapshot.REGULAR, b"[pytest]\n")
    return out, ini


def _join(directory: str, name: str) -> str:
    return name if directory == "." else f"{directory}/{name}"


def ensure(repo: git.Repo, base: str, folder_rel: str, judge_rel: str, under: Path) -> Pinned:
    """The pinned tree of a run on `base`, written under `under` (or found there, unchanged)."""
    files, ini = files_for(repo, base, folder_rel, judge_rel)
    return written(files, ini=ini, judge_rel=judge_rel, folder_rel=folder_rel, under=under)


def written(files: dict, *, ini: str, judge_rel: str, folder_rel: str, under: Path) -> Pinned:
    """The tree of these files (files_for's) under `under`, at their content address (written
    again where what is there differs): on the machine that holds the repository, or on a
    fleet's worker, which gets the files as data."""
    root = Path(under) / snapshot.digest(files)[:16]
    if not root.is_dir() or snapshot.read_back(root) != files:
        snapshot.write(files, root)
    return Pinned(root, root / posixpath.normpath(judge_rel), root / folder_rel, root / ini)
