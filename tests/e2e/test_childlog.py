"""Every child's log of a run stays within the cap the rules set (the capped log alone:
tests/unit/isolation/test_childlog.py)."""

from perfloop.isolation import childlog

CAP = 64 * 1024


def test_a_kernel_that_prints_on_every_launch_leaves_logs_within_the_cap(scratch):
    """End to end: a kernel printing 32 KB to stdout and to stderr on each launch, and a cap
    of 64 KB: every log of the run keeps at most the cap, and the timer's launchers' (without
    the cap, 61 MB each on the 2-core CPU machine) say what they dropped."""
    knobs = scratch.kernel / "knobs.json"
    knobs.write_text(knobs.read_text().replace('"mode": "ok"', '"mode": "print-32768"'))
    scratch.rules(log_cap_mb="0.0625")
    scratch.commit_all("a kernel left printing")
    code, out, err = scratch.cli("init", "--kernel", "scripted")
    assert code == 0 and out["experiment"]["status"] == "keep", err
    logs = list((scratch.path / "sandbox" / "scripted").rglob("*.log"))
    capped = [log for log in logs if b"bytes of output dropped here" in log.read_bytes()]
    assert len(capped) >= 2               # the incumbent's launcher and its control's, at least
    most = CAP + len(childlog.note(10**12, CAP))
    assert all(log.stat().st_size <= most for log in logs), [
        (log.name, log.stat().st_size) for log in logs]
    assert b"launch " in capped[0].read_bytes()[-CAP // 2:]   # the last of its output is there
