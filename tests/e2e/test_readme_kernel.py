"""A kernel written from the README alone, driven through the CLI the way the README's
"For agents" section says: init, next, step --opt, step --describe, status, report, all --json.

The kernel (tests/readme_kernel/kernel/) is a CPU-timed row-wise RMSNorm whose launch spins until
a knob-derived budget has elapsed, so its measured times are nearly deterministic:
fast_math is 20% faster (kept), memory_path=gather_scatter 25% slower (reverted), tile [1, 2048]
15% faster (kept). The test copies it and its judge into a fresh git repository laid out as the
README says (kernels/<name>/, tests/<judge>.py, playbook/), commits them and runs perfloop there.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

MAIN = ROOT          # the perfloop checkout (/work/main)
HERE = ROOT / "tests" / "readme_kernel"
NAME = "rmsnorm"
KDIR = f"kernels/{NAME}"

# README, "For agents": fields every answer, and each command's answer, carries.
EXPERIMENT_FIELDS = {"iteration", "kind", "optimization", "knob", "value", "describe", "status",
                     "correctness", "latency_ms", "gain", "reason", "commit", "ref"}
STATUS_FIELDS = {"kernel", "run_id", "branch", "kernel_class", "intensity_flop_per_byte",
                 "base_commit", "incumbent", "baseline_latency_ms", "speedup_vs_baseline",
                 "iterations", "experiments", "stopped", "stopped_by", "interrupted", "in_flight",
                 "table", "record"}
INCUMBENT_FIELDS = {"commit", "iteration", "latency_ms", "knobs"}
SUGGESTION_FIELDS = {"id", "title", "family", "knob", "candidates", "rank", "reason"}


def _no_nan(token):
    raise AssertionError(f"non-strict JSON constant {token!r}")


def _git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


class Repo:
    def __init__(self, root):
        self.root = root
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(MAIN), env.get("PYTHONPATH")) if p)
        self.env = env

    def git(self, *args):
        return _git(self.root, *args)

    def perfloop(self, *args, expect=0):
        """Run `python -m perfloop ARGS --kernel NAME --json`; check the exit code and the
        README's envelope, return the parsed answer."""
        cmd = [sys.executable, "-m", "perfloop", *args, "--kernel", NAME, "--json"]
        p = subprocess.run(cmd, cwd=self.root, env=self.env, capture_output=True, text=True,
                           timeout=600)
        where = f"{' '.join(args)}: rc={p.returncode}\nstdout={p.stdout[-3000:]}\nstderr={p.stderr[-3000:]}"
        assert p.returncode == expect, where
        lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
        assert len(lines) == 1, where                   # one JSON object on stdout
        answer = json.loads(lines[0], parse_constant=_no_nan)
        assert answer["schema"] == 1, where
        assert answer["command"] == args[0], where
        assert answer["ok"] is (expect == 0), where
        if expect != 0:
            assert set(answer) >= {"error", "exit_code"}, where
            assert answer["exit_code"] == expect, where
            assert "\n" not in answer["error"] and answer["error"], where
        return answer

    def clean(self):
        return self.git("status", "--porcelain") == ""


