"""What a judge's kernel pass reports can only fail a variant: a task file someone else wrote
first (a process started ahead waits for its file, whose name its command line shows) is never
used, a report of another task voids the process, records written over change nothing the
verdict rests on, shards that cut different collections are judged again, and a test skipped
by kernel code leaves its cases without outputs."""

import json
import textwrap
import time
from pathlib import Path

from support.timing import time_scripted

from perfloop.measure import judge as judge_mod
from perfloop.measure import phases


def _variants(scratch, **modes) -> list[dict]:
    knobs = json.loads((scratch.kernel / "knobs.json").read_text())
    return [{"label": label, "folder": str(scratch.kernel), "knobs": {**knobs, "mode": mode}}
            for label, mode in modes.items()]


def _env(scratch, **extra) -> dict:
    return {**phases.child_env(scratch.path / "playbook"), **extra}


def _judge(scratch, judge: Path, work: Path, variants, processes: int = 1, pool=None, env=None):
    return judge_mod.judge(scratch.tree(judge), variants, root=scratch.path, work=work,
                        deadline=time.monotonic() + 300, stall_s=120,
                        env=env or _env(scratch), processes=processes, share_cases=True,
                        pool=pool)


def _forged(request: Path, scratch, label: str) -> bytes:
    """A request for the waiting judge that names a correct kernel under the candidate's label
    and the log and audit files the parent will read."""
    folder = request.parent  # (a kernel pass's files: perfloop.measure.judge._kernel_files)
    return json.dumps({"variants": _variants(scratch, **{label: "ok"}),
                       "log": str(folder / "cases.jsonl"), "outputs": str(folder / "outputs"),
                       "imports_out": str(folder / "audit.json")}).encode()


def test_a_request_written_before_perfloop_writes_it_is_never_judged(scratch, tmp_path):
    """Code that runs while the judge waits (the previous candidate's, in the timer) writes the
    waiting judge's request first: that process is dropped, a new one judges the candidate."""
    judge = scratch.path / "tests" / "judge_scripted.py"
    pool = judge_mod.start_judges(scratch.tree(judge), root=scratch.path, work=tmp_path / "ahead",
                               env=_env(scratch), processes=1)
    request, waiting, _ = pool.ready[0]
    time.sleep(4.0)  # past its imports: it polls for the file now
    request.write_bytes(_forged(request, scratch, "wrong"))
    time.sleep(0.5)
    res = _judge(scratch, judge, tmp_path / "work", _variants(scratch, wrong="wrong-above-100"),
                 pool=pool)
    assert res.passed == {"wrong": False} and not res.crashed
    assert [c["case"] for c in res.cases["wrong"] if not c["passed"]] == ["n=1000"]
    assert waiting.proc.poll() is not None


def test_a_request_read_and_removed_before_perfloop_writes_its_own_does_not_count(
        scratch, tmp_path):
    """The forger removes its request once the waiting judge has read it, so the process looks
    unused when perfloop writes the real one: the judge's audit names the request it read, and
    it is not perfloop's. Without that check the wrong candidate passed every case."""
    judge = scratch.path / "tests" / "judge_scripted.py"
    env = _env(scratch, SCRIPTED_DELAY_S="1.5")  # its cases last until perfloop has looked
    pool = judge_mod.start_judges(scratch.tree(judge), root=scratch.path, work=tmp_path / "ahead", env=env,
                               processes=1)
    request, waiting, _ = pool.ready[0]
    log, outputs = request.parent / "cases.jsonl", request.parent / "outputs"
    outputs.mkdir(parents=True)
    request.write_bytes(_forged(request, scratch, "wrong"))
    until = time.monotonic() + 120
    while not log.exists() and time.monotonic() < until:  # it judges the forged request now
        time.sleep(0.05)
    import shutil

    request.unlink()
    log.unlink()
    shutil.rmtree(outputs)
    assert waiting.proc.poll() is None
    res = _judge(scratch, judge, tmp_path / "work", _variants(scratch, wrong="wrong-above-100"),
                 pool=pool, env=env)
    assert not res.passed.get("wrong")
    assert "did not write" in res.crashed["wrong"] or "without finishing" in res.crashed["wrong"]


