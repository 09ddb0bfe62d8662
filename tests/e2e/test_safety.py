"""Never lose the user's work: each sequence here lost an edit, a commit or an experiment, or
left a half-made run, before it was fixed (issue 8)."""

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, Scratch, git, pythonpath

from perfloop.store import table


def _edit_inside(scratch: Scratch) -> dict:
    """An uncommitted edit to a tracked file and a new untracked file, both in the folder."""
    source = scratch.kernel / "kernel.py"
    source.write_text(source.read_text() + "\n# the user's unfinished idea\n")
    (scratch.kernel / "notes.md").write_text("try a wider tile\n")
    return {source: source.read_text(), scratch.kernel / "notes.md": "try a wider tile\n"}


def _still_there(edits: dict) -> bool:
    return all(path.exists() and path.read_text() == text for path, text in edits.items())


# ---- 1. run must not sweep uncommitted edits into an experiment ---------------------------
@pytest.mark.parametrize("args", [["--resume", "--max-iterations", "1"], ["--resume"]])
def test_run_resume_refuses_uncommitted_edits_in_the_folder(started, args):
    edits = _edit_inside(started)
    before = started.snapshot()
    code, out, _ = started.cli("run", "--kernel", "scripted", *args)
    assert code == 2 and "uncommitted edits inside kernels/scripted/" in out["error"]
    assert "kernel.py" in out["error"] and _still_there(edits) and started.snapshot() == before
    assert len(started.records()) == 1


def test_resume_of_an_interrupted_playbook_step_refuses_edits_made_after_the_kill(started):
    code, _, _ = started.cli("step", "--kernel", "scripted", "--opt", "fast_math",
                             env={"PERFLOOP_CRASH_AT": "timing@1"})
    assert code == -9
    edits = _edit_inside(started)
    before = started.snapshot()
    code, out, _ = started.cli("run", "--kernel", "scripted", "--resume")
    assert code == 2 and "perfloop will not overwrite it" in out["error"]
    assert _still_there(edits) and started.snapshot() == before


# ---- 2. a failed init leaves nothing half made --------------------------------------------
def test_init_with_invalid_knobs_names_the_users_file_and_changes_nothing(scratch):
    (scratch.kernel / "knobs.json").write_text("{ not json\n")
    scratch.commit_all("broken knobs")
    before = scratch.snapshot()
    code, out, _ = scratch.cli("init", "--kernel", "scripted")
    assert code == 2 and str(scratch.kernel / "knobs.json") in out["error"]
    assert "sandbox" not in out["error"]
    assert scratch.snapshot() == before and scratch.branch() == "main"
    assert not (scratch.path / "sandbox" / "scripted" / "state.json").exists()


def test_a_kernel_folder_not_yet_committed_is_refused_in_one_line(tmp_path):
    repo = Scratch(tmp_path / "repo")
    git(repo.path, "rm", "-r", "-q", "--cached", "kernels")
    git(repo.path, "commit", "-q", "-m", "the kernel is not committed yet")
    before = repo.snapshot()
    code, out, err = repo.cli("init", "--kernel", "scripted")
    assert code == 2 and "kernels/scripted/ is not committed" in out["error"]
    assert "Traceback" not in err and "GitCommandError" not in out["error"]
    assert repo.snapshot() == before and repo.branch() == "main"
    repo.commit_all("now it is")                       # the user commits it and starts again
    code, out, err = repo.cli("run", "--kernel", "scripted", "--max-iterations", "1")
    assert code == 0, err
    assert (repo.kernel / "kernel.py").exists() and (repo.kernel / "knobs.json").exists()


