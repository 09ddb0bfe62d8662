"""Git for experiments, through GitPython.

Every experiment is a commit on the run's branch and gets a ref under refs/perfloop/, so its
code stays reachable after a revert. perfloop stages and restores only the kernel's folder:
whatever else the user has in the working tree or the index is left exactly as it was.

Two properties hold for every git command perfloop runs (see _Repo):
- no repository hook runs (kernel code can write .git/hooks/ in an experiment; the next
  commit must not run what it planted);
- GitPython's long-lived helpers (`git cat-file --batch`) live in a session of their own, so
  a Ctrl-C, which the terminal sends to perfloop's whole process group, never kills them
  under the clean-up that needs them. One-off git commands stay in the group: they end with
  perfloop, and git removes its own lock files when interrupted.
"""

from __future__ import annotations

import functools
import io
import os
import tempfile
from pathlib import Path

# without git on PATH, importing GitPython would fail with a traceback; quiet, the first git
# command fails instead, and _Git says so in one line
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
import git  # noqa: E402
from gitdb.base import IStream  # noqa: E402

from perfloop.core.errors import EnvironmentFailure, UserError  # noqa: E402
from perfloop.isolation import spawn
from perfloop.core.faults import crashpoint
from perfloop.isolation.mounts import filesystem

REF_PREFIX = "refs/perfloop"
NO_HOOKS = "core.hooksPath=/dev/null"   # hooks are looked up in a folder that cannot hold any
# what git says when the machine, not the experiment, failed it
MACHINE_FAILURES = (".lock': File exists", "Unable to create", "cannot lock ref",
                    "No space left on device", "Read-only file system", "Permission denied",
                    "Disk quota exceeded")


