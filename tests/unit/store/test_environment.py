"""A full disk, a held index.lock, a git write outside gitops: one line naming what to fix,
never the candidate's crash (issue 29), checked without a run."""

from pathlib import Path

import pytest
from conftest import ROOT, git


def test_a_write_refused_mid_command_is_one_line():
    """A write that fails after the checks (the disk filled up meanwhile) names what to fix
    and how to go on; any other OSError is a bug's."""
    import errno

    from perfloop.store import preflight

    failure = preflight.from_os_error(OSError(errno.ENOSPC, "No space left on device",
                                              "/x/sandbox/k/state.json"))
    assert failure.exit_code == 1 and "No space left on device (/x/sandbox/k/state.json, on " \
        "the filesystem mounted at /" in str(failure) and "--resume" in str(failure)
    assert preflight.from_os_error(OSError(errno.EINVAL, "Invalid argument")) is None


def test_a_full_disk_is_named_by_its_mount_point_and_device(tmp_path, monkeypatch):
    """A machine has many disks: each line about a full one says which (as df does)."""
    import errno

    from perfloop.isolation import mounts
    from perfloop.core.errors import EnvironmentFailure
    from perfloop.store import preflight

    assert mounts.mount_point(Path("/proc/self/status")) == Path("/proc")
    assert mounts.filesystem(Path("/proc/self/status")) == "the filesystem mounted at /proc (proc)"
    mine = mounts.filesystem(tmp_path)
    assert mounts.filesystem(tmp_path / "not" / "made") == mine   # where it would be made
    with pytest.raises(EnvironmentFailure) as refused:
        preflight.require_room([tmp_path], min_mb=10**12)        # (no disk has that much room)
    assert f"MB free on {mine}, which holds {tmp_path};" in str(refused.value)
    monkeypatch.setattr(preflight, "MIN_FREE_MB", 10**12)
    with pytest.raises(EnvironmentFailure) as refused:
        preflight.require_room_for_a_crash(tmp_path)
    assert f"MB free on {mine}, which holds {tmp_path} " in str(refused.value)
    monkeypatch.chdir(tmp_path)   # a write to a file already open names no file
    unnamed = preflight.from_os_error(OSError(errno.ENOSPC, "No space left on device"))
    assert f"No space left on device (on {mine}" in str(unnamed)


def test_a_crash_is_not_recorded_while_the_machine_lacks_room(tmp_path, monkeypatch):
    """The issue's full disk: the timing worker could not write its result and died, which
    read as the candidate's crash. A crash is recorded only where there was room."""
    from conftest import LEGACY

    from perfloop.core.errors import EnvironmentFailure
    from perfloop.core.vocab import Status
    from perfloop.store import preflight, records

    legacy = records.load(LEGACY)
    crash = next(r for r in legacy if getattr(r, "status", None) == Status.CRASH)
    kept = next(r for r in legacy if getattr(r, "status", None) == Status.KEEP)
    path = tmp_path / "experiments.jsonl"
    monkeypatch.setattr(preflight, "MIN_FREE_MB", 10**12)  # (no disk has that much room)
    with pytest.raises(EnvironmentFailure) as refused:
        records.append(path, crash)
    assert refused.value.exit_code == 1 and "--resume" in str(refused.value)
    assert not path.exists()
    records.append(path, kept)  # (what did not crash is recorded as ever)
    assert len(records.load(path)) == 1


def test_a_timers_import_list_cut_short_is_the_machines_failure_not_a_crash(tmp_path):
    # a full disk truncated the trusted timer's list of what it imported: without it the
    # verdict cannot be checked, and the candidate did nothing wrong
    from types import SimpleNamespace

    from perfloop.core.errors import EnvironmentFailure
    from perfloop.measure import phases

    (tmp_path / "timing-t1-imports.json").write_text('["/repo/kernels/x/ker')
    pending = phases.Pending({}, [], tmp_path, tmp_path, {}, 5.0, 0.0)
    done = SimpleNamespace(returncode=0, log="timing-t1.log", timed_out=False, stalled=False)
    running = SimpleNamespace(wait=lambda **kw: done)
    with pytest.raises(EnvironmentFailure) as caught:
        phases._finish(pending, phases.Timing(), running, "t1", [], {"labels": []},
                       deadline=0.0, select=False, shown=None)
    from perfloop.isolation.mounts import filesystem

    assert caught.value.exit_code == 1 and f"is {filesystem(tmp_path)} full?" in str(caught.value)
    assert "\n" not in str(caught.value)


# ---- every git write goes through gitops.writes ----------------------------------------------
GIT_WRITES = {"add", "commit", "reset", "restore", "update_ref", "checkout", "switch", "stash",
              "rm", "mv", "merge", "tag", "branch"}       # `repo.git.<command>(...)`


REPO_WRITES = {"create_head", "delete_head", "checkout"}  # GitPython's own


def _git_writes(tree) -> list:
    """Calls in `tree` of a git command that writes: `x.git.restore(...)`,
    `repo.create_head(...)`, `head.checkout()`."""
    import ast

    def writes(f) -> bool:
        through_git = isinstance(f.value, ast.Attribute) and f.value.attr == "git"
        return f.attr in REPO_WRITES or through_git and f.attr in GIT_WRITES

    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and writes(node.func)]


def test_every_git_write_is_one_of_gitops_writes():
    """A git write outside a @writes function answers a held index.lock or a full disk with a
    traceback instead of one line. Before, recovery restored an agent's edits with a bare
    `s.repo.git.restore(...)`."""
    import ast

    root = ROOT / "perfloop"
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        if path.name != "gitops.py" or path.parent.name != "store":
            calls = _git_writes(tree)
            assert not calls, f"{path}:{calls[0].lineno}: {ast.unparse(calls[0])[:80]}"
            continue
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef) and _git_writes(fn):
                assert any(ast.unparse(d) == "writes" for d in fn.decorator_list), fn.name


def test_giving_an_agents_edits_back_with_the_index_locked_is_one_line(tmp_path):
    from perfloop.core.errors import EnvironmentFailure
    from perfloop.store import gitops

    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.com"],
                 ["config", "user.name", "t"]):
        git(tmp_path, *args)
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "f").write_text("one\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "one")
    first = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "k" / "f").write_text("two\n")
    git(tmp_path, "commit", "-q", "-am", "two")
    (tmp_path / ".git" / "index.lock").write_text("")
    repo = gitops.open_repo(tmp_path)
    with pytest.raises(EnvironmentFailure, match="index.lock': File exists") as caught:
        gitops.restore_worktree(repo, first, "k")
    assert caught.value.exit_code == 1 and (tmp_path / "k" / "f").read_text() == "two\n"
    (tmp_path / ".git" / "index.lock").unlink()
    gitops.restore_worktree(repo, first, "k")
    assert (tmp_path / "k" / "f").read_text() == "one\n"
    assert git(tmp_path, "diff", "--cached", "--name-only") == ""  # the index is left alone