def test_a_baseline_that_fails_is_undone(scratch):
    knobs = scratch.kernel / "knobs.json"
    knobs.write_text(knobs.read_text().replace('"mode": "ok"', '"mode": "wrong"'))
    scratch.commit_all("a wrong kernel")
    head = scratch.head()
    code, out, _ = scratch.cli("init", "--kernel", "scripted")
    assert code == 1 and out["experiment"]["correctness"] == "FAIL"
    assert "back on main" in out["undone"]
    assert scratch.branch() == "main" and scratch.head() == head
    assert git(scratch.path, "branch", "--list", "cutile-perf-*") == ""
    assert not (scratch.path / "sandbox" / "scripted").exists()
    archived = list((scratch.path / "sandbox" / "_archive" / "scripted").glob("*/experiments.jsonl"))
    assert len(archived) == 1
    # the user fixes the kernel on main, commits, and starts again: nothing of theirs is lost
    knobs.write_text(knobs.read_text().replace('"mode": "wrong"', '"mode": "ok"'))
    scratch.commit_all("the fix")
    fix = scratch.head()
    code, out, _ = scratch.cli("run", "--kernel", "scripted", "--resume")
    assert code == 2 and "no run of 'scripted' yet" in out["error"]
    code, out, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0, err
    assert git(scratch.path, "merge-base", "--is-ancestor", fix, "HEAD") == ""


def test_an_interrupted_run_is_not_archived_silently(started):
    code, _, _ = started.cli("step", "--kernel", "scripted", "--opt", "fast_math",
                             env={"PERFLOOP_CRASH_AT": "timing@1"})
    assert code == -9
    git(started.path, "checkout", "-q", "main")
    before = started.snapshot()
    code, out, _ = started.cli("run", "--kernel", "scripted")
    assert code == 2 and "was interrupted" in out["error"] and "--resume" in out["error"]
    assert started.snapshot() == before


@pytest.mark.parametrize("phase", ["commit", "committed"])
def test_new_does_not_start_from_an_unrecorded_experiment(scratch, phase):
    """Killed right after its commit, the experiment is HEAD of the run's branch: a new run
    started there would take it for its baseline. Found by the state-machine test. --new sets
    the old run aside (its branch as it was) and starts from its incumbent."""
    scratch.script([{"when": {"fast_math": True}, "factor": {"*": 0.8}}])
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, _, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math",
                             env={"PERFLOOP_CRASH_AT": phase})
    assert code == -9
    state = json.loads((scratch.path / "sandbox/scripted/state.json").read_text())
    tip = git(scratch.path, "rev-parse", state["branch"])
    assert tip != state["incumbent"]                     # the unrecorded experiment's commit
    code, out, err = scratch.cli("init", "--kernel", "scripted", "--new")
    assert code == 0, err
    assert out["status"]["base_commit"] == state["incumbent"]
    assert git(scratch.path, "rev-parse", state["branch"]) == tip   # left as it was


# ---- 3. run identity: no run reuses another's branch or refs ------------------------------
def test_a_second_run_after_merging_and_deleting_the_first_branch_keeps_every_experiment(scratch):
    scratch.script([{"when": {"fast_math": True}, "factor": {"*": 0.8}}])
    scratch.commit_all("script")
    code, out, err = scratch.cli("run", "--kernel", "scripted")
    assert code == 0, err
    first = scratch.branch()
    refs_before = git(scratch.path, "for-each-ref", "--format=%(refname) %(objectname)",
                      f"refs/perfloop/{first}/")
    git(scratch.path, "checkout", "-q", "main")
    git(scratch.path, "merge", "-q", "--ff-only", first)
    git(scratch.path, "branch", "-q", "-D", first)
    code, out, err = scratch.cli("run", "--kernel", "scripted")
    assert code == 2 and "has finished" in out["error"] and "--new" in out["error"]
    code, out, err = scratch.cli("run", "--kernel", "scripted", "--new")
    assert code == 0, err
    second = scratch.branch()
    assert second != first and second.startswith(first)
    assert git(scratch.path, "for-each-ref", "--format=%(refname) %(objectname)",
               f"refs/perfloop/{first}/") == refs_before
    # every experiment of both runs is reachable from a ref
    unreachable = git(scratch.path, "fsck", "--unreachable", "--no-reflogs")
    archived = scratch.path / "sandbox" / "_archive" / "scripted"
    commits = [json.loads(line)["commit"] for f in archived.glob("*/experiments.jsonl")
               for line in f.read_text().splitlines() if '"commit"' in line]
    commits += [r["commit"] for r in scratch.records()]
    assert commits and not any(c in unreachable for c in commits)


