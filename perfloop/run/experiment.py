"""One experiment: judge, time, commit, decide, record. And recovery of an interrupted one.

Order of durable effects, which recovery relies on:
  in-flight marker (state) -> [agent edits committed, their message in the marker first]
  -> judge -> timing -> [playbook: the knobs' hash and the commit message in the marker, then
  knobs.json and the commit] -> record line -> ref + branch back to the incumbent on a revert
  -> table row -> marker cleared.
A record line is the point of no return: with it the experiment is finished on resume;
without it the experiment is set aside under a ref and redone. Recovery moves the branch only
past a commit it can prove perfloop made (its parent is the incumbent and its message is the
one the marker announced), and restores files only where the change is perfloop's own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import asdict, dataclass

from perfloop.child import ceilings
from perfloop.core import dispatch, progress, traffic
from perfloop.core.errors import AfterRecord, UserError
from perfloop.core.kernel import KNOBS, knobs_text
from perfloop.core.playbook import Optimization, freeze, thaw
from perfloop.core.stats import Comparison
from perfloop.core.vocab import (
    CONTROL,
    INCUMBENT,
    Correctness,
    Kind,
    Outcome,
    Status,
    Stop,
    StopReason,
)
from perfloop.measure import phases
from perfloop.plan import decide, search
from perfloop.report import review
from perfloop.run.faults import crashpoint
from perfloop.store import gitops, pins, records, table
from perfloop.store.session import Session


@dataclass(frozen=True)
class Proposal:
    kind: Kind
    optimization: Optimization | None = None
    values: tuple = ()
    describe: str = ""
    sampler: dict | None = None   # what chose a joint search's configs (search.JointPlan)

    @property
    def name(self) -> str:
        if self.kind == Kind.BASELINE:
            return "baseline"
        if self.kind == Kind.AGENT:
            return "agent-edit"
        return self.optimization.id

    def to_json(self) -> dict:
        out = {"kind": self.kind, "optimization": self.name, "values": thaw(self.values),
               "describe": self.describe}
        return {**out, "sampler": self.sampler} if self.sampler else out


def label_for(value_index: int) -> str:
    return f"candidate-{value_index}"


def _variants(s: Session, proposal: Proposal, incumbent_dir, incumbent_knobs) -> list[dict]:
    incumbent = {"label": INCUMBENT, "folder": incumbent_dir, "knobs": incumbent_knobs}
    if proposal.kind == Kind.BASELINE:
        return [incumbent]
    if proposal.kind == Kind.AGENT:
        return [incumbent, {"label": label_for(0), "folder": s.spec.folder,
                            "knobs": s.spec.read_knobs()}]
    opt = proposal.optimization
    if opt.knob == search.MULTI:  # a joint patch holds where the headline runs
        bucket = search.headline_bucket(records.plain(s.records()), s.spec.headline.name)
        return [incumbent] + [{"label": label_for(i), "folder": s.spec.folder,
                               "knobs": search.apply_joint(incumbent_knobs, v, bucket)}
                              for i, v in enumerate(proposal.values)]
    return [incumbent] + [{"label": label_for(i), "folder": s.spec.folder,
                           "knobs": {**incumbent_knobs, opt.knob: v}}
                          for i, v in enumerate(proposal.values)]


def _below_floor(summary: dict, label: str, tolerance: float) -> tuple[str, ...]:
    return tuple(name for name, shape in summary.items()
                 if shape["floor_ms"] and shape["variants"][label]["median_ms"]
                 < shape["floor_ms"] * (1 - tolerance))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _commit_message(proposal: Proposal, iteration: int, value, incumbent_knobs: dict) -> str:
    if proposal.kind == Kind.AGENT:
        return f"perfloop: iteration {iteration}: agent edit: {proposal.describe}"
    opt = proposal.optimization
    if opt.id == search.DISPATCH:
        return f"perfloop: iteration {iteration}: dispatch: {proposal.describe}"
    if opt.id == search.BUCKET_JOINT:
        return (f"perfloop: iteration {iteration}: "
                f"{search.bucket_joint_row(incumbent_knobs.get(opt.knob), value)}")
    return f"perfloop: iteration {iteration}: {opt.id} ({review.setting(opt.knob, thaw(value))})"


def _commit(s: Session, message: str) -> str:
    """Announce the commit in the marker first, so recovery can tell it is perfloop's."""
    s.state.in_flight["message"] = message
    s.save_state()
    sha = gitops.commit_folder(s.repo, s.folder_rel, message)
    s.state.in_flight["commit"] = sha
    s.save_state()
    return sha


