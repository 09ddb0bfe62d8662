"""A step whose git work fails after its record line says that the iteration was recorded
(exit 1), and resume finishes it (tests/unit/run/test_after_record.py: the rule alone)."""

from conftest import git


def test_a_step_whose_ref_cannot_be_set_after_its_record_says_it_was_recorded(started):
    # git cannot write the experiment's ref (a lock another git holds): the record line is
    # written, so the experiment stands and resume finishes it
    branch = started.branch()
    lock = started.path / ".git" / "refs" / "perfloop" / branch / "iter-01.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("")
    code, out, err = started.cli("step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 1 and out["exit_code"] == 1, err
    assert out["error"].startswith("iteration 1 was recorded ("), out["error"]
    assert "finishing it" in out["error"] and "git failed" in out["error"], out["error"]
    assert "step --resume" in out["error"] and "unrecorded" not in out["error"]
    assert len(started.records()) == 2
    lock.unlink()
    code, out, err = started.cli("step", "--kernel", "scripted", "--resume")
    assert code == 0, err
    assert out["experiment"]["iteration"] == 1
    code, status, _ = started.cli("status", "--kernel", "scripted")
    assert status["in_flight"] is None and status["iterations"] == 2
    assert git(started.path, "rev-parse", f"refs/perfloop/{branch}/iter-01") == \
        started.records()[1]["commit"]
    assert started.table().count("\n| ") == 2
