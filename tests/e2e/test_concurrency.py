"""One writer per kernel (and per working tree): a second writer is refused in one line naming
the holder, readers still answer, a dead holder's lock is free, and commands started together
leave one run with a consistent record. A table that no longer matches its record is rewritten
from it, and --new sets aside a record that cannot be repaired. (The lock alone:
tests/unit/store/test_lock.py.)"""

import json
import subprocess
import time
from pathlib import Path

from conftest import Scratch, git
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.reliability import answer, hold_lock, spawn
from support.runs import assert_consistent

from perfloop.store import table

KERNEL_LOCK = "sandbox/.locks/scripted.lock"


def test_a_writer_is_refused_while_readers_answer(scratch):
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    before = scratch.snapshot()
    sandbox = scratch.path / "sandbox/scripted"
    files = {p.name: p.read_bytes() for p in sandbox.iterdir() if p.is_file()}
    holder = hold_lock(scratch.path / KERNEL_LOCK)
    try:
        for args in (["step", "--opt", "fast_math"], ["run", "--resume"], ["init", "--new"]):
            code, out, err = scratch.cli(args[0], "--kernel", "scripted", *args[1:])
            assert code == 2 and f"pid {holder.pid}" in out["error"], (args, out, err)
            assert "`perfloop run --kernel scripted`" in out["error"]
        for reader in ("status", "report", "next"):
            code, out, err = scratch.cli(reader, "--kernel", "scripted")
            assert code == 0, (reader, err)
    finally:
        holder.kill()
        holder.wait()
    assert scratch.snapshot() == before
    assert {p.name: p.read_bytes() for p in sandbox.iterdir() if p.is_file()} == files
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 0, err  # the holder died: its lock is free


def test_two_runs_of_kernels_in_one_working_tree_are_one_at_a_time(scratch):
    """Runs of two kernels in one working tree would share its branch and index."""
    tree_lock = Path(git(scratch.path, "rev-parse", "--absolute-git-dir")) / "perfloop.lock"
    holder = hold_lock(tree_lock, command="perfloop run --kernel other")
    try:
        code, out, _ = scratch.cli("init", "--kernel", "scripted")
        assert code == 2 and "working tree" in out["error"] and f"pid {holder.pid}" in out["error"]
    finally:
        holder.kill()
        holder.wait()
    assert not (scratch.path / "sandbox/scripted/state.json").exists()


# ---- commands started together --------------------------------------------------------------
WRITERS = {"run": ["run", "--max-iterations", "1"], "resume": ["run", "--resume",
                                                                "--max-iterations", "1"],
           "init": ["init"], "new": ["init", "--new"], "step": ["step", "--opt", "fast_math"],
           "agent": ["step", "--describe", "by hand"]}
READERS = {"status": ["status"], "report": ["report"], "next": ["next"]}
COMMANDS = {**WRITERS, **READERS}


def _refusal_is_fair(out: dict) -> bool:
    """A refused command (exit 2) said why in one line, as a refusal (not a bug's line)."""
    error = out["error"]
    return "internal error" not in error and len(error.splitlines()) == 1


def _check_consistent(scratch: Scratch) -> None:
    """One run at most (one branch), its record and table in step, nothing half done."""
    branches = git(scratch.path, "branch", "--list", "cutile-perf-scripted-*").split()
    state_path = scratch.path / "sandbox/scripted/state.json"
    if not state_path.exists():
        assert [b for b in branches if b != "*"] == [] and scratch.branch() == "main"
        return
    state = json.loads(state_path.read_text())
    assert [b for b in branches if b != "*"] == [state["branch"]]
    recs = scratch.records()
    rows = table.read_rows(scratch.path / "sandbox/scripted/perf_results.md")
    assert [r["iteration"] for r in recs] == list(range(len(recs)))
    assert [int(row[0]) for row in rows] == list(range(len(recs)))
    assert state["in_flight"] is None and scratch.head() == state["incumbent"]
    assert git(scratch.path, "status", "--porcelain") == ""