def run(s: Session, proposal: Proposal) -> records.Experiment:
    """Run one experiment to its record. The caller has checked the tree, the branch and what
    is pinned; from here on every outcome is recorded."""
    what = proposal.describe or proposal.name
    with progress.task(f"iteration {len(s.records())}", what[:60]):
        return _run(s, proposal)


def _run(s: Session, proposal: Proposal) -> records.Experiment:
    state = s.state
    iteration = len(s.records())
    rules = s.playbook.rules
    started, t0 = time.time(), time.monotonic()
    deadline = t0 + rules.iteration_timeout_s
    phase_s: dict[str, float] = {}
    tag = f"iter-{iteration:02d}-{phases.nonce()}"
    state.in_flight = {"iteration": iteration, **proposal.to_json(), "commit": None,
                       "message": None, "knobs_sha256": None, "tag": tag, "started_at": started}
    s.save_state()
    if proposal.kind == Kind.AGENT:
        t = time.monotonic()
        _commit(s, _commit_message(proposal, iteration, None, {}))
        phase_s["commit"] = phases.elapsed(t)
    crashpoint("started", iteration)

    work = s.work / tag
    work.mkdir(parents=True, exist_ok=True)
    incumbent_dir = s.export_commit(state.incumbent, work / "incumbent")
    contract_dir = s.export_commit(state.base_commit, work / "contract")
    incumbent_knobs = s.spec.read_knobs(incumbent_dir)
    variants = _variants(s, proposal, incumbent_dir, incumbent_knobs)
    candidates = variants if proposal.kind == Kind.BASELINE else variants[1:]
    proposed = list(candidates)
    values = dict(zip((v["label"] for v in proposed), proposal.values))
    shapes = s.spec.shapes + (s.spec.held_back if _is_dispatch(proposal) else ())
    choosing = _screen_shape(s, proposal)  # where it is screened and its fastest chosen
    env = phases.child_env(s.playbook_dir)
    allowed = [s.spec.folder, work]  # what children may import from inside the repository
    control = dict(variants[0], label=CONTROL)
    screened: dict = {}
    screen_ratios: dict = {}
    if proposal.kind == Kind.PLAYBOOK and len(candidates) > rules.search.screen_above:
        t = time.monotonic()
        screened, screen_ratios = _screen(s, variants, contract_dir, work, env, deadline,
                                          allowed, choosing, phase_s)
        phase_s["screen"] = phases.elapsed(t)
        candidates = [v for v in candidates if v["label"] not in screened]
        variants = [variants[0]] + candidates
    ahead_timer, s.timer = s.timer, None  # started while the previous experiment was timed
    timer = phases.start_timing(  # it gets ready while the judge runs
        [variants[0], control] + (candidates if proposal.kind != Kind.BASELINE else []),
        [sh.as_dict() for sh in shapes], rules, contract=contract_dir,
        tolerance=s.spec.tolerance, headline=choosing.name,
        ceilings_cache=s.ceilings_cache, work=work, cwd=s.root, env=env,
        only_buckets=_touched_buckets(proposal, incumbent_knobs),
        always=[s.spec.headline.name],
        checked=[INCUMBENT] if proposal.kind == Kind.BASELINE else None,
        ahead=ahead_timer) if candidates else None
    if timer is None and ahead_timer:
        ahead_timer[1].kill()

    warm = [variants[0]] + (candidates if proposal.kind != Kind.BASELINE else [])
    warmers = phases.start_warmers(
        warm, [sh.as_dict() for sh in shapes], processes=rules.compile_processes,
        contract=contract_dir, work=work, cwd=s.root, env=env
    ) if s.spec.requires_gpu and candidates else []
    ahead, s.judges = s.judges, None  # started while the previous experiment was timed
    try:
        judged = phases.judge(s.root / state.judge, candidates, cwd=s.root, work=work,
                              deadline=deadline, stall_s=rules.stall_timeout_s, env=env,
                              processes=rules.judge_processes,
                              share_cases=s.spec.requires_gpu,  # its cases compile
                              contract={"folder": str(s.spec.folder), "copy": str(contract_dir)},
                              pool=ahead
                              ) if candidates else phases.JudgeResult(detail="none left to judge")
    except BaseException:  # Ctrl-C while judging: the waiting worker goes too
        phases.abandon(timer)
        raise
    finally:
        warmed = phases.stop_warmers(warmers)
        if ahead:
            ahead.discard()
    s.start_ahead()  # the next experiment's judges and timer, while this one is timed
    phase_s["correctness"] = judged.wall_s
    compile_ahead = {"processes": len(warmers), "finished_while_judged": warmed,
                     "judge_processes": judged.processes}
    crashpoint("correctness", iteration)
    outcome = {v["label"]: _judged(v["label"], judged) for v in candidates}
    _void_if_foreign(s, outcome, judged.imports, allowed,
                     "the judge imported {}, which differs from the run's base commit: its "
                     "verdict does not count")
    if judged.tampered:
        for label in outcome:
            outcome[label] = (Outcome.FAIL, "kernel code replaced perfloop's judging functions "
                                            "in the judge "
                                            f"({', '.join(sorted(judged.tampered)[:3])})")
    passing = [v for v in candidates if outcome[v["label"]][0] == Outcome.OK]

    timing, passes, best = None, [], None
    if not passing:
        phases.abandon(timer)
    else:
        labels = [v["label"] for v in passing] if proposal.kind != Kind.BASELINE else []
        timing = phases.finish_timing(timer, labels, deadline=deadline,
                                      select=len(labels) > 1)
        phase_s["timing"] = round(timing.wall_s - judged.wall_s, 3)  # after the judge
        crashpoint("timing", iteration)
        _apply_timing(outcome, timing, proposal.kind)
        _void_if_foreign(s, outcome, timing.imports, allowed,
                         "kernel code imported {} from outside its folder, which no "
                         "experiment commits")
        if not timing.crashed and timing.raw:  # (empty when every candidate was dropped)
            passes = [phases.summarize_pass(p, ceiling=timing.raw.get("ceilings"))
                      for p in timing.raw["passes"]]
            best = timing.raw.get("best") if proposal.kind != Kind.BASELINE else INCUMBENT
            if best is not None and outcome.get(best, (Outcome.OK,))[0] != Outcome.OK:
                best = None

    summary = passes[-1] if passes and best is not None else None
    chosen = next((v for v in variants if v["label"] == best), (candidates or proposed)[0])
    value = values.get(chosen["label"]) if proposal.kind == Kind.PLAYBOOK else None
    outcome.update(screened)
    verdict = _verdict(s, proposal, outcome, timing, summary, best, bool(passing),
                       incumbent_knobs)

    t = time.monotonic()
    if proposal.kind == Kind.BASELINE:
        commit = state.incumbent
    elif proposal.kind == Kind.AGENT:
        commit = state.in_flight["commit"]
    else:
        text = knobs_text(chosen["knobs"])
        state.in_flight["knobs_sha256"] = _sha256(text)
        s.save_state()
        (s.spec.folder / KNOBS).write_text(text, encoding="utf-8")
        commit = _commit(s, _commit_message(proposal, iteration, value, incumbent_knobs))
    phase_s["commit"] = phase_s.get("commit", 0) + phases.elapsed(t)
    crashpoint("commit", iteration)

    head_name = s.spec.headline.name
    latency = summary[head_name]["variants"][best]["median_ms"] if summary else None
    knob = proposal.optimization.knob if proposal.optimization else None
    labels = ({label: thaw(x) for label, x in values.items()}
              if proposal.kind == Kind.PLAYBOOK else {})
    line = {
        "schema": records.SCHEMA, "iteration": iteration, "kind": proposal.kind,
        "optimization": proposal.name, "describe": proposal.describe,
        "family": proposal.optimization.family if proposal.optimization else None,
        "knob": knob, "value": thaw(value), "candidates": thaw(proposal.values),
        "incumbent_value": thaw(incumbent_knobs.get(knob)) if knob in incumbent_knobs else None,
        "knobs": {k: thaw(x) for k, x in chosen["knobs"].items()},
        "commit": commit, "incumbent_before": state.incumbent, "branch": state.branch,
        "ref": s.ref_name(iteration),
        "status": verdict.status, "correctness": verdict.correctness, "latency_ms": latency,
        "decision": asdict(verdict),
        "outcomes": {label: {"value": labels.get(label), "outcome": o[0], "reason": o[1]}
                     for label, o in outcome.items()},
        "correctness_detail": {"passed": judged.passed, "crashed": judged.crashed,
                               "cases": judged.cases, "detail": judged.detail},
        "timing": {"shapes": summary, "selection": passes[0] if len(passes) > 1 else None,
                   "method": timing.raw.get("method"), "ceilings": timing.raw.get("ceilings"),
                   "chosen": best, "labels": labels} if summary else None,
        "environment": timing.raw.get("environment") if timing and timing.raw else None,
        "phases_s": {**phase_s, "total": phases.elapsed(t0)}, "compile_ahead": compile_ahead,
        "started_at": started, "finished_at": time.time(),
    }
    if proposal.sampler:  # a joint search: what chose its configs, out of how many
        line["sampler"] = proposal.sampler
    if screen_ratios:  # every candidate's ratio where it was screened (the headline's)
        line["screening"] = {"shape": choosing.name, "ratios": screen_ratios}
    record = records.Experiment.from_dict(line)  # (what is written is what resume reads)
    records.append(s.records_path, record)
    crashpoint("record", iteration)
    finish(s, record)
    return record