# ---- 4. no child outlives perfloop --------------------------------------------------------
def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_run_takes_its_children_with_it(scratch):
    scratch.script([{"when": {"fast_math": True}, "factor": {"*": 0.8}}])
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    env = {**os.environ, "PYTHONPATH": pythonpath(), "SCRIPTED_DELAY_S": "0.01"}
    parent = subprocess.Popen([sys.executable, "-m", "perfloop", "run", "--kernel", "scripted",
                               "--resume"], cwd=scratch.path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work = scratch.path / "sandbox/scripted/work"
    deadline = time.monotonic() + 60
    progress = []
    while time.monotonic() < deadline:
        progress = [p for p in work.glob("iter-01-*/timing-*-progress.jsonl")
                    if '"stage": "time"' in p.read_text()]
        if progress:
            break
        time.sleep(0.05)
    assert progress, "the timing worker never started timing"
    spec = progress[0].name.replace("-progress.jsonl", "-spec.json")
    assert _processes_mentioning(spec)                      # the worker is running
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _processes_mentioning(spec) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_mentioning(spec)                  # and died with its parent
    result = progress[0].parent / progress[0].name.replace("-progress.jsonl", ".json")
    time.sleep(1)
    assert not result.exists()                              # it wrote nothing afterwards
    code, out, err = scratch.cli("run", "--kernel", "scripted", "--resume")
    assert code == 0, err
    assert [r["iteration"] for r in scratch.records()] == list(range(len(scratch.records())))


# ---- 5. smaller ones -----------------------------------------------------------------------
def _strict_json(text: str):
    def reject(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=reject)


def test_every_json_answer_is_strict_json(started):
    for args in (["report"], ["status"], ["next"], ["step", "--opt", "nosuch"],
                 ["run", "--max-iterations", "-1"], ["step"], ["bench"]):
        proc = subprocess.run([sys.executable, "-m", "perfloop", args[0], "--kernel", "scripted",
                               *args[1:], "--json"], cwd=started.path, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": pythonpath()})
        answer = _strict_json(proc.stdout.strip().splitlines()[-1])
        assert answer["schema"] == 1 and answer["ok"] == (proc.returncode == 0), args
        if proc.returncode:
            assert answer["exit_code"] == proc.returncode and answer["error"], args
            assert "\n" not in answer["error"]


def test_report_json_has_no_nan_when_phases_differ(started):
    knobs = started.kernel / "knobs.json"
    knobs.write_text(knobs.read_text().replace('"mode": "ok"', '"mode": "wrong"'))
    assert started.cli("step", "--kernel", "scripted", "--describe", "wrong by hand")[0] == 0
    proc = subprocess.run([sys.executable, "-m", "perfloop", "report", "--kernel", "scripted",
                           "--json"], cwd=started.path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": pythonpath()})
    assert "NaN" not in proc.stdout
    rows = _strict_json(proc.stdout)["rows"]
    assert rows[0]["timing_s"] > 0 and rows[1]["timing_s"] is None  # a FAIL is never timed


BAD_INPUT = {
    "a record without its decision": (
        lambda s: (s.path / "sandbox/scripted/experiments.jsonl").write_text(
            json.dumps({k: v for k, v in s.records()[0].items() if k != "decision"}) + "\n"),
        ["status"], "line 1 is not an experiment record (missing decision)"),
    "a wrong type in rules.toml": (
        lambda s: (s.path / "playbook/rules.toml").write_text(
            (s.path / "playbook/rules.toml").read_text().replace("keep_gain = 0.05", 'keep_gain = "high"')),
        ["next"], "keep_gain must be a number"),
    "a deleted run branch": (
        lambda s: (git(s.path, "checkout", "-q", "main"), git(s.path, "branch", "-q", "-D", s.run_branch)),
        ["step", "--opt", "fast_math"], "no longer exists"),
    "an incumbent that is not a commit": (
        lambda s: (s.path / "sandbox/scripted/state.json").write_text(
            (s.path / "sandbox/scripted/state.json").read_text().replace(
                json.loads((s.path / "sandbox/scripted/state.json").read_text())["incumbent"],
                "0123456789abcdef0123456789abcdef01234567")),
        ["status"], "which is not a commit in this repository"),
}


@pytest.mark.parametrize("mistake", BAD_INPUT)
def test_bad_state_gives_one_line_and_exit_2(started, mistake):
    started.run_branch = started.branch()
    damage, args, message = BAD_INPUT[mistake]
    damage(started)
    before = started.snapshot()
    code, out, err = started.cli(args[0], "--kernel", "scripted", *args[1:])
    assert code == 2 and message in out["error"], out
    assert "internal error" not in out["error"] and started.snapshot() == before


def test_max_iterations_must_not_be_negative(scratch):
    code, out, _ = scratch.cli("run", "--kernel", "scripted", "--max-iterations", "-1")
    assert code == 2 and "must be 0 or more" in out["error"]
    assert not (scratch.path / "sandbox" / "scripted").exists()


def test_bench_on_a_kernel_without_a_gpu_clock_says_so(scratch):
    code, out, err = scratch.cli("bench", "--kernel", "scripted")
    assert code == 2 and "is not timed on a GPU" in out["error"] and "Traceback" not in err


def test_record_files_are_created_like_any_other_file(scratch):
    old = os.umask(0o022)
    try:
        assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    finally:
        os.umask(old)
    for name in ("perf_results.md", "experiments.jsonl", "state.json"):
        mode = stat.S_IMODE((scratch.path / "sandbox/scripted" / name).stat().st_mode)
        assert mode == 0o644, (name, oct(mode))


def test_a_regular_install_finds_the_shipped_playbook(scratch, tmp_path):
    from importlib.metadata import version

    if int(version("setuptools").split(".")[0]) < 77:
        pytest.skip("building perfloop offline needs setuptools>=77 (the dev extra installs it)")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(ROOT)], check=True,
                   capture_output=True)
    assert (target / "perfloop" / "_playbook" / "catalog.toml").is_file()
    import shutil

    shutil.rmtree(scratch.path / "playbook")             # the user's repository has none
    scratch.commit_all("no playbook here")
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run([sys.executable, "-m", "perfloop", "init", "--kernel", "scripted",
                           "--json"], cwd=scratch.path, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "perfloop", "next", "--kernel", "scripted",
                           "--json"], cwd=scratch.path, capture_output=True, text=True, env=env)
    answer = json.loads(proc.stdout)
    assert answer["ok"] and answer["suggestions"][0]["id"] == "fast_math"
    proc = subprocess.run([sys.executable, "-m", "perfloop", "next", "--kernel", "swiglu",
                           "--json"], cwd=scratch.path, capture_output=True, text=True, env=env)
    assert "perfloop's example kernels are in its source repository" in json.loads(proc.stdout)["error"]


def test_table_rows_match_the_record_after_every_command(scratch):
    scratch.script([{"when": {"fast_math": True}, "factor": {"*": 0.8}}])
    scratch.commit_all("script")
    assert scratch.cli("run", "--kernel", "scripted")[0] == 0
    rows = table.read_rows(scratch.path / "sandbox/scripted/perf_results.md")
    assert len(rows) == len(scratch.records())