def _start_together(scratch: Scratch, names: list, delays: list) -> list:
    procs, t0 = [], time.monotonic()
    for name, delay in sorted(zip(names, delays), key=lambda x: x[1]):
        time.sleep(max(0.0, t0 + delay - time.monotonic()))
        procs.append((name, spawn(scratch.path, COMMANDS[name][0], "--kernel", "scripted",
                                  *COMMANDS[name][1:])))
    return [(name, *answer(proc)) for name, proc in procs]


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(started=st.booleans(),
       names=st.lists(st.sampled_from(sorted(COMMANDS)), min_size=2, max_size=3).filter(
           lambda ns: any(n in WRITERS for n in ns)),
       delays=st.lists(st.sampled_from([0.0, 0.1, 0.3]), min_size=3, max_size=3))
@example(started=False, names=["run", "run"], delays=[0.0, 0.3, 0.0])   # the issue's case
@example(started=True, names=["step", "resume", "status"], delays=[0.0, 0.0, 0.1])
def test_commands_started_together_leave_one_consistent_run(tmp_path_factory, started, names,
                                                            delays):
    scratch = Scratch(tmp_path_factory.mktemp("together") / "repo")
    if started:
        assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    results = _start_together(scratch, names, delays)
    for name, code, out, err in results:
        assert "Traceback" not in err and "internal error" not in (out or {}).get("error", "")
        assert code in (0, 2), (name, code, out, err)
        if code == 2:
            assert _refusal_is_fair(out), (name, out)
    _check_consistent(scratch)
    if (scratch.path / "sandbox/scripted/state.json").exists():
        code, _, err = scratch.cli("run", "--kernel", "scripted", "--resume",
                                   "--max-iterations", "1")
        assert code == 0, err
        _check_consistent(scratch)


# ---- the table against the record -----------------------------------------------------------
def test_a_table_that_lost_rows_is_rewritten_from_the_record(scratch):
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    assert scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math")[0] == 0
    path = scratch.path / "sandbox/scripted/perf_results.md"
    whole = path.read_text()
    path.write_text(table.HEADER)  # two experiments, no row
    code, out, err = scratch.cli("status", "--kernel", "scripted")
    assert code == 0 and len(out["experiments"]) == 2 and path.read_text() == table.HEADER
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "tile_shape")
    assert code == 0, err
    assert "rewritten from the record" in err
    assert path.read_text().startswith(whole) and len(table.read_rows(path)) == 3
    assert [p.read_text() for p in path.parent.glob("perf_results.replaced-*.md")] == [
        table.HEADER]
    assert_consistent(scratch, 3)


def test_new_sets_aside_a_record_that_cannot_be_repaired(scratch):
    """The issue's dead end: two runs at once had left two iteration-0 baselines; every
    command, --new included, refused."""
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    records = scratch.path / "sandbox/scripted/experiments.jsonl"
    records.write_text(records.read_text() * 2)
    code, out, _ = scratch.cli("status", "--kernel", "scripted")
    assert code == 2 and "--new" in out["error"] and "once each" in out["error"]
    code, out, err = scratch.cli("init", "--kernel", "scripted", "--new")
    assert code == 0, err
    archived = list((scratch.path / "sandbox/_archive/scripted").iterdir())
    assert len(archived) == 1 and len((archived[0] / "experiments.jsonl").read_text()
                                      .splitlines()) == 2
    assert_consistent(scratch, 1)


def test_the_issues_two_runs_leave_one_run(scratch):
    """Two `run`s 0.3 s apart (issue 29): one runs, the other is refused naming it."""
    first = spawn(scratch.path, "run", "--kernel", "scripted", "--max-iterations", "1")
    time.sleep(0.3)
    second = answer(spawn(scratch.path, "run", "--kernel", "scripted", "--max-iterations", "1"))
    first = answer(first)
    codes = sorted([first[0], second[0]])
    assert codes == [0, 2], (first, second)
    refused = first if first[0] == 2 else second
    assert "is in use by another perfloop command" in refused[1]["error"]
    _check_consistent(scratch)
    assert len(scratch.records()) == 2
    assert subprocess.run(["git", "fsck", "--no-progress"], cwd=scratch.path).returncode == 0
