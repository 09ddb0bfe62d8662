"""One experiment's measurement: its judge and its timer, in child processes, given where they
run (a Place) and what they measure (a Plan). The same code runs on the machine that holds
the repository (perfloop.run.experiment) and on a fleet's worker (perfloop.fleet.worker); what
comes back (a Measured) is data, which the caller records.

The timer starts (and builds every variant) while the judge runs; the judge's verdict names
what the timer times. Every candidate's outcome is decided here, from what the judge and the
timer reported: a verdict reached by a process that imported code no experiment pins counts
for nothing (Place.foreign).
"""

from __future__ import annotations

from typing import Callable

from perfloop.core.faults import crashpoint
from perfloop.core.vocab import INCUMBENT, Kind, Outcome
from perfloop.measure import judge, phases, process
from perfloop.measure.outcomes import (
    apply_timing,
    judged_outcome,
    void,
    with_finalists,
)
from perfloop.measure.trial import Measured, Place, Plan


def measure(plan: Plan, place: Place, *, pool=None, waiting=None,
            after_judge: Callable[[], None] = lambda: None) -> Measured:
    """Judge the plan's candidates and time what passed against the incumbent and its control.
    `pool` and `waiting`: a judge pool and a timer started ahead for this experiment
    (perfloop.run.ahead); `after_judge` runs once the judge is done (the next experiment's
    children start then)."""
    out = Measured()
    timer = _start_timer(plan, place, waiting)
    warmers = phases.start_warmers(
        plan.timed(control=False), plan.shapes, processes=plan.rules.compile_processes,
        contract=place.pinned.contract, work=place.work, cwd=place.root, env=place.env,
        confinement=place.confinement, cache=place.cache
    ) if plan.requires_gpu and plan.candidates else []
    if plan.judge:
        _judge(plan, place, out, timer, warmers, pool)
    else:   # (the warmers compile in parallel what the timer would build one by one)
        try:
            phases.wait_warmers(warmers, until=plan.deadline)
        except BaseException:   # Ctrl-C while they compile: they and the waiting timer go
            phases.stop_warmers(warmers)
            phases.abandon(timer)
            raise
        finally:
            process.kill_strays()
        out.judged = judge.JudgeResult(detail="judged before, on another GPU")
        out.outcome = {v["label"]: (Outcome.OK, "") for v in plan.candidates}
    after_judge()
    passing = [v for v in plan.candidates if out.outcome[v["label"]][0] == Outcome.OK]
    out.judge_passed = bool(passing)
    if passing:
        _time(plan, place, out, timer,
              [v["label"] for v in passing] if plan.kind != Kind.BASELINE else [])
    else:
        phases.abandon(timer)
    return out


def _start_timer(plan: Plan, place: Place, waiting):
    if not plan.candidates:
        if waiting:
            waiting[1].kill()
        return None
    return phases.start_timing(
        plan.timed(), plan.shapes, plan.rules, contract=place.pinned.contract,
        tolerance=plan.tolerance, headline=plan.choosing, ceilings_cache=place.ceilings_cache,
        work=place.work, cwd=place.root, env=place.env, confinement=place.confinement,
        cache=place.cache, only_buckets=plan.only_buckets, always=plan.always, ahead=waiting,
        held_back_if_gain=True)


def _judge(plan: Plan, place: Place, out: Measured, timer, warmers: list, pool) -> None:
    extra = [v for vs in plan.finalists.values() for v in vs]
    try:
        judged = judge.judge(
            place.pinned, plan.judged + extra, root=place.root, work=place.work,
            deadline=plan.deadline, stall_s=plan.rules.stall_timeout_s, env=place.env,
            processes=judge.processes_for(plan.rules.judge_processes),
            share_cases=plan.requires_gpu,  # its cases compile
            replay_only=[plan.incumbent, plan.control], pool=pool,
            confinement=place.confinement, cache=place.cache
        ) if plan.candidates else judge.JudgeResult(detail="none left to judge")
    except BaseException:  # Ctrl-C while judging: the waiting worker goes too
        phases.abandon(timer)
        raise
    finally:
        warmed = phases.stop_warmers(warmers)
        process.kill_strays()  # (what a warmer's kernel code left, before any batch is timed)
        if pool:
            pool.discard()
    out.judged = judged
    out.phase_s["correctness"] = judged.wall_s
    if judged.passes_s:   # the rest is the reference pass's comparison and verdict
        out.phase_s["judge_passes"] = judged.passes_s
    out.compile_ahead = {"processes": len(warmers), "finished_while_judged": warmed,
                         "judge_processes": judged.processes}
    crashpoint("correctness", plan.iteration)
    out.outcome = with_finalists({v["label"]: judged_outcome(v["label"], judged)
                                  for v in plan.candidates}, plan.finalists, judged)
    void(out.outcome, place.foreign(judged.imports),
         "the judge imported {}, which differs from the run's base commit: its verdict does "
         "not count")


def _time(plan: Plan, place: Place, out: Measured, timer, labels: list[str]) -> None:
    assert out.judged is not None   # (judged first)
    timing = phases.finish_timing(timer, labels, deadline=plan.deadline,
                                  select=len(labels) > 1, replay=out.judged.replay)
    out.timing = timing
    out.phase_s["timing"] = round(timing.wall_s - out.judged.wall_s, 3)  # after the judge
    crashpoint("timing", plan.iteration)
    apply_timing(out.outcome, timing, plan.kind)
    void(out.outcome, place.foreign(timing.imports),
         "kernel code imported {} from outside its folder, which no experiment commits")
    if timing.crashed or not timing.raw:  # (empty when every candidate was dropped)
        return
    out.passes = [phases.summarize_pass(p, ceiling=timing.raw.get("ceilings"))
                  for p in timing.raw["passes"]]
    best = timing.raw.get("best") if plan.kind != Kind.BASELINE else INCUMBENT
    if best is not None and out.outcome.get(best, (Outcome.OK,))[0] == Outcome.OK:
        out.best = best
