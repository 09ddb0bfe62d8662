"""Git for experiments, through GitPython.

Every experiment is a commit on the run's branch and gets a ref under refs/perfloop/, so its
code stays reachable after a revert. perfloop stages and restores only the kernel's folder:
whatever else the user has in the working tree or the index is left exactly as it was.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import git

from perfloop.core.errors import UserError
from perfloop.core.faults import crashpoint

REF_PREFIX = "refs/perfloop"


def find_repo(path: Path) -> git.Repo:
    try:
        repo = git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UserError(f"{path} is not inside a git repository; perfloop records every "
                        "experiment as a commit, so the kernel must live in one") from None
    if repo.bare:
        raise UserError(f"{repo.git_dir} is a bare repository")
    return repo


def open_repo(path: Path) -> git.Repo:
    """The repository holding `path`, which must have a commit to branch from."""
    repo = find_repo(path)
    if not repo.head.is_valid():
        raise UserError(f"the repository at {repo.working_tree_dir} has no commits yet; "
                        "commit the kernel first")
    return repo


def cwd_root() -> Path | None:
    """The repository the user is in, if any: where kernel names are looked up first."""
    try:
        return root(git.Repo(Path.cwd(), search_parent_directories=True))
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None


def root(repo: git.Repo) -> Path:
    return Path(repo.working_tree_dir).resolve()


def rel(repo: git.Repo, folder: Path) -> str:
    try:
        return folder.resolve().relative_to(root(repo)).as_posix()
    except ValueError:
        raise UserError(f"{folder} is not inside the repository {root(repo)}") from None


def current_branch(repo: git.Repo) -> str:
    if repo.head.is_detached:
        raise UserError("HEAD is detached; check out a branch before running perfloop")
    return repo.active_branch.name


def head(repo: git.Repo) -> str:
    return repo.head.commit.hexsha


def status_paths(repo: git.Repo, untracked: bool = False) -> list[str]:
    """Paths with uncommitted changes (tracked ones; untracked too if asked)."""
    flag = "--untracked-files=all" if untracked else "--untracked-files=no"
    out = repo.git.status("--porcelain", "-z", flag)
    entries = [e for e in out.split("\0") if e]
    paths, skip = [], False
    for entry in entries:
        if skip:  # the source path of a rename
            skip = False
            continue
        paths.append(entry[3:])
        skip = entry[0] in "RC"
    return paths


def listing(paths: list[str], most: int = 5) -> str:
    return ", ".join(paths[:most]) + (" ..." if len(paths) > most else "")


def require_clean(repo: git.Repo) -> None:
    dirty = status_paths(repo)
    if dirty:
        raise UserError(f"uncommitted changes to tracked files ({listing(dirty)}); commit or "
                        "stash them first: perfloop never runs over work it did not make")


def inside(path: str, folder_rel: str) -> bool:
    return path == folder_rel or path.startswith(folder_rel.rstrip("/") + "/")


def branch_exists(repo: git.Repo, name: str) -> bool:
    return name in repo.heads


def refs_under(repo: git.Repo, prefix: str) -> dict[str, str]:
    """{ref name: sha} of every ref under `prefix`."""
    out = repo.git.for_each_ref("--format=%(refname) %(objectname)", prefix)
    return dict(line.split(" ", 1) for line in out.splitlines() if line)


def name_taken(repo: git.Repo, name: str) -> bool:
    """A branch of that name exists, or an earlier run used it: its refs outlive the branch."""
    return branch_exists(repo, name) or bool(refs_under(repo, f"{REF_PREFIX}/{name}/"))


def unique_branch(repo: git.Repo, base: str) -> str:
    name, n = base, 2
    while name_taken(repo, name):
        name, n = f"{base}-{n}", n + 1
    return name


def create_branch(repo: git.Repo, name: str) -> None:
    repo.create_head(name, repo.head.commit).checkout()


def switch_back(repo: git.Repo, previous: str, created: str) -> None:
    """Undo create_branch: back on `previous`, and `created` deleted (it holds no commit that
    `previous` lacks, or the caller would not call this)."""
    repo.heads[previous].checkout()
    repo.delete_head(created, force=True)


def commit_exists(repo: git.Repo, sha: str) -> bool:
    try:
        return repo.commit(sha).hexsha == sha
    except (ValueError, git.BadName, git.GitCommandError):
        return False


def parent_and_message(repo: git.Repo, sha: str) -> tuple[str | None, str]:
    commit = repo.commit(sha)
    return (commit.parents[0].hexsha if commit.parents else None), commit.message.strip()


def file_at(repo: git.Repo, sha: str, path: str) -> str | None:
    """The text of `path` in commit `sha`, or None if it is not there."""
    try:
        return repo.git.show(f"{sha}:{path}", strip_newline_in_stdout=False)
    except git.GitCommandError:
        return None


def blob_ids(repo: git.Repo, sha: str, paths: list[str]) -> dict[str, str]:
    """{path: blob id} for the paths tracked in commit `sha` (others are absent)."""
    if not paths:
        return {}
    out = repo.git.ls_tree("-z", sha, "--", *paths)
    entries = {}
    for entry in out.split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            entries[path] = meta.split()[2]
    return entries


def working_ids(repo: git.Repo, paths: list[str]) -> dict[str, str]:
    """{path: blob id} of the files as they are in the working tree."""
    if not paths:
        return {}
    return dict(zip(paths, repo.git.hash_object("--", *paths).splitlines()))


def tracked(repo: git.Repo, paths: list[str]) -> set[str]:
    """Which of these paths are in the index."""
    if not paths:
        return set()
    return {p for p in repo.git.ls_files("-z", "--", *paths).split("\0") if p}


def _identity_env(repo: git.Repo) -> dict:
    """Commit even where no user.name/email is configured (CI), without changing config."""
    reader = repo.config_reader()
    env = {}
    if not reader.get_value("user", "name", ""):
        env.update(GIT_AUTHOR_NAME="perfloop", GIT_COMMITTER_NAME="perfloop")
    if not reader.get_value("user", "email", ""):
        env.update(GIT_AUTHOR_EMAIL="perfloop@localhost", GIT_COMMITTER_EMAIL="perfloop@localhost")
    return env


def commit_folder(repo: git.Repo, folder_rel: str, message: str) -> str:
    """Commit the folder's changes only, whatever else is staged or modified."""
    repo.git.add("-A", "--", folder_rel)
    env = {**os.environ, **_identity_env(repo)}
    repo.git.commit("--no-verify", "-m", message, "--", folder_rel, env=env)
    sha = head(repo)
    crashpoint("committed")  # a kill right after a commit, before anyone recorded it
    return sha


def set_ref(repo: git.Repo, name: str, sha: str) -> None:
    repo.git.update_ref(name, sha)


def move_branch_to(repo: git.Repo, sha: str, folder_rel: str) -> None:
    """Point the current branch at `sha` and make the folder match it; nothing else changes."""
    repo.git.reset("--soft", sha)
    repo.git.restore(f"--source={sha}", "--staged", "--worktree", "--", folder_rel)


def restore_folder(repo: git.Repo, sha: str, folder_rel: str) -> None:
    repo.git.restore(f"--source={sha}", "--staged", "--worktree", "--", folder_rel)


def export_folder(repo: git.Repo, sha: str, folder_rel: str, dest: Path) -> Path:
    """Write the folder as it is in commit `sha` under dest; returns the folder's copy."""
    target = dest / Path(folder_rel).name
    buf = io.BytesIO()
    repo.archive(buf, treeish=sha, path=folder_rel, format="tar")
    buf.seek(0)
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest, prefix=".export-"))
    with tarfile.open(fileobj=buf) as tar:
        tar.extractall(staging, filter="data")
    shutil.rmtree(target, ignore_errors=True)  # a copy left half-written by a kill
    (staging / folder_rel).rename(target)
    shutil.rmtree(staging)
    return target
