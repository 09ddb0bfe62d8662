"""The settings through a run: what init pins (kernel.toml's [rules] and the flags over
rules.toml's), and how a run its time budget stopped goes on with a new budget (the settings
alone: tests/unit/contract/test_settings.py)."""

import json
import shutil

from support.cli import human


def _state(scratch) -> dict:
    return json.loads((scratch.path / "sandbox/scripted/state.json").read_text())


def test_flags_at_init_are_pinned_with_the_run_and_a_later_step_is_not_refused(scratch):
    manifest = scratch.kernel / "kernel.toml"
    manifest.write_text(manifest.read_text() + "\n[rules]\nmax_control_gap = 0.2\n"
                                               "cliff_ratio = 6\n")
    scratch.commit_all("the kernel's own rules")
    code, out, err = scratch.cli("init", "--kernel", "scripted", "--cliff-ratio", "8",
                                 "--time-budget", "900")
    assert code == 0, err
    state = _state(scratch)
    assert state["rules"]["verify"]["max_control_gap"] == 0.2          # kernel.toml's
    assert state["rules"]["measure"]["cliff_ratio"] == 8                # the flag's, over it
    assert state["rules"]["stop"]["time_budget_s"] == 900
    assert state["rules"]["decision"]["keep_gain"] == 0.05              # rules.toml's
    assert state["overrides"] == {"cliff_ratio": 8, "time_budget_s": 900}
    assert out["status"]["settings"] == {
        "max_control_gap": {"value": 0.2, "from": "kernel.toml"},
        "cliff_ratio": {"value": 8, "from": "flag"},
        "time_budget_s": {"value": 900, "from": "flag"}}
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 0, err
    assert out["retuned"] == {}
    code, text, err = human(scratch.path, "status", "--kernel", "scripted")
    assert "settings: max_control_gap 0.2 (kernel.toml), cliff_ratio 8 (flag), " \
           "time_budget_s 900 (flag)" in text, err
    # rules.toml is pinned as ever: another playbook's laxer cliff is refused
    lax = scratch.path.parent / "lax"
    shutil.copytree(scratch.path / "playbook", lax)
    rules = lax / "rules.toml"
    rules.write_text(rules.read_text().replace("keep_gain = 0.05", "keep_gain = 0.5"))
    code, out, _ = scratch.cli("step", "--kernel", "scripted", "--opt", "occupancy",
                               "--playbook", str(lax))
    assert code == 2 and "rules pinned when the run started" in out["error"]
    # the settings that decide what is measured cannot change in a run in progress
    before = scratch.snapshot()
    code, out, _ = scratch.cli("run", "--kernel", "scripted", "--resume", "--cliff-ratio", "3")
    assert code == 2 and "--cliff-ratio is pinned when a run starts" in out["error"]
    assert "--new" in out["error"] and scratch.snapshot() == before
    assert _state(scratch)["rules"]["measure"]["cliff_ratio"] == 8


def test_a_run_its_time_budget_stopped_goes_on_with_a_new_budget(scratch):
    manifest = scratch.kernel / "kernel.toml"
    manifest.write_text(manifest.read_text() + "\n[rules]\ntime_budget_s = 1\n")
    scratch.script([{"when": {"fast_math": True}, "factor": {"*": 0.8}},
                    {"when": {"occupancy": 8}, "factor": {"*": 0.8}}])
    scratch.commit_all("a budget of 1 s for this kernel, and two gains")
    code, out, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0 and out["status"]["stopped_by"] == "time-budget", err
    # the stop says what the budget cut: the catalog entries never tried, and the way on
    untried = out["status"]["never_tried"]
    assert "fast_math" in untried and "occupancy" in untried, untried
    assert f"never tried: {', '.join(untried)}" in out["status"]["stopped"]
    assert "--time-budget" in out["status"]["stopped"]
    code, text, err = human(scratch.path, "status", "--kernel", "scripted")
    assert "stopped: time budget: " in text and "never tried: fast_math" in text, err
    # a step raises it: the stop is lifted, and the run goes on
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math",
                                 "--time-budget", "0")
    assert code == 0, err
    assert out["retuned"] == {"time_budget_s": [1, None]} and out["stopped"] is None
    assert out["never_tried"] is None
    state = _state(scratch)
    assert state["rules"]["stop"]["time_budget_s"] is None and state["stopped"] is None
    assert state["overrides"] == {"time_budget_s": None}
    # ... and a later one lowers it again: the run stops by it
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--opt", "occupancy",
                                 "--time-budget", "1")
    assert code == 0 and out["stopped_by"] == "time-budget", err
    # run --resume with a larger budget goes on from there, here for one iteration
    code, out, err = scratch.cli("run", "--kernel", "scripted", "--resume", "--time-budget",
                                 "100000", "--max-iterations", "1")
    assert code == 0, err
    assert out["retuned"] == {"time_budget_s": [1, 100000]}
    assert out["stopped_by"] == "iterations-asked" and len(out["experiments_this_call"]) == 1
    assert _state(scratch)["overrides"] == {"time_budget_s": 100000}
