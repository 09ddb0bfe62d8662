"""A broken environment or input gets one line and changes nothing: it is checked before an
experiment starts, never recorded as the candidate's crash (issue 29, items 3, 4 and 6)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, Scratch, git, pythonpath
from support.reliability import in_namespace, read_only, small
from support.cli import assert_one_line, human

SANDBOX = "sandbox/scripted"


@pytest.fixture
def started(scratch):
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    return scratch


def files(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in folder.rglob("*") if p.is_file() and ".locks" not in p.parts}


def unchanged(scratch: Scratch):
    """What a refused command must leave as it was: git, the sandbox, the kernel folder."""
    return scratch.snapshot(), files(scratch.path / "sandbox"), files(scratch.kernel)


# ---- checked before work starts ------------------------------------------------------------
def test_a_stale_index_lock_is_refused_before_the_experiment(started):
    """Before, it was found only after the experiment had run (77 s on the issue's kernel),
    leaving knobs.json modified."""
    lock = started.path / ".git" / "index.lock"
    lock.write_text("")
    before = unchanged(started)
    code, out, err = human(started.path, "step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 2 and unchanged(started) == before
    assert_one_line(err, "index is locked", str(lock), "rm ")
    assert not list((started.path / SANDBOX / "work").glob("iter-01-*"))  # nothing ran
    lock.unlink()
    assert started.cli("step", "--kernel", "scripted", "--opt", "fast_math")[0] == 0


def test_a_stale_index_lock_refuses_init_too(scratch):
    (scratch.path / ".git" / "index.lock").write_text("")
    before = scratch.snapshot()
    code, _, err = human(scratch.path, "init", "--kernel", "scripted")
    assert code == 2 and scratch.snapshot() == before and scratch.branch() == "main"
    assert_one_line(err, "index is locked")


def test_a_committed_kernel_module_with_a_syntax_error(scratch):
    path = scratch.kernel / "kernel.py"
    path.write_text(path.read_text() + "\ndef broken(:\n")
    scratch.commit_all("a syntax error")
    before = scratch.snapshot()
    code, _, err = human(scratch.path, "init", "--kernel", "scripted")
    assert code == 2 and scratch.snapshot() == before
    assert_one_line(err, "kernels/scripted/kernel.py at", "does not compile", "SyntaxError")
    assert not (scratch.path / SANDBOX).exists()


@pytest.mark.parametrize("name", ["k" * 240, "a~b", "a^b", "a:b", "a?b", "a*b", "a[b", "a b",
                                  ".hidden"])
def test_a_kernel_name_that_cannot_name_a_branch(scratch, name):
    manifest = scratch.kernel / "kernel.toml"
    manifest.write_text(manifest.read_text().replace('name = "scripted"', f'name = "{name}"'))
    scratch.commit_all("an odd name")
    before = scratch.snapshot()
    for command in ("init", "status"):
        code, _, err = human(scratch.path, command, "--kernel", "scripted")
        assert code == 2 and scratch.snapshot() == before
        assert_one_line(err, "cannot name a git branch")
    assert not (scratch.path / "sandbox").exists()


@pytest.mark.parametrize("broken", [
    {"iteration": 1}, {"kind": "playbook"}, {"iteration": "1", "kind": "agent"},
    {"iteration": 1, "kind": "playbook"}, {"iteration": 1, "kind": "nonsense"}, [1, 2], "x"])
def test_a_malformed_in_flight_marker(started, broken):
    path = started.path / SANDBOX / "state.json"
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "in_flight": broken}))
    before = unchanged(started)
    for args in (["status"], ["run", "--resume"], ["step", "--resume"]):
        code, _, err = human(started.path, args[0], "--kernel", "scripted", *args[1:])
        assert code == 2, (args, err)
        assert_one_line(err, "state.json is corrupted", "in_flight")
    assert unchanged(started) == before


def test_an_in_flight_iteration_the_record_cannot_have(started):
    """The marker's experiment is the next one (1 here) or the last recorded one being
    finished (0); before, `status` accepted -1 or 99 and said nothing. `--new` still sets
    such a run aside."""
    path = started.path / SANDBOX / "state.json"
    state = json.loads(path.read_text())
    for iteration in (-1, 2, 99):
        path.write_text(json.dumps({**state, "in_flight": {"iteration": iteration,
                                                           "kind": "agent"}}))
        before = unchanged(started)
        for args in (["status"], ["run", "--resume"], ["step", "--resume"], ["init"]):
            code, _, err = human(started.path, args[0], "--kernel", "scripted", *args[1:])
            assert code == 2, (iteration, args, err)
            assert_one_line(err, "state.json is corrupted", f"'in_flight.iteration' is "
                            f"{iteration}", "only 0 or 1", "--new")
        assert unchanged(started) == before
    assert started.cli("init", "--kernel", "scripted", "--new")[0] == 0


def test_an_incumbent_of_zeros_is_not_a_commit(started):
    path = started.path / SANDBOX / "state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "incumbent": "0" * 40}))
    code, _, err = human(started.path, "status", "--kernel", "scripted")
    assert code == 2
    assert_one_line(err, "names incumbent 000000000000, which is not a commit")


def test_git_missing_from_path(started, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to(sys.executable)
    proc = subprocess.run([str(bare / "python"), "-m", "perfloop", "status", "--kernel",
                           "scripted"], cwd=started.path, capture_output=True, text=True,
                          env={**os.environ, "PATH": str(bare), "PYTHONPATH": pythonpath()})
    assert proc.returncode == 2
    assert_one_line(proc.stderr, "git", "PATH")


# ---- read-only files, a full disk ----------------------------------------------------------
@pytest.mark.parametrize("args", [["step", "--opt", "fast_math"], ["run", "--resume"]])
def test_a_read_only_sandbox(started, args):
    before = unchanged(started)
    code, out, err = in_namespace(started.path, read_only("sandbox"), args[0], "--kernel",
                                  "scripted", *args[1:])
    assert code == 2 and "Traceback" not in err, (out, err)
    assert "sandbox" in out["error"] and "read-only" in out["error"]
    assert unchanged(started) == before


def test_a_read_only_sandbox_for_an_interrupted_run(started):
    code, _, _ = started.cli("step", "--kernel", "scripted", "--opt", "fast_math",
                             env={"PERFLOOP_CRASH_AT": "timing@1"})
    assert code == -9
    before = unchanged(started)
    code, out, err = in_namespace(started.path, read_only("sandbox"), "run", "--kernel",
                                  "scripted", "--resume")
    assert code == 2 and "read-only" in out["error"] and "Traceback" not in err
    assert unchanged(started) == before


def test_a_read_only_kernel_folder(started):
    before = unchanged(started)
    code, out, err = in_namespace(started.path, read_only("kernels/scripted"), "step",
                                  "--kernel", "scripted", "--opt", "fast_math")
    assert code == 2 and "kernels/scripted" in out["error"] and "read-only" in out["error"]
    assert unchanged(started) == before


def test_report_html_into_a_read_only_sandbox(started):
    code, out, err = in_namespace(started.path, read_only("sandbox"), "report", "--kernel",
                                  "scripted", "--html", "sandbox/report.html")
    assert code == 2 and "Traceback" not in err
    assert "not writable" in out["error"] and "read-only" in out["error"]


def test_a_full_disk_is_not_the_candidates_crash(started):
    """Before, a step on a nearly full filesystem ran, and its failure to write was recorded
    as the candidate's crash (exit 0), which `next` then never offered again."""
    before = unchanged(started)
    code, out, err = in_namespace(started.path, small("sandbox", 24, fill_mb=23), "step",
                                  "--kernel", "scripted", "--opt", "fast_math")
    assert code == 2 and "MB free" in out["error"] and "free some space" in out["error"], err
    sandbox = os.path.realpath(started.path / "sandbox")
    assert f"on the filesystem mounted at {sandbox} (tmpfs), which holds" in out["error"], err
    assert unchanged(started) == before
    code, out, err = started.cli("step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 0 and out["experiment"]["status"] != "crash", err


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


# ---- output, help, worktrees ---------------------------------------------------------------
def test_status_into_a_closed_pipe(started):
    """`perfloop status | head -1`: the reader may be gone before perfloop writes."""
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, "-m", "perfloop", "status", "--kernel", "scripted"],
                          cwd=started.path, stdout=write, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": pythonpath()})
    os.close(write)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "BrokenPipe" not in proc.stderr and len(proc.stderr.splitlines()) <= 1


def test_status_piped_into_head(started):
    proc = subprocess.run(f"{sys.executable} -m perfloop status --kernel scripted | head -1",
                          shell=True, cwd=started.path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": pythonpath()})
    assert proc.stdout.startswith("scripted on cutile-perf-scripted-")
    assert "Traceback" not in proc.stderr and len(proc.stdout.splitlines()) == 1


@pytest.mark.parametrize("args", [["--help"], ["step", "--help"], ["run", "-h"]])
def test_help_with_json_is_json(scratch, args):
    proc = subprocess.run([sys.executable, "-m", "perfloop", *args, "--json"], cwd=scratch.path,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": pythonpath()})
    assert proc.returncode == 0
    [line] = proc.stdout.splitlines()
    answer = json.loads(line)
    assert answer["ok"] is True and answer["schema"] == 1 and "usage: perfloop" in answer["help"]
    assert answer["command"] == (args[0] if len(args) == 2 else None)


def test_version_with_json_is_json():
    """Before, `--version --json` printed the plain `perfloop X.Y.Z`."""
    from perfloop import __version__

    for args in (["--version", "--json"], ["--json", "--version"]):
        proc = subprocess.run([sys.executable, "-m", "perfloop", *args], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": pythonpath()})
        assert proc.returncode == 0 and proc.stderr == ""
        [line] = proc.stdout.splitlines()
        assert json.loads(line) == {"schema": 1, "command": None, "ok": True,
                                    "version": __version__}
    proc = subprocess.run([sys.executable, "-m", "perfloop", "--version"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": pythonpath()})
    assert proc.stdout == f"perfloop {__version__}\n"


def test_sandbox_is_ignored_in_a_linked_worktree(scratch, tmp_path):
    """Before, the ignore line went to .git/worktrees/<name>/info/exclude, which git never
    reads: sandbox/ showed as untracked there."""
    tree = tmp_path / "linked"
    git(scratch.path, "worktree", "add", "-q", "-b", "other", str(tree))
    proc = subprocess.run([sys.executable, "-m", "perfloop", "init", "--kernel", "scripted"],
                          cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": pythonpath()})
    assert proc.returncode == 0, proc.stderr
    assert (tree / SANDBOX / "state.json").exists()
    assert git(tree, "status", "--porcelain", "--untracked-files=all") == ""
    assert "/sandbox/" in (scratch.path / ".git" / "info" / "exclude").read_text()


def test_a_shipped_kernel_is_still_a_usable_name(tmp_path):
    scratch = Scratch.of_shipped(tmp_path / "repo", "swiglu")
    code, out, err = scratch.cli("status", "--kernel", "swiglu")
    assert code == 2 and "no run of 'swiglu' yet" in out["error"]


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
