"""Profiler evidence: `perfloop profile` with a stand-in for ncu (tests/support/fake_ncu.py) on
PATH, with one that lacks permission to read counters, and with none; and how a recorded
profile re-ranks `perfloop next`. ncu's output and the rules alone:
tests/unit/measure/test_ncu.py and tests/unit/plan/test_profile_rank.py."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, Scratch, pythonpath

from perfloop.isolation import sandbox

FAKE = ROOT / "tests" / "support" / "fake_ncu.py"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
GMMA = "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"


def path_without_ncu() -> str:
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not (Path(d) / "ncu").exists())


@pytest.fixture
def fake_ncu(tmp_path):
    """A folder holding an executable `ncu` (the stand-in), and the log of its calls."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "ncu"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder, tmp_path / "ncu-calls.jsonl"


def cli(scratch, *args, path: str, json_out=True, **env):
    proc = subprocess.run([sys.executable, "-m", "perfloop", *args, *(["--json"] if json_out else [])],
                          cwd=scratch.path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": pythonpath(), "PATH": path, **env})
    if not json_out:
        return proc.returncode, proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def profile_with(started, fake_ncu, mode: str, **env):
    folder, log = fake_ncu
    return cli(started, "profile", "--kernel", "scripted",
               path=f"{folder}{os.pathsep}{path_without_ncu()}", FAKE_NCU_MODE=mode,
               FAKE_NCU_LOG=str(log), **env)


# ---- perfloop profile, and next ------------------------------------------------------------------
def test_profile_records_ncus_values_and_next_ranks_by_them(started, fake_ncu):
    code, out, err = profile_with(started, fake_ncu, "memory")
    assert code == 0, err
    assert out["kernel_name"] == "cutile_kernel_main" and out["shape"] == "head"
    assert out["metrics"]["dram_pct"] == {"metric": DRAM, "value": 86.41, "unit": "%"}
    assert out["metrics"]["duration_ns"]["value"] == 612448.0
    record = json.loads((started.path / "sandbox/scripted/profile.json").read_text())
    assert record["commit"] == started.head() and record["ncu"]["version"] == "2024.1.1.0"
    assert record["command"][0].endswith("ncu") and "--csv" in record["command"]
    assert {k["name"] for k in record["kernels"]} == {"vectorized_elementwise_kernel",
                                                     "cutile_kernel_main"}
    assert record["kernels"][1]["metrics"][DRAM]["raw"] == "86.41"
    assert record["knobs"]["tile"] == [1, 1024] and record["wall_s"] > 0
    [call] = [json.loads(line) for line in fake_ncu[1].read_text().splitlines()]
    # ncu ran the incumbent's launch at the headline shape, and it ran to its end
    assert call["app"][1] == "-c" and call["app"][4] == "perfloop.child.profile_target"
    assert call["app_returncode"] == 0
    assert call["options"]["--target-processes"] == "all"
    assert call["options"]["--profile-from-start"] == "off"
    assert call["options"]["--clock-control"] == "none"
    target = json.loads(Path(call["app"][-1]).read_text())
    assert target["shape"]["name"] == "head" and target["launches"] == 1
    assert list((started.path / "sandbox/scripted/work").glob("profile-*/k-*/target-done.json"))

    code, memory, _ = started.cli("next", "--kernel", "scripted")
    assert code == 0 and memory["profile"]["used"]
    assert memory["suggestions"][0]["id"] == "tile_shape"
    assert f"{DRAM} = 86.41%" in memory["suggestions"][0]["reason"]

    code, out, err = profile_with(started, fake_ncu, "compute")
    assert code == 0, err
    code, compute, _ = started.cli("next", "--kernel", "scripted")
    assert compute["suggestions"][0]["id"] == "fast_math"
    assert f"{SM} = 83.14%" in compute["suggestions"][0]["reason"]
    assert [s["id"] for s in memory["suggestions"]] != [s["id"] for s in compute["suggestions"]]
    code, text, _ = cli(started, "next", "--kernel", "scripted", path=path_without_ncu(),
                        json_out=False)
    assert code == 0 and "profile of the incumbent" in text and f"{SM} = 83.14%" in text
    code, text, _ = cli(started, "report", "--kernel", "scripted", path=path_without_ncu(),
                        json_out=False)
    assert "profile (Nsight Compute, the final incumbent, kernel cutile_kernel_main): " in text
    assert "sm_pct 83.14%" in text


@pytest.mark.skipif(sandbox.abi() < 1, reason="this kernel has no Landlock")
def test_the_profiled_kernel_code_is_confined_like_every_child(scratch, fake_ncu, tmp_path):
    """The profiled process runs the incumbent's code (`perfloop run` profiles after each
    keep): it writes only its own folder, as a launcher does. Unconfined, it wrote here."""
    outside = tmp_path / "outside"
    outside.mkdir()
    knobs = json.loads((scratch.kernel / "knobs.json").read_text())
    (scratch.kernel / "knobs.json").write_text(json.dumps({**knobs, "mode": "write-outside"}))
    scratch.commit_all("a kernel that writes outside its folder")
    assert scratch.cli("init", "--kernel", "scripted", env={"SCRIPTED_OUTSIDE": str(outside)})[0] == 0
    assert not list(outside.iterdir())
    code, out, err = profile_with(scratch, fake_ncu, "memory", SCRIPTED_OUTSIDE=str(outside))
    assert code == 0, err
    [call] = [json.loads(line) for line in fake_ncu[1].read_text().splitlines()]
    assert call["app_returncode"] == 0 and not list(outside.iterdir())


def test_a_profile_of_an_older_incumbent_is_not_used(scratch, fake_ncu):
    scratch.script([{"when": {"fast_math": True}, "factor": {"*": 0.8}}])
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    code, plain, _ = scratch.cli("next", "--kernel", "scripted")
    assert plain["profile"] is None
    assert profile_with(scratch, fake_ncu, "memory")[0] == 0
    code, ranked, _ = scratch.cli("next", "--kernel", "scripted")
    assert ranked["suggestions"][0]["id"] == "tile_shape"
    code, step, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math")
    assert step["experiment"]["status"] == "keep"
    code, after, _ = scratch.cli("next", "--kernel", "scripted")
    assert after["profile"]["used"] is False and "older incumbent" in after["profile"]["why"]
    assert after["suggestions"][0]["id"] == "tile_shape"    # by class: fast math was tried
    assert all("the profile" not in s["reason"] for s in after["suggestions"])


def test_metrics_ncu_lacks_are_dropped_and_the_rest_measured(started, fake_ncu):
    code, out, err = profile_with(started, fake_ncu, "memory", FAKE_NCU_UNKNOWN=GMMA)
    assert code == 0, err
    assert out["unavailable"] == [GMMA] and "dram_pct" in out["metrics"]
    calls = [json.loads(line) for line in fake_ncu[1].read_text().splitlines()]
    assert len(calls) == 2 and calls[0]["app_returncode"] is None   # the first never ran it
    assert GMMA in calls[0]["options"]["--metrics"] and GMMA not in calls[1]["options"]["--metrics"]


def test_without_permission_to_read_counters_profile_says_so_in_one_line(started, fake_ncu):
    before = started.snapshot()
    folder, log = fake_ncu
    code, text, err = cli(started, "profile", "--kernel", "scripted", json_out=False,
                          path=f"{folder}{os.pathsep}{path_without_ncu()}", FAKE_NCU_MODE="perm")
    assert code == 3 and text == ""
    assert len(err.strip().splitlines()) == 1 and "ERR_NVGPUCTRPERM" in err
    assert "Traceback" not in err and started.snapshot() == before
    assert not (started.path / "sandbox/scripted/profile.json").exists()
    code, nxt, _ = started.cli("next", "--kernel", "scripted")
    assert nxt["profile"] is None and nxt["suggestions"][0]["id"] == "fast_math"


def test_without_ncu_profile_says_so_in_one_line(started):
    code, out, _ = cli(started, "profile", "--kernel", "scripted", path=path_without_ncu())
    assert code == 3 and out["ok"] is False and "ncu" in out["error"] and "\n" not in out["error"]
    code, text, err = cli(started, "profile", "--kernel", "scripted", path=path_without_ncu(),
                          json_out=False)
    assert code == 3 and err.startswith("perfloop: error: profiling needs Nsight Compute")
    assert len(err.strip().splitlines()) == 1


def test_profile_before_a_run_and_with_bad_arguments(scratch):
    code, out, _ = scratch.cli("profile", "--kernel", "scripted")
    assert code == 2 and "no run of 'scripted' yet" in out["error"]
    code, out, _ = scratch.cli("profile", "--kernel", "scripted", "--launch-count", "-1")
    assert code == 2 and "must be 0 or more" in out["error"]


def test_run_profile_profiles_each_new_incumbent_and_ranks_by_it(scratch, fake_ncu):
    scratch.script([{"when": {"fast_math": True}, "factor": {"*": 0.8}},
                    {"when": {"tile": [1, 2048]}, "factor": {"*": 0.9}}])
    scratch.commit_all("script")
    folder, log = fake_ncu
    code, out, err = cli(scratch, "run", "--kernel", "scripted", "--max-iterations", "2",
                         "--profile", path=f"{folder}{os.pathsep}{path_without_ncu()}",
                         FAKE_NCU_MODE="memory", FAKE_NCU_LOG=str(log))
    assert code == 0, err
    done = out["experiments_this_call"]
    kept = [e["iteration"] for e in done if e["status"] == "keep"]
    assert [p["iteration"] for p in out["profiles"]] == kept and kept[0] == 0
    assert all(p["wall_s"] > 0 and p["metrics"]["dram_pct"]["value"] == 86.41
               for p in out["profiles"])
    # the DRAM-bound profile of the baseline put the tile first, ahead of fast math
    assert [e["optimization"] for e in done] == ["baseline", "tile_shape", "fast_math"]
    record = json.loads((scratch.path / "sandbox/scripted/profile.json").read_text())
    assert record["commit"] == scratch.head()


def test_run_profile_without_ncu_says_so_once_and_goes_on(scratch):
    scratch.script([{"when": {"fast_math": True}, "factor": {"*": 0.8}}])
    scratch.commit_all("script")
    code, text, err = cli(scratch, "run", "--kernel", "scripted", "--max-iterations", "1",
                          "--profile", path=path_without_ncu(), json_out=False)
    assert code == 0 and "fast_math" in text           # baseline kept, then fast math kept
    assert err.splitlines() == [err.splitlines()[0]]   # told once, though two were kept
    assert err.startswith("profile after iteration 0: profiling needs Nsight Compute")
    assert len(scratch.records()) == 2 and scratch.records()[1]["status"] == "keep"


# ---- on the GPU, with the real ncu ---------------------------------------------------------------
@pytest.mark.gpu
def test_real_ncu_profiles_swiglu_and_matmul_and_next_ranks_them_apart(tmp_path):
    if not any((Path(d) / "ncu").exists() for d in os.environ["PATH"].split(os.pathsep) if d):
        pytest.skip("no ncu on PATH")
    s = Scratch.of_shipped(tmp_path / "repo", "swiglu", "matmul")
    ranked = {}
    for name in ("swiglu", "matmul"):
        code, out, err = s.cli("init", "--kernel", name)
        assert code == 0, (out, err)
        code, out, err = s.cli("profile", "--kernel", name)
        print(name, json.dumps(out, indent=1))
        assert code == 0, (out, err)
        m = out["metrics"]
        assert "cutile" in out["kernel_name"] or name in out["kernel_name"], out["kernel_name"]
        for key in ("duration_ns", "dram_pct", "sm_pct", "registers", "occupancy_pct"):
            assert key in m and m[key]["value"] >= 0, key
        code, nxt, err = s.cli("next", "--kernel", name)
        assert code == 0 and nxt["profile"]["used"], (nxt, err)
        ranked[name] = nxt["suggestions"]
        print(name, [(x["id"], x["reason"]) for x in nxt["suggestions"][:4]])
        record = json.loads((s.path / "sandbox" / name / "profile.json").read_text())
        ranked[name + "_metrics"] = {k: v["value"] for k, v in record["metrics"].items()}
        ranked[name + "_names"] = [v["metric"] for v in record["metrics"].values()]
    # an elementwise kernel at its copy floor keeps DRAM busy; a plain 64x64x32 matmul does not
    assert ranked["swiglu_metrics"]["dram_pct"] >= 60 > ranked["matmul_metrics"]["dram_pct"]
    assert "tensor_pct" in ranked["matmul_metrics"]
    assert [x["id"] for x in ranked["swiglu"]] != [x["id"] for x in ranked["matmul"]]
    for name in ("swiglu", "matmul"):
        # at least one suggestion was moved by a metric, and its reason names that metric
        quoted = [x for x in ranked[name]
                  if any(f"{metric} = " in x["reason"] for metric in ranked[name + "_names"])]
        assert quoted, ranked[name]