def _screen_shape(s: Session, proposal: Proposal):
    """Where an experiment is screened and its fastest candidate chosen: the headline, or the
    shape a bucket joint search was planned at (the only bucket it changes)."""
    at = (proposal.sampler or {}).get("shape")
    return next((sh for sh in s.spec.shapes if sh.name == at), s.spec.headline)


def _screen(s: Session, variants: list[dict], contract_dir, work, env, deadline: float,
            allowed: list, head, phase_s: dict) -> tuple[dict, dict]:
    """Time every candidate at one shape (`head`: the headline's, or a bucket joint search's)
    only, in a few rounds, outputs checked as always; return the outcomes of those that do
    not go on: all but the [search] screen_keep fastest, and any that failed, crashed or fell
    off a cliff there; and {label: time ratio against the incumbent there} of those timed
    (the joint search's sampler is told them)."""
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
            variants[1:], [head.as_dict()], processes=processes,
            contract=contract_dir, work=work, cwd=s.root, env=env),
            min(deadline, time.monotonic() + rules.stall_timeout_s))
        phase_s["screen_compile"] = phases.elapsed(t)
    timing = phases.time_variants(
        [variants[0], dict(variants[0], label=CONTROL)] + variants[1:], [head.as_dict()], quick,
        deadline=deadline, cliffs=True, contract=contract_dir, tolerance=s.spec.tolerance,
        headline=head.name, ceilings_cache=s.ceilings_cache, work=work, cwd=s.root, env=env)
    labels = [v["label"] for v in variants[1:]]
    if timing.crashed or not timing.raw:  # keep the most promising, by the proposal's order
        return {label: (Outcome.SCREENED, f"not judged: screening failed ({timing.crashed})")
                for label in labels[rules.search.screen_keep:]}, {}
    out = {label: (Outcome.OK, "") for label in labels}
    _apply_timing(out, timing, Kind.PLAYBOOK)
    _void_if_foreign(s, out, timing.imports, allowed, "kernel code imported {} from outside "
                     "its folder while screened, which no experiment commits")
    ratios = phases.summarize_pass(timing.raw["passes"][0])[head.name]["vs_incumbent"]
    alive = sorted((label for label in labels
                    if out[label][0] == Outcome.OK and label in ratios),
                   key=lambda label: ratios[label]["ratio"])
    keep = rules.search.screen_keep
    for label in alive[keep:]:
        out[label] = (Outcome.SCREENED, f"screened out: {ratios[label]['ratio']:.3f}x the "
                                        f"incumbent's time at {head.name}, behind the {keep} "
                                        "fastest")
    timed = {label: ratios[label]["ratio"] for label in alive}
    return {label: o for label, o in out.items() if o[0] != Outcome.OK}, timed


