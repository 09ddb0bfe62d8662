"""Screening: an experiment with many candidates times each at one shape first, in a few
rounds with outputs checked as always, and judges only the fastest few."""

from __future__ import annotations

import dataclasses
import time

from perfloop.contract import workload
from perfloop.core.vocab import Outcome
from perfloop.measure import phases
from perfloop.store import records


def screen(trial):
    """Time every candidate of the experiment `trial` (perfloop.run.experiment.Trial) at one
    shape (its `choosing`: the headline's, or a bucket joint search's) only, in a few rounds,
    outputs checked as always; returns the timing (perfloop.measure.phases.Timing)."""
    s, variants, head, work = trial.s, trial.variants, trial.choosing, trial.work
    contract_dir, deadline = trial.contract_dir, trial.deadline
    env = phases.child_env(s.playbook_dir, s.playbook.rules.pass_env)
    shapes = workload.timer_shapes(s.spec, [head])
    rules = s.playbook.rules
    quick = dataclasses.replace(rules, measure=dataclasses.replace(
        rules.measure, rounds=rules.search.screen_rounds))
    processes = rules.search.screen_processes or rules.compile_processes
    if s.spec.requires_gpu and processes:
        # the timer would compile the candidates one after the other: compile them side by
        # side first (into cuTile's disk cache), as for the judge; a hung one waits no longer
        # than a stalled child would
        t = time.monotonic()
        phases.wait_warmers(phases.start_warmers(
            variants[1:], shapes, processes=processes,
            contract=contract_dir, work=work, cwd=s.root, env=env,
            confinement=s.confinement(), cache=s.compile_cache),
            min(deadline, time.monotonic() + rules.stall_timeout_s))
        trial.phase_s["screen_compile"] = phases.elapsed(t)
    timing = phases.time_variants(
        [variants[0], trial.control] + variants[1:], shapes, quick,
        deadline=deadline, cliffs=True, contract=contract_dir, tolerance=s.spec.tolerance,
        headline=head.name, ceilings_cache=s.ceilings_cache, work=work, cwd=s.root, env=env,
        confinement=s.confinement(), cache=s.compile_cache)
    return timing


def sift(out: dict, timing, keep: int, shape: str) -> tuple[dict, dict]:
    """From the screening's timing and each candidate's outcome there (`out`, label ->
    (Outcome, why)): the outcomes of those that do not go on (all but the `keep` fastest at
    `shape`, and any that failed, crashed or fell off a cliff), and {label: time ratio against
    the incumbent} of those timed (the joint search's sampler is told them)."""
    labels = list(out)
    if timing.crashed or not timing.raw:  # keep the most promising, by the proposal's order
        return {label: (Outcome.SCREENED, f"not judged: screening failed ({timing.crashed})")
                for label in labels[keep:]}, {}
    out = dict(out)
    timed_pass = records.summary(phases.summarize_pass(timing.raw["passes"][0]))
    ratios = {label: c.ratio for label, c in timed_pass[shape].vs_incumbent.items()}
    alive = sorted((label for label in labels if out[label][0] == Outcome.OK and label in ratios),
                   key=lambda label: ratios[label])
    for label in alive[keep:]:
        out[label] = (Outcome.SCREENED, f"screened out: {ratios[label]:.3f}x the "
                                        f"incumbent's time at {shape}, behind the {keep} "
                                        "fastest")
    timed = {label: ratios[label] for label in alive}
    return {label: o for label, o in out.items() if o[0] != Outcome.OK}, timed
