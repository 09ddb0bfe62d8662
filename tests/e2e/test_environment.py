"""A broken environment or input gets one line and changes nothing: it is checked before an
experiment starts, never recorded as the candidate's crash (issue 29, items 3, 4 and 6). The
checks themselves, without a run: tests/unit/store/test_environment.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Scratch, git, pythonpath
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
    # a wrapper, not a symlink: a symlinked venv python no longer finds its venv (pyvenv.cfg
    # beside it), so it would fail importing GitPython instead of finding no git
    (bare / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bare / "python").chmod(0o755)
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