def _void_if_foreign(s: Session, outcome: dict, imported: set, allowed: list, why: str) -> None:
    """A verdict reached by a process that imported repository files the run did not pin
    (besides the candidate's folder and perfloop's exports) counts for nothing: all fail."""
    foreign = pins.unpinned_imports(s.repo, s.root, sorted(imported), s.state.base_commit,
                                     allowed)
    if foreign:
        for label in outcome:
            outcome[label] = (Outcome.FAIL, why.format(gitops.listing(foreign)))


def _judged(label: str, judged: phases.JudgeResult) -> tuple[str, str]:
    if label in judged.crashed:
        return Outcome.CRASH, judged.crashed[label]
    if label in judged.doubted:
        return Outcome.FAIL, f"correctness failed: {judged.doubted[label]}"
    if not judged.passed.get(label):
        failed = [c["case"] for c in judged.cases.get(label, []) if not c["passed"]]
        return Outcome.FAIL, ("correctness failed" + (
            f" ({', '.join(failed[:3])})" if failed else " (no case was reported as passed)"))
    return Outcome.OK, ""


def _dropped(why: dict) -> Outcome:
    """A candidate the timing child dropped: failed, fell off a cliff, else crashed."""
    return Outcome(why["kind"]) if why["kind"] in (Outcome.FAIL, Outcome.SLOW) else Outcome.CRASH


