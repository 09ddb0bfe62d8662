"""The fleet end to end on a local Dask cluster of processes: two kernels at once in one
repository, a step across three workers that keeps what the same step keeps on one, and a run
from plain knobs that writes its result."""

import json
import re
from pathlib import Path

import pytest
from conftest import Scratch, git

distributed = pytest.importorskip("distributed")


@pytest.mark.smoke
def test_two_kernels_run_at_once_in_one_repository(scratch):
    """Each in a worktree of its own, its record in the main tree's sandbox/: the user's
    branch and working tree are as they were."""
    second = scratch.path / "kernels" / "second"
    second.mkdir()
    for name in ("kernel.py", "knobs.json", "script.json"):
        (second / name).write_bytes((scratch.kernel / name).read_bytes())
    (second / "kernel.toml").write_text((scratch.kernel / "kernel.toml").read_text().replace(
        'name = "scripted"', 'name = "second"').replace("judge_scripted.py", "judge_second.py"))
    judge = scratch.path / "tests" / "judge_scripted.py"
    (scratch.path / "tests" / "judge_second.py").write_text(
        judge.read_text().replace('"kernels" / "scripted"', '"kernels" / "second"'))
    scratch.commit_all("a second kernel")
    before = scratch.snapshot()
    code, out, err = scratch.cli("run", "--kernel", "scripted", "--kernel", "second",
                                 "--workers", "2", "--max-iterations", "1", timeout=900)
    assert code == 0, _lanes_said(out, err)
    assert set(out["kernels"]) == {"scripted", "second"} and len(out["workers"]) == 2
    for name in ("scripted", "second"):
        rows = (scratch.path / "sandbox" / name / "perf_results.md").read_text().splitlines()
        assert len(rows) == 4, rows   # header, rule, baseline, one step
        assert (scratch.path / "sandbox" / "worktrees" / name / ".git").exists()
        record = json.loads((scratch.path / "sandbox" / name / "experiments.jsonl")
                            .read_text().splitlines()[-1])
        assert record["fleet"]["where"] and record["fleet"]["lost"] == []
    after = scratch.snapshot()   # the user's branch and working tree as they were
    assert (after["status"], after["head"]) == (before["status"], before["head"])
    worktrees = git(scratch.path, "worktree", "list")
    assert "cutile-perf-scripted-" in worktrees and "cutile-perf-second-" in worktrees


@pytest.mark.smoke
def test_a_step_across_three_workers_keeps_what_it_keeps_on_one(tmp_path):
    """The same run, sequential here and on three workers: the same experiments, the same
    outcome for every candidate, the same value kept (timing fields aside)."""
    records = {}
    for where in ("here", "fleet"):
        scratch = Scratch(tmp_path / where)
        scratch.script([{"when": {"tile": [1, 2048]}, "factor": {"*": 0.9}}])
        scratch.commit_all("script")
        fleet = ["--workers", "3"] if where == "fleet" else []
        code, out, err = scratch.cli("run", "--kernel", "scripted", "--max-iterations", "2",
                                     *fleet, timeout=900)
        assert code == 0, (out, err)
        records[where] = scratch.records()

    def essence(r):
        return (r["optimization"], r["status"], r["value"], r["correctness"],
                {label: (o["value"], o["outcome"]) for label, o in r["outcomes"].items()})

    assert [essence(r) for r in records["here"]] == [essence(r) for r in records["fleet"]]
    assert any(r["status"] == "keep" and r["value"] == [1, 2048] for r in records["fleet"])
    assert records["fleet"][-1]["fleet"]["tasks"] > 1   # its candidates went side by side


@pytest.mark.smoke
def test_a_run_from_plain_knobs_starts_on_them_and_writes_its_result(scratch):
    """`run --from plain` (a fleet's): each kernel's run starts on a commit of its kernel.toml
    [plain] knobs in its worktree, and once it stops its RESULTS.md is written from the record
    in the main tree, the user's branch left as it was; `report --all` has its row; a kernel
    with a run already is refused without --new, changing nothing."""
    scratch.rules(max_iterations="1")
    knobs = scratch.kernel / "knobs.json"
    knobs.write_text(knobs.read_text().replace('"fast_math": false', '"fast_math": true'))
    scratch.commit_all("tuned knobs, as a shipped kernel has")
    head = scratch.head()
    code, out, err = scratch.cli("run", "--kernel", "scripted", "--workers", "1", "--from",
                                 "plain", timeout=900)
    assert code == 0, (out, err)
    base = scratch.records()[0]
    assert base["knobs"]["fast_math"] is False   # the baseline ran the plain knobs
    assert "plain knobs" in git(scratch.path, "log", "-1", "--format=%s", base["commit"])
    results = scratch.kernel / "RESULTS.md"
    assert out["kernels"]["scripted"]["results"] == str(results) and results.exists()
    assert scratch.head() == head and scratch.branch() == "main"
    code, out, err = scratch.cli("report", "--all")   # the fleet's summary, a row per kernel
    assert code == 0 and [row["kernel"] for row in out["kernels"]] == ["scripted"], (out, err)
    assert out["kernels"][0]["experiments"] == len(scratch.records())
    snap = scratch.snapshot()
    code, out, err = scratch.cli("run", "--kernel", "scripted", "--workers", "1", "--from",
                                 "plain", timeout=300)
    assert code == 2 and "pass --new" in out["error"] and scratch.snapshot() == snap


def _lanes_said(out: dict, err: str) -> str:
    """Each lane's answer whole, and the traceback a lane's internal error kept."""
    said = [json.dumps(out.get("kernels"), indent=1, default=str), err]
    for answer in (out.get("kernels") or {}).values():
        kept = re.search(r"traceback in (\S+?)\)", str(answer.get("error", "")))
        if kept and Path(kept.group(1)).is_file():
            said.append(Path(kept.group(1)).read_text())
    return "\n".join(said)
