"""Judge processes and timing workers started ahead of their experiment (judge_mod.JudgePool,
phases.start_timer_ahead): they wait, with what they import loaded, for their task; what they
judge or time is what a child started then judges or times."""

import dataclasses
import json
import shutil
import time
from pathlib import Path

from support.timing import time_scripted

from perfloop.contract.kernel import code_digest
from perfloop.measure import judge as judge_mod
from perfloop.measure import phases
from perfloop.run import ahead
from perfloop.store.session import Session


def _variants(scratch, **modes) -> list[dict]:
    knobs = json.loads((scratch.kernel / "knobs.json").read_text())
    return [{"label": label, "folder": str(scratch.kernel), "knobs": {**knobs, "mode": mode}}
            for label, mode in modes.items()]


def _judge(scratch, judge: Path, work: Path, variants, processes: int, pool=None, cache=None):
    return judge_mod.judge(scratch.tree(judge), variants, root=scratch.path, work=work,
                        deadline=time.monotonic() + 300, stall_s=120,
                        env=phases.child_env(scratch.path / "playbook"), processes=processes,
                        share_cases=True, pool=pool, cache=cache)


def _start(scratch, judge: Path, work: Path, processes: int, **cache) -> judge_mod.JudgePool:
    return judge_mod.start_judges(scratch.tree(judge), root=scratch.path, work=work, processes=processes,
                               env=phases.child_env(scratch.path / "playbook"), **cache)


def _requests(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in folder.glob("k-*/request.json")]


def test_judges_started_ahead_give_the_verdict_of_judges_started_then(scratch, tmp_path):
    """Two candidates in four processes started ahead (two shards each): the one wrong only at
    n = 1000 fails on that case alone, the other passes, as in processes started on demand;
    every request went to a waiting process, and none of them is left running."""
    judge = scratch.path / "tests" / "judge_scripted.py"
    pool = _start(scratch, judge, tmp_path / "ahead", 4)
    waiting = [found[1] for found in pool.ready]
    time.sleep(1.0)  # (they may still be starting: a request written early is read then)
    variants = _variants(scratch, good="ok", wrong="wrong-above-100")
    ahead = _judge(scratch, judge, tmp_path / "work", variants, 4, pool)
    then = _judge(scratch, judge, tmp_path / "then", variants, 4)
    for res in (ahead, then):
        assert res.passed == {"good": True, "wrong": False} and not res.crashed
        assert [c["case"] for c in res.cases["wrong"] if not c["passed"]] == ["n=1000"]
        assert sorted(c["case"] for c in res.cases["good"]) == ["n=1", "n=1000", "n=5"]
    assert len(_requests(tmp_path / "ahead")) == 4 and not _requests(tmp_path / "work")
    assert not pool.ready and all(running.proc.poll() is not None for running in waiting)


def test_a_judge_waiting_for_its_request_has_not_imported_the_judge_or_kernel_code(
        scratch, tmp_path):
    """Kernel and judge code belong to the experiment: a process started ahead imports neither
    before its request, however long it waits."""
    mark = tmp_path / "imported"
    judge = scratch.path / "tests" / "judge_marks.py"
    judge.write_text((scratch.path / "tests" / "judge_scripted.py").read_text()
                     + f"\nfrom pathlib import Path as _P\n_P({str(mark)!r}).write_text('x')\n")
    pool = _start(scratch, judge, tmp_path / "ahead", 1)
    time.sleep(3.0)
    assert pool.ready[0][1].proc.poll() is None, "the waiting judge died"
    assert not mark.exists()
    res = _judge(scratch, judge, tmp_path / "work", _variants(scratch, c0="ok"), 1, pool)
    assert res.passed == {"c0": True} and mark.exists()


def test_a_judge_that_died_while_waiting_is_replaced_and_unused_ones_are_killed(
        scratch, tmp_path):
    judge = scratch.path / "tests" / "judge_scripted.py"
    pool = _start(scratch, judge, tmp_path / "ahead", 2)
    pool.ready[0][1].kill()
    res = _judge(scratch, judge, tmp_path / "work", _variants(scratch, c0="ok"), 2, pool)
    assert res.passed == {"c0": True} and not res.crashed
    assert len(_requests(tmp_path / "ahead")) == 1 and len(_requests(tmp_path / "work")) == 1

    pool = _start(scratch, judge, tmp_path / "more", 3)
    spare = [found[1] for found in pool.ready[1:]]
    res = _judge(scratch, judge, tmp_path / "work2", _variants(scratch, c0="ok"), 1, pool)
    assert res.passed == {"c0": True} and len(_requests(tmp_path / "more")) == 1
    assert all(running.proc.poll() is not None for running in spare)  # not needed: killed


def test_a_judge_started_for_another_judge_file_is_not_used(scratch, tmp_path):
    judge = scratch.path / "tests" / "judge_scripted.py"
    other = scratch.path / "tests" / "judge_other.py"
    other.write_text(judge.read_text())
    pool = _start(scratch, other, tmp_path / "ahead", 1)
    waiting = pool.ready[0][1]
    res = _judge(scratch, judge, tmp_path / "work", _variants(scratch, c0="ok"), 1, pool)
    assert res.passed == {"c0": True}
    assert not _requests(tmp_path / "ahead") and waiting.proc.poll() is not None