def _apply_timing(outcome: dict, timing: phases.Timing, kind: Kind) -> None:
    for label, why in timing.excluded.items():
        outcome[label] = (_dropped(why), why["reason"])
    for label, why in (timing.raw.get("failed") or {}).items():
        if label in outcome:
            outcome[label] = (_dropped(why), why["reason"])
        elif label in (INCUMBENT, CONTROL) and kind != Kind.BASELINE:
            timing.crashed = timing.crashed or f"the incumbent, timed again: {why['reason']}"
    if kind == Kind.BASELINE and INCUMBENT in (timing.raw.get("failed") or {}):
        why = timing.raw["failed"][INCUMBENT]
        outcome[INCUMBENT] = (Outcome.FAIL if why["kind"] == Outcome.FAIL else Outcome.CRASH,
                              why["reason"])


def _touched_buckets(proposal: Proposal, incumbent_knobs: dict) -> list[str] | None:
    """The buckets a change of the dispatch table touches, in any of its candidates (None for
    any other experiment): only their shapes, and the headline, are timed."""
    if not _is_dispatch(proposal):
        return None
    before = dispatch.table(incumbent_knobs)
    return sorted({b for v in proposal.values for b in dispatch.changed_buckets(before, thaw(v))})


def _is_dispatch(proposal: Proposal) -> bool:
    """A change of the dispatch table: a dispatch or a bucket joint search."""
    return proposal.kind == Kind.PLAYBOOK and proposal.optimization.knob == dispatch.KEY


