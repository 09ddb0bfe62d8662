"""A record line written before perfloop refused times of 0 ms, read by a run's commands (the
record's types alone: tests/unit/store/test_records.py)."""

import json


def test_a_record_holding_a_zero_ms_keep_is_read_and_the_row_named(started):
    """Before perfloop refused times of 0 ms, a busy machine kept one as "100% faster", and
    status, report, next, step and run --resume then ended dividing by zero."""
    from perfloop.store import table

    run = started.path / "sandbox" / "scripted"
    base = json.loads((run / "experiments.jsonl").read_text().splitlines()[0])
    zero = {**base, "iteration": 1, "kind": "playbook", "optimization": "fast_math",
            "knob": "fast_math", "value": True, "latency_ms": 0.0,
            "decision": {**base["decision"], "gain": 1.0, "reason": "100.00% faster"}}
    with open(run / "experiments.jsonl", "a") as f:
        f.write(json.dumps(zero) + "\n")
    table.append_row(run / "perf_results.md",
                     table.format_row(1, "fast_math: fast_math=true", 0.0, "PASS", "keep"))
    git_ref = ["git", "update-ref", "refs/perfloop/" + base["branch"] + "/iter-01", base["commit"]]
    import subprocess

    subprocess.run(git_ref, cwd=started.path, check=True)
    for command in ("status", "report", "next"):
        code, out, err = started.cli(command, "--kernel", "scripted")
        assert code == 0, (command, out, err)
    code, out, _ = started.cli("status", "--kernel", "scripted")
    assert out["impossible"] == [1] and out["speedup_vs_baseline"] == 1.0