def test_a_timing_worker_started_ahead_times_what_it_is_then_given(scratch, tmp_path,
                                                                     monkeypatch):
    monkeypatch.chdir(scratch.path)
    env = phases.child_env(scratch.path / "playbook")
    ahead = phases.start_timer_ahead(cwd=scratch.path, work=tmp_path / "ahead", env=env)
    time.sleep(1.0)
    assert ahead[1].proc.poll() is None and not ahead[0].exists()
    used, timing = time_scripted(scratch, tmp_path, ahead)
    assert used is ahead[1] and ahead[0].exists() and ahead[1].proc.poll() is not None
    assert not timing.crashed and set(timing.raw["passes"][-1]["shapes"]) == {
        sh.name for sh in Session("scripted").spec.shapes}

    dead = phases.start_timer_ahead(cwd=scratch.path, work=tmp_path / "dead", env=env)
    dead[1].kill()
    used, timing = time_scripted(scratch, tmp_path, dead)
    assert used is not dead[1] and not dead[0].exists() and not timing.crashed


def _marking_judge(scratch) -> Path:
    """The scripted judge, which in a kernel pass also leaves a file in its compile cache."""
    judge = scratch.path / "tests" / "judge_cache_marks.py"
    judge.write_text((scratch.path / "tests" / "judge_scripted.py").read_text() + (
        "\nimport os as _os\nfrom perfloop.contract import judging as _judging\n"
        "if _judging.MODE == _judging.KERNEL:\n"
        "    _os.makedirs(_os.environ['CUDA_TILE_CACHE_DIR'], exist_ok=True)\n"
        "    open(_os.path.join(_os.environ['CUDA_TILE_CACHE_DIR'], f'judged-{_os.getpid()}'),"
        " 'w').close()\n"))
    return judge


def _marks(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("judged-*"))


def test_a_kernel_pass_compiles_into_its_codes_cache_only_where_it_runs_one_code(
        scratch, tmp_path):
    """The timer replays the judge's cases from each code's compile cache (phases.
    start_timing's `cache`): a kernel pass whose variants all have one code compiles into
    that code's cache, so replay does not compile them again; one that runs two codes, or
    was started ahead for other code, never writes either code's cache."""
    judge, cache = _marking_judge(scratch), tmp_path / "cache"
    other = tmp_path / "other"
    shutil.copytree(scratch.kernel, other)
    (other / "kernel.py").write_text((other / "kernel.py").read_text() + "\n# edited\n")
    mine, theirs = (cache / code_digest(f) for f in (scratch.kernel, other))
    res = _judge(scratch, judge, tmp_path / "one", _variants(scratch, a="ok", b="ok"), 2,
                 cache=cache)
    assert res.passed == {"a": True, "b": True} and len(_marks(mine)) == 2
    assert not _marks(tmp_path / "one")   # (the links in its folders lead there)

    both = [*_variants(scratch, c="ok"), {**_variants(scratch, d="ok")[0], "folder": str(other)}]
    res = _judge(scratch, judge, tmp_path / "two", both, 1, cache=cache)
    assert res.passed == {"c": True, "d": True}
    assert len(_marks(mine)) == 2 and not theirs.exists()
    assert len(_marks(tmp_path / "two")) == 1   # its own cache

    pool = _start(scratch, judge, tmp_path / "ahead", 1, cache=cache, code_folder=other)
    waiting = pool.ready[0][1]
    res = _judge(scratch, judge, tmp_path / "three", _variants(scratch, e="ok"), 1, pool, cache)
    assert res.passed == {"e": True} and waiting.proc.poll() is not None
    assert len(_marks(mine)) == 3 and not _marks(theirs) and not _requests(tmp_path / "ahead")

    pool = _start(scratch, judge, tmp_path / "ahead2", 1, cache=cache, code_folder=scratch.kernel)
    res = _judge(scratch, judge, tmp_path / "four", _variants(scratch, f="ok"), 1, pool, cache)
    assert res.passed == {"f": True} and len(_requests(tmp_path / "ahead2")) == 1
    assert len(_marks(mine)) == 4


def test_children_start_ahead_only_for_a_gpu_kernel_in_a_run_of_several_experiments(
        scratch, monkeypatch):
    """A CPU kernel's clock would feel them starting; `perfloop step` runs one experiment."""
    monkeypatch.chdir(scratch.path)
    s = Session("scripted")
    tree = scratch.tree()   # (the pinned tree of a run about to start)
    s.ahead = True
    ahead.start(s, tree)
    assert s.judges is None and s.timer is None  # requires_gpu = false
    s.spec = dataclasses.replace(s.spec, requires_gpu=True)
    s.ahead = False
    ahead.start(s, tree)
    assert s.judges is None and s.timer is None
    s.ahead = True
    ahead.start(s, tree)
    try:
        assert s.judges is not None and len(s.judges.ready) == judge_mod.processes_for(
            s.playbook.rules.judge_processes)  # (at most one per CPU)
        waiting = [found[1] for found in s.judges.ready] + [s.timer[1]]
    finally:
        ahead.discard(s)
    assert s.judges is None and s.timer is None
    assert all(r.proc.poll() is not None for r in waiting)