def _verdict(s: Session, proposal: Proposal, outcome: dict, timing, summary,
             best, judged_ok: bool, incumbent_knobs: dict) -> decide.Verdict:
    if summary is not None:
        return _weigh(s, proposal, summary, best, incumbent_knobs)
    if timing is not None and timing.crashed:
        return decide.Verdict(Status.CRASH, Correctness.PASS, timing.crashed)
    failed = [(label, why) for label, (kind, why) in outcome.items() if kind == Outcome.FAIL]
    if failed:
        reason = "; ".join(f"{label}: {why}" for label, why in failed[:3])
        if proposal.kind == Kind.BASELINE or len(outcome) == 1:
            reason = failed[0][1]
        return decide.Verdict(Status.REVERT, Correctness.FAIL, f"{reason}: reverted at once"
                              if proposal.kind != Kind.BASELINE else reason)
    slow = [why for kind, why in outcome.values() if kind == Outcome.SLOW]
    if slow and all(kind in (Outcome.SLOW, Outcome.CRASH) for kind, _ in outcome.values()):
        return decide.Verdict(Status.REVERT, Correctness.PASS, "every candidate fell off a "
                              f"cliff or crashed ({slow[0]})" if len(outcome) > 1 else slow[0])
    # every candidate crashed: in the judge (correctness unknown: FAIL) or while timed (PASS)
    crashed = [why for kind, why in outcome.values() if kind == Outcome.CRASH]
    return decide.Verdict(Status.CRASH, Correctness.PASS if judged_ok else Correctness.FAIL,
                          crashed[0] if crashed else "nothing was timed")


def _weigh(s: Session, proposal: Proposal, summary: dict, best: str,
           incumbent_knobs: dict) -> decide.Verdict:
    """The playbook's verdict on the fastest candidate (its timings from the final pass). A
    dispatch is decided at the headline if its bucket changed, else where it gained most, and
    only if a held-back shape was timed in every bucket it changes."""
    rules = s.playbook.rules.decision
    head = s.spec.headline.name
    unchecked: tuple = ()
    if _is_dispatch(proposal):
        chosen = proposal.values[int(best.rsplit("-", 1)[1])]   # (label_for's index)
        changed = dispatch.changed_buckets(dispatch.table(incumbent_knobs), thaw(chosen))
        head = decide.dispatch_focus(summary, changed, head, best) or ""
        unchecked = decide.ungeneralized(summary, changed)
    below = _below_floor(summary, best, rules.floor_tolerance)
    if proposal.kind == Kind.BASELINE:
        aa = summary[head]["vs_incumbent"][CONTROL]
        if below:
            return decide.Verdict(Status.REVERT, Correctness.PASS, "baseline measured faster "
                                  f"than the physical floor on {', '.join(below)}: the "
                                  "measurement is broken")
        return decide.Verdict(Status.KEEP, Correctness.PASS, "baseline; the same code timed "
                              f"twice differs by {100 * abs(aa['ratio'] - 1):.2f}% (noise "
                              f"{100 * summary[head]['noise']:.2f}%) at the headline shape")
    comparisons = {name: Comparison(**shape["vs_incumbent"][best]) for name, shape in summary.items()}
    return decide.decide(decide.Outcome(correct=True, comparisons=comparisons, headline=head,
                                        below_floor=below, ungeneralized=unchecked), rules)


def finish(s: Session, record: records.Experiment) -> None:
    """Everything after the record line; idempotent, so recovery can simply call it again."""
    state = s.state
    iteration = record.iteration
    gitops.set_ref(s.repo, record.ref, record.commit)
    if record.status == Status.KEEP:
        state.incumbent = record.commit
        if record.kind == Kind.BASELINE:
            _classify(s, record)
    elif gitops.head(s.repo) != state.incumbent:
        gitops.move_branch_to(s.repo, state.incumbent, s.folder_rel)
    crashpoint("git", iteration)
    rows = table.read_rows(s.table_path)
    if len(rows) == iteration:
        table.append_row(s.table_path, table.format_row(
            iteration, review.what(record), record.latency_ms, record.correctness, record.status))
    crashpoint("table", iteration)
    state.in_flight = None
    try:
        state.stop = _stop_after(s, record)
    except UserError as exc:  # (kernel.py's canonical() or restrict() failed, say)
        state.stop = None
        s.save_state()
        raise AfterRecord(f"iteration {iteration} was recorded ({record.status}), but what "
                          f"comes next could not be decided: {exc}") from None
    s.save_state()