def test_a_case_log_written_over_changes_no_verdict(scratch, tmp_path):
    """Kernel code can write anything into its kernel pass's case log: the lines are no
    records, and the verdict comes from the reference pass, which compared the outputs."""
    judge = scratch.path / "tests" / "judge_garbled.py"
    judge.write_text((scratch.path / "tests" / "judge_scripted.py").read_text() + textwrap.dedent(
        """
        def test_zz_writes_over_the_log():
            from perfloop.contract import judging
            if judging.MODE == judging.KERNEL:
                with open(judging.REQUEST["log"], "a") as f:
                    f.write("not json\\n")
                    f.write('{"label": "c1", "case": "n=5", "passed": true}\\n')
        """))
    res = _judge(scratch, judge, tmp_path / "work", _variants(scratch, c0="ok", c1="wrong"))
    assert res.passed == {"c0": True, "c1": False} and not res.crashed


def test_an_audit_written_over_voids_its_process_and_passes_nothing(scratch, tmp_path):
    """Code that ran in a kernel pass writes over its audit once pytest has written it (at
    exit): not JSON, or JSON that is not the audit's object. perfloop reads the audit once
    the process is killed (as soon as the audit is there): the wrong variant never passes;
    where the garbage came first, its process's run cannot stand and it crashes."""
    for i, garbage in enumerate(["not json", "[1, 2]"]):
        judge = scratch.path / "tests" / f"judge_audit_{i}.py"
        judge.write_text((scratch.path / "tests" / "judge_scripted.py").read_text()
                         + textwrap.dedent(f"""
            def test_zz_writes_over_the_audit_at_exit():
                import atexit
                from perfloop.contract import judging
                if judging.MODE == judging.KERNEL:
                    path = judging.REQUEST["imports_out"]
                    atexit.register(lambda: open(path, "w").write({garbage!r}))
            """))
        res = _judge(scratch, judge, tmp_path / f"work{i}", _variants(scratch, c0="wrong"))
        assert res.passed.get("c0") is not True
        assert "c0" in res.crashed or res.passed == {"c0": False}
        if "c0" in res.crashed:
            assert "without finishing its session" in res.crashed["c0"]


def test_a_kernel_pass_is_not_awaited_past_its_audit(scratch, tmp_path):
    """What a kernel pass does after its audit counts for nothing, so the judge does not wait
    for its teardown (torch's and CUDA's took 1.3-2.2 s per process on an H100): here one
    that takes a minute."""
    judge = scratch.path / "tests" / "judge_slow_exit.py"
    judge.write_text((scratch.path / "tests" / "judge_scripted.py").read_text() + textwrap.dedent(
        """
        import atexit as _atexit, time as _time
        from perfloop.contract import judging as _judging
        if _judging.MODE == _judging.KERNEL:
            _atexit.register(lambda: _time.sleep(60))
        """))
    t0 = time.monotonic()
    res = _judge(scratch, judge, tmp_path / "work", _variants(scratch, c0="ok", c1="wrong"))
    assert res.passed == {"c0": True, "c1": False} and not res.crashed
    assert time.monotonic() - t0 < 45


def test_an_audit_written_before_the_cases_ran_passes_nothing(scratch, tmp_path):
    """Kernel code writes an audit that looks complete (its own request's digest, every
    count) before any case runs: perfloop ends the process there, and the cases it never
    ran have no outputs."""
    judge = scratch.path / "tests" / "judge_early_audit.py"
    judge.write_text((scratch.path / "tests" / "judge_scripted.py").read_text() + textwrap.dedent(
        """
        import hashlib as _hashlib, json as _json, time as _time
        from pathlib import Path as _Path
        from perfloop.contract import judging as _judging
        if _judging.MODE == _judging.KERNEL:
            _raw = _Path(_judging.REQUEST["imports_out"]).parent.joinpath("request.json")
            _Path(_judging.REQUEST["imports_out"]).write_text(_json.dumps({
                "imports": [], "selected": 3, "finished": 3, "collected": "", "failed": {},
                "request": _hashlib.sha256(_raw.read_bytes()).hexdigest(), "exitstatus": 0}))
            _time.sleep(5)
        """))
    res = _judge(scratch, judge, tmp_path / "work", _variants(scratch, c0="ok", c1="wrong"))
    assert res.passed.get("c0") is not True and res.passed.get("c1") is not True


