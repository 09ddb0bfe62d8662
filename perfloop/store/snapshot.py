"""A kernel folder as bytes: read once from the working tree, or from a commit's blobs, and
written to an export that children run (perfloop.store.gitops.commit_files commits them).

What an experiment judges, times and commits is one `Files`: the working tree is read once
(what `git add -A` would take: tracked and untracked files that are not ignored), its bytes
become blobs directly in git's object store, and every process that runs the code runs an
export written from those blobs. No clean or smudge filter, `.gitattributes` rule, replace ref
or hook can make the commit differ from what ran, and an edit to the working tree after the
snapshot changes nothing that is measured.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path, PurePosixPath

import git

from perfloop.core import plainfile
from perfloop.core.errors import UserError

REGULAR, EXECUTABLE, LINK, SUBMODULE = 0o100644, 0o100755, 0o120000, 0o160000
FOLDER_LIMIT = 256 << 20   # bytes of one kernel folder: far past any kernel's source

# {path relative to the folder (posix): (git mode, bytes)}
Files = dict[str, tuple[int, bytes]]


def _built(rel: str) -> bool:
    """What Python writes beside a module it ran: never part of a snapshot or an export."""
    return "__pycache__" in PurePosixPath(rel).parts


def digest(files: Files) -> str:
    """The content address of a folder's files: paths, modes and bytes."""
    h = hashlib.sha256()
    for path in sorted(files):
        mode, data = files[path]
        h.update(f"{path}\0{mode:o}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


def _tree(repo: git.Repo, sha: str, folder_rel: str):
    tree = repo.commit(sha).tree
    return tree if folder_rel in ("", ".") else tree / folder_rel


def _file(item, sha: str) -> tuple[int, bytes]:
    if item.mode == LINK:
        raise UserError(f"{item.path} in commit {sha[:12]} is a symbolic link: perfloop runs "
                        "a kernel folder's files as its commit holds them, and a link could "
                        "point anywhere; replace it with the file")
    return EXECUTABLE if item.mode & 0o111 else REGULAR, item.data_stream.read()


def from_commit(repo: git.Repo, sha: str, folder_rel: str) -> Files:
    """The folder's files in commit `sha` (everything beneath it but __pycache__/), as git
    stores them: no filter applies to a blob read from the object store. A symbolic link is
    refused: an export holds files only."""
    try:
        tree = _tree(repo, sha, folder_rel)
    except KeyError:
        return {}
    out = {}
    for item in tree.traverse():
        rel = PurePosixPath(item.path).relative_to(tree.path).as_posix() if tree.path \
            else item.path
        if item.type == "blob" and not _built(rel):
            out[rel] = _file(item, sha)
    return out


def top_level(repo: git.Repo, sha: str, folder_rel: str) -> Files:
    """The files directly in the folder (not beneath it) in commit `sha`."""
    try:
        tree = _tree(repo, sha, folder_rel)
    except KeyError:
        return {}
    return {item.name: _file(item, sha) for item in tree.blobs}


def from_worktree(repo: git.Repo, root: Path, folder_rel: str) -> Files:
    """The folder's files as `git add -A` would commit them (tracked and untracked files that
    are not ignored; a deleted one is absent), each read once as a regular file. Anything but
    a regular file (a FIFO, a device) is left out, as git leaves it, and so is __pycache__/;
    a symbolic link is refused."""
    listed = repo.git.ls_files("-z", "--cached", "--others", "--exclude-standard", "--",
                               folder_rel or ".")
    out: Files = {}
    total = 0
    for rel in sorted({p for p in listed.split("\0") if p}):
        path = root / rel
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        inside = Path(rel).relative_to(folder_rel).as_posix() if folder_rel not in ("", ".") \
            else rel
        if _built(inside):
            continue
        if stat.S_ISLNK(st.st_mode):
            raise UserError(f"{rel} is a symbolic link: perfloop commits and runs a kernel "
                            "folder's files, and a link could point anywhere; replace it with "
                            "the file")
        if not stat.S_ISREG(st.st_mode):
            continue
        try:
            data = plainfile.read_bytes(path, FOLDER_LIMIT - total)
        except plainfile.NotPlain:
            raise UserError(f"{folder_rel}/ holds more than {FOLDER_LIMIT >> 20} MiB (at {rel}): "
                            "a kernel folder is code, knobs and small data") from None
        total += len(data)
        out[inside] = (EXECUTABLE if st.st_mode & 0o111 else REGULAR, data)
    return out


def write(files: Files, dest: Path) -> Path:
    """The files under `dest` (made, with its parents), read-only: an export that children run
    and nothing edits. Returns `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    try:
        for rel, (mode, data) in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            os.chmod(path, 0o555 if mode == EXECUTABLE else 0o444)
        shutil.rmtree(dest, ignore_errors=True)   # (a copy left half-written by a kill)
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def read_back(dest: Path) -> Files:
    """What an export holds now (to check it is still what was written)."""
    out: Files = {}
    for path in sorted(Path(dest).rglob("*")):
        if path.is_symlink() or not path.is_file() or _built(path.relative_to(dest).as_posix()):
            continue
        mode = EXECUTABLE if path.stat().st_mode & 0o111 else REGULAR
        out[path.relative_to(dest).as_posix()] = (mode, plainfile.read_bytes(path))
    return out


def export(files: Files, parent: Path, folder_rel: str) -> Path:
    """The files written at `parent`/<random name>/`folder_rel`: every variant of an experiment
    runs from a folder of this one shape, so no path tells which role it plays. Returns the
    kernel folder's copy."""
    return write(files, parent / secrets.token_hex(6) / folder_rel)


def export_commit(repo: git.Repo, sha: str, folder_rel: str, parent: Path) -> Path:
    """The folder as commit `sha` holds it, exported (see export); returns the copy."""
    return export(from_commit(repo, sha, folder_rel), parent, folder_rel)


def matches(repo: git.Repo, sha: str, folder_rel: str) -> bool:
    """Whether the folder's working tree holds exactly what commit `sha` holds there."""
    return from_worktree(repo, Path(repo.working_tree_dir).resolve(), folder_rel) == \
        from_commit(repo, sha, folder_rel)


def with_file(files: Files, rel: str, text: str) -> Files:
    return {**files, rel: (REGULAR, text.encode("utf-8"))}