def _classify(s: Session, record: records.Experiment) -> None:
    """The class from the headline's work, against the ridge points of the device that timed
    the baseline (fixed bounds where it has none: a CPU clock)."""
    shape = record.timing["shapes"][s.spec.headline.name]
    done = traffic.from_record(shape)
    peaks, bandwidth = ceilings.roofline(record.timing.get("ceilings"), done.flops)
    found = decide.classify(done.bytes, done.flops, peaks, bandwidth, s.playbook.rules.classes)
    s.state.kernel_class, s.state.intensity, s.state.class_basis = found


def verdicts(recs: list[records.Experiment]) -> list[decide.Verdict]:
    return [decide.Verdict(**r.decision) for r in recs if r.kind != Kind.BASELINE]


def floor_shares(s: Session, recs: list[records.Experiment]) -> dict[str, float] | None:
    """The incumbent's share of the physical floor per benchmark shape, each from the latest
    experiment in the incumbent's line that timed it (review.incumbent_timed; None where a
    shape has no floor, e.g. on the CPU)."""
    shares = {sh.name: (review.incumbent_timed(recs, s.state.incumbent, sh.name)[1] or {}
                        ).get("share_of_floor") for sh in s.spec.shapes}
    return shares if shares and None not in shares.values() else None


def stop_inputs(s: Session, recs: list[records.Experiment]) -> tuple:
    """The iteration, verdicts and which of them were search experiments, for stop_reason."""
    done = [r for r in recs if r.kind != Kind.BASELINE]
    return ((recs[-1].iteration if recs else 0), verdicts(recs),
            [r.optimization in search.IDS for r in done])


def _stop_after(s: Session, record: records.Experiment) -> Stop | None:
    from perfloop.plan.suggest import catalog, estimate, searches, spent, suggestions

    if record.kind == Kind.BASELINE and record.status != Status.KEEP:
        return Stop(StopReason.BASELINE_FAILED,
                    f"the baseline did not pass ({record.reason}); fix the kernel first")
    recs = s.records()
    iteration_, verdicts_, searched = stop_inputs(s, recs)
    ranked, extra = catalog(s, recs), searches(s, recs)
    ahead = (suggestions(s, recs, ranked, extra)[:1] if s.playbook.rules.stop.time_budget_s
             else [])
    done = spent(recs)
    next_s = estimate(s, recs, ahead[0], done) if ahead else 0.0
    shares, spent_s = floor_shares(s, recs), tuple(x.seconds for x in done)

    def reason(searches_: int, next_s_: float) -> Stop | None:
        return decide.stop_reason(iteration_, verdicts_, s.playbook.rules.stop,
                                  len(ranked) if verdicts_ else 1, searched=searched,
                                  searches=searches_, floor_shares=shares, spent_s=spent_s,
                                  next_s=next_s_)

    stop = reason(len(extra), next_s)
    if stop and stop.reason is StopReason.TIME_BUDGET:
        # a rule that only the searches held off is what ends the run when the next does not
        # fit (no catalog step goes ahead of them then, though one may fit: suggest.py)
        held = reason(0, 0.0)
        if held is not None:
            return Stop(held.reason, f"{held.detail} (and the next experiment on offer, "
                                     f"estimated at {next_s:.0f} s, would pass the time budget)")
    return stop