def check_experiment(e):
    assert EXPERIMENT_FIELDS <= set(e), e
    assert e["kind"] in ("baseline", "playbook", "agent")
    assert e["status"] in ("keep", "revert", "crash")
    assert e["correctness"] in ("PASS", "FAIL")
    assert re.fullmatch(r"[0-9a-f]{40}", e["commit"]), e
    assert e["ref"].startswith("refs/perfloop/"), e


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(HERE / "kernel", root / KDIR,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (root / "tests").mkdir()
    shutil.copy2(HERE / "judge_readme.py", root / "tests" / f"test_{NAME}.py")
    shutil.copytree(MAIN / "playbook", root / "playbook",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.name", "readme tester")
    _git(root, "config", "user.email", "readme@example.invalid")
    _git(root, "config", "commit.gpgsign", "false")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "rmsnorm kernel and its judge")
    return Repo(root)


def test_readme_kernel_agent_session(repo):
    start = repo.git("rev-parse", "HEAD")

    # 1. init: branch and baseline (iteration 0), kept.
    init = repo.perfloop("init")
    assert {"experiment", "status", "undone"} <= set(init)
    base = init["experiment"]
    check_experiment(base)
    assert base["iteration"] == 0 and base["kind"] == "baseline"
    assert base["status"] == "keep", base["reason"]
    assert base["correctness"] == "PASS" and base["latency_ms"] > 0
    assert init["undone"] is None
    st = init["status"]
    assert STATUS_FIELDS <= set(st)
    run_id = st["run_id"]
    assert run_id.startswith(f"cutile-perf-{NAME}-")
    assert repo.git("rev-parse", "--abbrev-ref", "HEAD") == run_id
    assert st["base_commit"] == start
    assert st["kernel_class"] == "memory-bound"       # 4 FLOP per 8 bytes: under 10 FLOP/byte
    assert repo.clean()

    # 2. next / step --opt the top suggestion, three times.
    expected = [("fast_math", "keep", True), ("memory_path", "revert", "gather_scatter"),
                ("tile_shape", "keep", [1, 2048])]
    for opt, status, value in expected:
        nxt = repo.perfloop("next")
        assert {"kernel_class", "stopped", "suggestions"} <= set(nxt)
        assert nxt["stopped"] is None and nxt["suggestions"]
        for s in nxt["suggestions"]:
            assert SUGGESTION_FIELDS <= set(s), s
        top = nxt["suggestions"][0]["id"]
        assert top == opt, [s["id"] for s in nxt["suggestions"]]
        step = repo.perfloop("step", "--opt", top)
        assert {"experiment", "incumbent", "stopped", "next"} <= set(step)
        e = step["experiment"]
        check_experiment(e)
        assert e["kind"] == "playbook" and e["optimization"] == opt
        assert e["correctness"] == "PASS"
        assert e["status"] == status, e["reason"]
        assert e["value"] == value
        assert INCUMBENT_FIELDS <= set(step["incumbent"])
        assert step["stopped"] is None
        assert isinstance(step["next"], list) and len(step["next"]) <= 3
        assert top not in step["next"]
        # the branch sits on the incumbent, the folder is clean
        assert repo.git("rev-parse", "HEAD") == step["incumbent"]["commit"]
        if status == "keep":
            assert step["incumbent"]["commit"] == e["commit"] and e["gain"] > 0.05
        else:
            assert step["incumbent"]["commit"] != e["commit"] and e["gain"] < 0
        assert repo.clean()
    knobs = json.loads((repo.root / KDIR / "knobs.json").read_text())
    assert knobs["fast_math"] is True and knobs["tile"] == [1, 2048]
    assert knobs["memory_path"] == "load_store"       # the revert restored it

    # 3. Refusals: exit 2, one line, nothing changed.
    head = repo.git("rev-parse", "HEAD")
    n_before = len(repo.perfloop("status")["experiments"])
    toml = repo.root / KDIR / "kernel.toml"
    toml.write_text(toml.read_text().replace("rtol = 1e-5", "rtol = 1e-1"))
    refused = repo.perfloop("step", "--describe", "loosen the tolerance", expect=2)
    assert "kernel.toml" in refused["error"]
    assert repo.git("rev-parse", "HEAD") == head
    assert repo.git("status", "--porcelain").split() == ["M", f"{KDIR}/kernel.toml"]  # left as it was
    assert "rtol = 1e-1" in toml.read_text()
    repo.git("checkout", "--", f"{KDIR}/kernel.toml")
    scratch = repo.root / KDIR / "notes.txt"
    scratch.write_text("uncommitted\n")
    refused = repo.perfloop("step", "--opt", "occupancy", expect=2)
    assert "uncommitted" in refused["error"]
    scratch.unlink()
    # an argument error is one JSON object too
    refused = repo.perfloop("step", expect=2)
    assert repo.git("rev-parse", "HEAD") == head and repo.clean()
    assert len(repo.perfloop("status")["experiments"]) == n_before

    # 4. step --describe: my own uncommitted edit inside the folder (a slower launch: reverted,
    #    and the edit stays reachable at experiment.ref).
    kpy = repo.root / KDIR / "kernel.py"
    original = kpy.read_text()
    assert "SPIN_SCALE = 1.0\n" in original
    kpy.write_text(original.replace("SPIN_SCALE = 1.0\n", "SPIN_SCALE = 1.3\n"))
    step = repo.perfloop("step", "--describe", "spin 30% longer per launch")
    e = step["experiment"]
    check_experiment(e)
    assert e["kind"] == "agent" and e["describe"] == "spin 30% longer per launch"
    assert e["correctness"] == "PASS"
    assert e["status"] == "revert", e["reason"]
    assert kpy.read_text() == original                 # folder back at the incumbent
    assert "SPIN_SCALE = 1.3" in repo.git("show", f"{e['ref']}:{KDIR}/kernel.py")
    assert repo.git("rev-parse", "HEAD") == step["incumbent"]["commit"] == head
    assert repo.clean()

    # 5. status: every experiment, refs resolving to their commits.
    st = repo.perfloop("status")
    assert STATUS_FIELDS <= set(st)
    assert st["run_id"] == run_id and st["branch"] == run_id
    exps = st["experiments"]
    assert [x["iteration"] for x in exps] == [0, 1, 2, 3, 4]
    assert st["iterations"] == len(exps)
    for x in exps:
        check_experiment(x)
        assert repo.git("rev-parse", x["ref"]) == x["commit"], x
        assert repo.git("cat-file", "-t", x["commit"]) == "commit"
    statuses = [x["status"] for x in exps]
    assert statuses == ["keep", "keep", "revert", "keep", "revert"]
    assert st["incumbent"]["iteration"] == 3
    assert st["incumbent"]["commit"] == exps[3]["commit"]
    assert st["baseline_latency_ms"] == pytest.approx(exps[0]["latency_ms"])
    assert st["speedup_vs_baseline"] > 1.3              # 1 / (0.8 * 0.85) = 1.47
    assert st["stopped"] is None and st["in_flight"] is None

    # the table: one row per experiment, matching it
    table = Path(st["table"])
    if not table.is_absolute():
        table = repo.root / table
    assert table == repo.root / "sandbox" / NAME / "perf_results.md"
    lines = table.read_text().splitlines()
    header = [c.strip() for c in lines[0].strip().strip("|").split("|")]
    assert header == ["iteration", "optimization", "latency_ms", "correctness", "status"]
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[2:] if ln.strip()]
    assert len(rows) == len(exps)
    for row, x in zip(rows, exps):
        it, opt, lat, corr, stat = row
        assert int(it) == x["iteration"]
        assert corr == x["correctness"] and stat == x["status"]
        assert math.isclose(float(lat), x["latency_ms"], rel_tol=1e-5), (row, x)
        if x["kind"] == "agent":
            assert opt == x["describe"]
        else:
            assert opt.startswith(x["optimization"])
    # the record: one JSON object per experiment, same commits and refs
    record = Path(st["record"])
    if not record.is_absolute():
        record = repo.root / record
    recs = [json.loads(ln, parse_constant=_no_nan) for ln in record.read_text().splitlines() if ln.strip()]
    recs = [r for r in recs if r.get("kind") != "confirmation"]
    assert [(r["iteration"], r["commit"], r["ref"], r["status"]) for r in recs] == \
        [(x["iteration"], x["commit"], x["ref"], x["status"]) for x in exps]

    # 6. report
    rep = repo.perfloop("report")
    assert rep["counts"] == {"keep": 3, "revert": 2}
    assert rep["experiments"] == 5

    # sandbox/ kept out of git, nothing left behind, still on the run's branch
    assert "sandbox" in (repo.root / ".git" / "info" / "exclude").read_text()
    assert repo.clean()
    assert repo.git("rev-parse", "--abbrev-ref", "HEAD") == run_id
    assert repo.git("rev-parse", "main") == start