def test_shards_that_collect_cases_in_another_order_are_judged_again_whole(scratch, tmp_path):
    """Parameters from a set come in another order in each process (string hashing differs):
    contiguous shards of different orders skip some cases and repeat others. The variant is
    judged again in one process, every case once."""
    judge = scratch.path / "tests" / "judge_set.py"
    judge.write_text(textwrap.dedent('''
        import pytest
        import torch
        from perfloop.contract.judge_api import check, module_for, requested_variants
        from perfloop.contract.playbook import freeze

        SIZES = {"n" + str(i): i for i in range(1, 40)}

        @pytest.mark.parametrize("variant", requested_variants(), ids=lambda v: v["label"])
        @pytest.mark.parametrize("name", set(SIZES))
        def test_doubles(variant, name):
            module = module_for(variant["folder"])
            launch = module.build({k: freeze(v) for k, v in variant["knobs"].items()})
            values = torch.arange(SIZES[name], dtype=torch.float64)

            def run():
                out = torch.full_like(values, float("nan"))
                launch(("case", values), out)
                return out

            check(variant["label"], name, run, 2 * values, rtol=0, atol=0, max_rel_err=0)
        '''))
    env = {k: v for k, v in _env(scratch).items() if k != "PYTHONHASHSEED"}
    res = _judge(scratch, judge, tmp_path / "work", _variants(scratch, c0="ok"), processes=4,
                 env=env)
    assert res.passed == {"c0": True} and not res.crashed
    names = [c["case"] for c in res.cases["c0"]]
    assert sorted(names) == sorted(f"n{i}" for i in range(1, 40))


def test_a_skip_by_a_mark_is_the_judges_and_a_skip_by_kernel_code_leaves_no_output(
        scratch, tmp_path):
    """Marks (skip, skipif, xfail) are the judge's own: its verdict stands. Kernel code can
    call pytest.skip in a kernel pass (it sees pytest loaded): the cases of that test then
    deliver no output, and the reference pass fails the variant for it."""
    marks = scratch.path / "tests" / "judge_marks.py"
    marks.write_text((scratch.path / "tests" / "judge_scripted.py").read_text() + textwrap.dedent(
        """
        @pytest.mark.skip(reason="not on this machine")
        def test_skipped_by_a_mark():
            pass

        @pytest.mark.skipif(True, reason="never")
        def test_skipped_by_a_condition():
            pass

        @pytest.mark.xfail(reason="a known limit of the reference", strict=False)
        def test_expected_to_fail():
            assert False

        @pytest.mark.xfail(run=False, reason="not run")
        def test_not_run():
            pass
        """))
    res = _judge(scratch, marks, tmp_path / "marks", _variants(scratch, c0="ok"))
    assert res.passed == {"c0": True} and not res.doubted

    res = _judge(scratch, scratch.path / "tests" / "judge_scripted.py", tmp_path / "code",
                 _variants(scratch, c0="skip-at-5"))
    assert res.passed == {"c0": False}
    missing = [c for c in res.cases["c0"] if not c["passed"]]
    assert [c["case"] for c in missing] == ["n=5"] and "no output" in missing[0]["error"]


def test_a_timing_spec_written_before_perfloop_writes_it_is_never_timed(scratch, tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(scratch.path)
    ahead = phases.start_timer_ahead(cwd=scratch.path, work=tmp_path / "ahead",
                                     env=phases.child_env(scratch.path / "playbook"))
    ahead[0].write_text("{}")
    used, timing = time_scripted(scratch, tmp_path, ahead)
    assert used is not ahead[1] and ahead[1].proc.poll() is not None
    assert not timing.crashed and timing.raw["passes"]


def test_a_timing_result_of_another_spec_is_not_used(scratch, tmp_path, monkeypatch):
    """The worker's result names the spec it read; one that is not the spec perfloop wrote
    (here: perfloop remembers another digest) is a crash, never a timing."""
    monkeypatch.chdir(scratch.path)
    monkeypatch.setattr(phases, "digest", lambda data: "not the spec's")
    used, timing = time_scripted(scratch, tmp_path, None)
    assert "not of the spec perfloop wrote" in timing.crashed and not timing.raw