def writes(fn):
    """A git operation that writes: the machine's refusal (a lock another git holds, no space,
    read-only files) becomes one line naming it, not a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except git.GitCommandError as exc:
            said = " ".join(str(exc.stderr or "").split()).strip("' ")
            if not any(failure in said for failure in MACHINE_FAILURES):
                raise
            repo = args[0] if args and hasattr(args[0], "git_dir") else None
            disk = (filesystem(Path(repo.git_dir)) + ", the repository's," if repo is not None
                    else "the repository's filesystem")
            cause = (f"git failed ({said[:240]}): another git command may hold that lock, or "
                     f"{disk} is full or read-only; fix that")
            raise EnvironmentFailure(f"{cause}, then `perfloop run --resume` runs the "
                                     "unrecorded experiment again", during=True,
                                     cause=cause) from None
    return wrapper


class _Git(git.Git):
    def execute(self, command, *args, **kwargs):
        helper = kwargs.get("as_process")  # it outlives this call (cat-file --batch)
        if helper:
            kwargs.setdefault("start_new_session", True)
        try:
            started = super().execute(command, *args, **kwargs)
            if helper:  # (its own session: kill_strays must know it is ours)
                spawn.own_helper(started.proc.pid)
            return started
        except git.GitCommandNotFound:
            raise EnvironmentFailure("git was not found: perfloop records every experiment as "
                                     "a git commit; install git or put it on PATH") from None


class _Repo(git.Repo):
    GitCommandWrapperType = _Git

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.git.set_persistent_git_options(c=NO_HOOKS)
        # a replace ref would make an object read as another: what perfloop exports, runs and
        # records is each commit's own blobs
        self.git.update_environment(GIT_NO_REPLACE_OBJECTS="1")


def find_repo(path: Path) -> git.Repo:
    try:
        repo = _Repo(path, search_parent_directories=True)
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
        return root(_Repo(Path.cwd(), search_parent_directories=True))
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


def differs_from_head(repo: git.Repo, folder_rel: str) -> bool:
    """Whether the folder's files differ from HEAD's, untracked ones included: an edit staged
    and then undone in the working tree shows in `status` but changes nothing."""
    if repo.git.diff("HEAD", "--name-only", "--", folder_rel).strip():
        return True
    return bool(repo.git.ls_files("--others", "--exclude-standard", "--", folder_rel).strip())


def listing(paths: list[str], most: int = 5) -> str:
    return ", ".join(paths[:most]) + (" ..." if len(paths) > most else "")


def require_clean(repo: git.Repo, excused: list[str] | tuple[str, ...] = ()) -> None:
    dirty = [p for p in status_paths(repo) if p not in excused]
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


@writes
def create_branch(repo: git.Repo, name: str, at: str | None = None) -> None:
    """Make branch `name` at commit `at` (default HEAD) and check it out."""
    repo.create_head(name, at or repo.head.commit).checkout()


@writes
def switch_back(repo: git.Repo, previous: str, created: str) -> None:
    """Undo create_branch: back on `previous`, and `created` deleted (it holds no commit that
    `previous` lacks, or the caller would not call this)."""
    repo.heads[previous].checkout()
    repo.delete_head(created, force=True)


def commit_exists(repo: git.Repo, sha: str) -> bool:
    """`sha` is the full name of a commit in this repository (not a branch, not a prefix)."""
    if not isinstance(sha, str) or len(sha) != 40 or sha.strip("0123456789abcdef"):
        return False
    try:
        return repo.git.rev_parse("--verify", "--quiet", f"{sha}^{{commit}}") == sha
    except git.GitCommandError:
        return False


def git_path(repo: git.Repo, name: str) -> Path:
    """Where git keeps `name` for this working tree (`git rev-parse --git-path`): a linked
    worktree's index and HEAD are its own, its info/exclude is the main repository's."""
    found = Path(repo.git.rev_parse("--git-path", name))
    return found if found.is_absolute() else Path(repo.working_tree_dir) / found


def valid_branch_name(repo: git.Repo, name: str) -> bool:
    try:
        repo.git.check_ref_format(f"refs/heads/{name}")
    except git.GitCommandError:
        return False
    return True


def parent_and_message(repo: git.Repo, sha: str) -> tuple[str | None, str]:
    commit = repo.commit(sha)
    return (commit.parents[0].hexsha if commit.parents else None), commit.message.strip()


def file_at(repo: git.Repo, sha: str, path: str) -> str | None:
    """The text of `path` in commit `sha`, or None if it is not there."""
    try:
        return repo.git.show(f"{sha}:{path}", strip_newline_in_stdout=False)
    except git.GitCommandError:
        return None


def diff(repo: git.Repo, before: str, after: str, path: str) -> str | None:
    """`git diff before after -- path`, or None where either commit is not in the repository."""
    if not (commit_exists(repo, before) and commit_exists(repo, after)):
        return None
    return repo.git.diff(before, after, "--", path, strip_newline_in_stdout=False)


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


def identity_env(repo: git.Repo) -> dict:
    """Commit even where no user.name/email is configured (CI), without changing config."""
    reader = repo.config_reader()
    env: dict = {}
    if not reader.get_value("user", "name", ""):
        env.update(GIT_AUTHOR_NAME="perfloop", GIT_COMMITTER_NAME="perfloop")
    if not reader.get_value("user", "email", ""):
        env.update(GIT_AUTHOR_EMAIL="perfloop@localhost", GIT_COMMITTER_EMAIL="perfloop@localhost")
    return env


def _blob(repo: git.Repo, data: bytes) -> str:
    """Store `data` as a blob, as it is (no filter)."""
    sha = repo.odb.store(IStream(b"blob", len(data), io.BytesIO(data))).hexsha
    return sha.decode("ascii") if isinstance(sha, bytes) else sha


@writes
def commit_files(repo: git.Repo, folder_rel: str, files: dict, message: str) -> str:
    """Commit exactly `files` ({path in the folder: (git mode, bytes)}: perfloop.store.
    snapshot.Files) as the folder, on top of HEAD, on the current branch; everything else as
    in HEAD, nothing else of the index or the working tree changed. The blobs are written from
    the bytes (no clean filter or attribute applies), the tree through a temporary index, the
    commit with commit-tree (no hook runs). The index's entries for the folder follow before
    the branch moves: a kill in between leaves a staged change, never a commit whose files
    the working tree lacks."""
    parent, branch = head(repo), current_branch(repo)
    prefix = f"{folder_rel}/" if folder_rel not in ("", ".") else ""
    entries = {f"{prefix}{rel}": (mode, _blob(repo, data)) for rel, (mode, data) in files.items()}
    before = repo.git.ls_tree("-r", "-z", "--name-only", parent, "--", folder_rel or ".")
    gone = [p for p in before.split("\0") if p and p not in entries]
    env = identity_env(repo)
    fd, index = tempfile.mkstemp(prefix="perfloop-index-")
    os.close(fd)
    os.unlink(index)   # (git makes it)
    try:
        tmp = {**env, "GIT_INDEX_FILE": index}
        repo.git.read_tree(parent, env=tmp)
        if gone:
            repo.git.update_index("--force-remove", "--", *gone, env=tmp)
        if entries:
            repo.git.update_index("--add", *(arg for path, (mode, sha) in sorted(entries.items())
                                             for arg in ("--cacheinfo", f"{mode:o},{sha},{path}")),
                                  env=tmp)
        tree = repo.git.write_tree(env=tmp)
    finally:
        if os.path.exists(index):
            os.unlink(index)
    sha = repo.git.commit_tree(tree, "-p", parent, "-m", message, env=env)
    repo.git.reset("-q", sha, "--", folder_rel or ".")   # the index's entries for the folder
    repo.git.update_ref("-m", f"perfloop: {message.splitlines()[0][:60]}", f"refs/heads/{branch}",
                        sha, parent)
    crashpoint("committed")  # a kill right after a commit, before anyone recorded it
    return sha


@writes
def set_ref(repo: git.Repo, name: str, sha: str) -> None:
    repo.git.update_ref(name, sha)


@writes
def delete_ref(repo: git.Repo, name: str) -> None:
    repo.git.update_ref("-d", name)


@writes
def move_branch_to(repo: git.Repo, sha: str, folder_rel: str, worktree: bool = True) -> None:
    """Point the current branch at `sha` and the folder's index entries at its files, and with
    `worktree` its working tree too (the caller knows it holds only what perfloop wrote:
    perfloop.store.snapshot.matches); nothing else changes."""
    repo.git.reset("--soft", sha)
    where = ("--staged", "--worktree") if worktree else ("--staged",)
    repo.git.restore(f"--source={sha}", *where, "--", folder_rel)


@writes
def restore_folder(repo: git.Repo, sha: str, folder_rel: str) -> None:
    repo.git.restore(f"--source={sha}", "--staged", "--worktree", "--", folder_rel)


@writes
def restore_worktree(repo: git.Repo, sha: str, folder_rel: str) -> None:
    """The folder's files as in commit `sha`, the index left alone: they show as uncommitted
    changes (an agent's edits, given back after their commit was set aside)."""
    repo.git.restore(f"--source={sha}", "--worktree", "--", folder_rel)