def recover(s: Session) -> Proposal | None:
    """Bring an interrupted run back to a consistent state. Returns what must be redone.
    Refuses, changing nothing, when the branch or the folder holds work perfloop did not make."""
    state = s.state
    flight = state.in_flight
    recs = s.records()
    if flight is None:
        if len(table.read_rows(s.table_path)) < len(recs):  # killed between record and row
            _refinish(s, recs[-1])
        return None
    done = next((r for r in recs if r.iteration == flight["iteration"]), None)
    if done is not None:
        _refinish(s, done)
        return None
    proposal = _proposal_from_flight(s, flight)
    ours = _perfloops_commit(s, flight)
    inside = s.changes_inside_folder()
    knobs_rel = f"{s.folder_rel}/{KNOBS}"
    if ours and inside or proposal.kind == Kind.PLAYBOOK and inside and not (
            inside == [knobs_rel] and flight.get("knobs_sha256") ==
            _sha256((s.spec.folder / KNOBS).read_text(encoding="utf-8"))):
        raise UserError(f"refused: {gitops.listing(inside)} changed after perfloop was "
                        f"interrupted in iteration {flight['iteration']}; perfloop will not "
                        "overwrite it. Commit it elsewhere or stash it, then resume")
    if ours:
        gitops.set_ref(s.repo, s.ref_name(flight["iteration"], "abandoned") +
                       f"-{flight.get('tag', 'x')[-8:]}", ours)
        gitops.move_branch_to(s.repo, state.incumbent, s.folder_rel)
        if proposal.kind == Kind.AGENT:
            # the agent's edits go back to being uncommitted changes, as before the step
            s.repo.git.restore(f"--source={ours}", "--worktree", "--", s.folder_rel)
    elif proposal.kind == Kind.PLAYBOOK and inside:
        gitops.restore_folder(s.repo, state.incumbent, s.folder_rel)  # perfloop's knobs.json
    state.in_flight = None
    s.save_state()
    return proposal


def _refinish(s: Session, record: records.Experiment) -> None:
    """finish() for a recorded experiment, once it is sure that moving the branch back (on a
    revert) takes away only perfloop's own commit, and no edit made since the interruption."""
    head = gitops.head(s.repo)
    if head not in (record.commit, s.state.incumbent):
        _, message = gitops.parent_and_message(s.repo, head)
        raise UserError(f"refused: branch {s.state.branch} has a commit perfloop did not make "
                        f"({head[:12]}: {message.splitlines()[0][:60]}) where iteration "
                        f"{record.iteration} was being finished; move it to another branch "
                        f"(`git branch mine; git reset --keep {s.state.incumbent[:12]}`), "
                        "then resume")
    inside = s.changes_inside_folder()
    if record.status != Status.KEEP and head != s.state.incumbent and inside:
        raise UserError(f"refused: {gitops.listing(inside)} changed after perfloop was "
                        f"interrupted in iteration {record.iteration}, whose revert would "
                        "overwrite it. Commit it elsewhere or stash it, then resume")
    finish(s, record)


def _perfloops_commit(s: Session, flight: dict) -> str | None:
    """HEAD, if it is the experiment's commit that perfloop made (else None, when HEAD is the
    incumbent); raises if the branch holds a commit that is not perfloop's."""
    head = gitops.head(s.repo)
    if head == s.state.incumbent:
        return None
    parent, message = gitops.parent_and_message(s.repo, head)
    if parent == s.state.incumbent and (head == flight.get("commit")
                                        or flight.get("message") and message == flight["message"]):
        return head
    raise UserError(f"refused: branch {s.state.branch} has a commit perfloop did not make "
                    f"({head[:12]}: {message.splitlines()[0][:60]}) on top of the incumbent "
                    f"{s.state.incumbent[:12]}; move it to another branch (`git branch mine; "
                    f"git reset --keep {s.state.incumbent[:12]}`), then resume")


def _proposal_from_flight(s: Session, flight: dict) -> Proposal:
    if flight["kind"] == Kind.PLAYBOOK:
        values = tuple(freeze(v) for v in flight["values"])
        opt = (search.optimization(flight["optimization"], values)
               if flight["optimization"] in search.IDS else s.playbook.get(flight["optimization"]))
        return Proposal(Kind.PLAYBOOK, opt, values, describe=flight.get("describe", ""),
                        sampler=flight.get("sampler"))
    return Proposal(Kind(flight["kind"]), describe=flight.get("describe", ""))
