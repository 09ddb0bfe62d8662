"""An agent's session, driven through --json only, as README's 'For agents' describes it."""

from conftest import git

STEP_KEYS = {"schema", "command", "ok", "experiment", "incumbent", "stopped", "stopped_by",
             "next", "never_tried", "retuned"}
EXPERIMENT_KEYS = {"iteration", "kind", "optimization", "knob", "value", "describe", "what",
                   "status", "correctness", "latency_ms", "gain", "reason", "commit", "ref"}
SUGGESTION_KEYS = {"id", "title", "family", "knob", "knobs", "candidates", "rank", "reason"}
STATUS_KEYS = {"schema", "command", "ok", "kernel", "run_id", "branch", "kernel_class",
               "intensity_flop_per_byte", "class_basis", "base_commit", "incumbent",
               "baseline_latency_ms", "speedup_vs_baseline", "iterations", "experiments",
               "stopped", "stopped_by", "interrupted", "in_flight",
               "table", "record", "never_tried", "settings", "archived", "impossible"}


def test_agent_drives_init_next_step_status_through_json(scratch):
    scratch.script([{"when": {"fast_math": True}, "factor": {"*": 0.9}},
                    {"when": {"occupancy": 2}, "factor": {"*": 0.95}},
                    {"when": {"occupancy": 4}, "factor": {"*": 0.97}}])
    scratch.commit_all("script")
    code, init, _ = scratch.cli("init", "--kernel", "scripted")
    assert code == 0 and init["ok"] and init["experiment"]["optimization"] == "baseline"
    assert set(init["experiment"]) == EXPERIMENT_KEYS
    assert init["status"]["kernel_class"] == "memory-bound"
    assert "fixed bounds" in init["status"]["class_basis"]   # a CPU clock: no ridge point

    steps = []
    while True:
        code, nxt, _ = scratch.cli("next", "--kernel", "scripted")
        assert code == 0 and all(set(s) == SUGGESTION_KEYS for s in nxt["suggestions"])
        if nxt["stopped"] or not nxt["suggestions"]:
            break
        top = nxt["suggestions"][0]
        assert top["id"] not in steps                      # what was tried is skipped
        code, step, _ = scratch.cli("step", "--kernel", "scripted", "--opt", top["id"])
        assert code == 0 and set(step) == STEP_KEYS and set(step["experiment"]) == EXPERIMENT_KEYS
        assert step["experiment"]["optimization"] == top["id"]
        steps.append(top["id"])
    assert steps[:2] == ["fast_math", "tile_shape"]
    code, status, _ = scratch.cli("status", "--kernel", "scripted")
    assert set(status) == STATUS_KEYS and status["stopped"]
    assert status["incumbent"]["commit"] == scratch.head()
    assert status["incumbent"]["knobs"]["occupancy"] == 2   # the best candidate was carried
    assert [e["optimization"] for e in status["experiments"]] == ["baseline", *steps]

    # the agent's own edit, judged like any other experiment
    knobs = scratch.kernel / "knobs.json"
    knobs.write_text(knobs.read_text().replace('"persistent": false', '"persistent": true'))
    code, step, _ = scratch.cli("step", "--kernel", "scripted", "--describe", "persistent by hand")
    e = step["experiment"]
    assert code == 0 and e["kind"] == "agent" and e["describe"] == "persistent by hand"
    assert e["status"] == "revert" and "no improvement" in e["reason"]
    assert '"persistent": true' in git(scratch.path, "show", f"{e['ref']}:kernels/scripted/knobs.json")
    assert '"persistent": false' in knobs.read_text()

    code, report, _ = scratch.cli("report", "--kernel", "scripted")
    assert code == 0 and report["experiments"] == len(steps) + 2
    assert report["shapes"][0]["speedup"] > 1.1
