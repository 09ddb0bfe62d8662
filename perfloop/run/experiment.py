"""One experiment as named steps: begin, variants, screen, judge and time, weigh, commit,
record, finish. Each step reads and adds to a Trial, the experiment in progress.

Order of durable effects, which recovery (perfloop.run.recovery) relies on:
  in-flight marker (state) -> [agent edits committed, their message in the marker first]
  -> judge -> timing -> [playbook: the knobs' hash and the commit message in the marker, then
  knobs.json and the commit] -> record line -> ref + branch back to the incumbent on a revert
  -> table row -> marker cleared.
A record line is the point of no return: with it the experiment is finished on resume;
without it the experiment is set aside under a ref and redone.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from perfloop.core import dispatch_table as dispatch
from perfloop.contract import workload
from perfloop.core import naming, plainfile, progress
from perfloop.core.faults import crashpoint
from perfloop.core.errors import EnvironmentFailure
from perfloop.contract.kernel import KNOBS, knobs_text, parse_knobs
from perfloop.contract.playbook import thaw
from perfloop.core.vocab import (
    CONTROL,
    INCUMBENT,
    Kind,
    Outcome,
)
from perfloop.measure import judge, measurement, phases, trial
from perfloop.measure.outcomes import apply_timing, finalist_variants, void
from perfloop.plan import decide, weigh
from perfloop.plan.proposal import Proposal
from perfloop.run import ahead, recorded, screening
from perfloop.run.finish import finish, knobs_digest
from perfloop.store import gitops, records, snapshot
from perfloop.store.pinned import Pinned
from perfloop.store.session import Session


def label_for(value_index: int) -> str:
    return f"candidate-{value_index}"



@dataclass
class Trial:
    """An experiment in progress: what each step reads and what it adds."""

    s: Session
    proposal: Proposal
    iteration: int
    tag: str
    work: Path
    started: float                   # wall clock, for the record
    t0: float                        # monotonic, for phase times and the deadline
    deadline: float
    phase_s: dict = field(default_factory=dict)
    incumbent_dir: Path | None = None
    contract_dir: Path | None = None
    pinned: Pinned | None = None                     # the run's pinned tree (store.pinned)
    incumbent_knobs: dict = field(default_factory=dict)
    incumbent_files: dict = field(default_factory=dict)  # its folder as committed (snapshot)
    candidate_files: dict | None = None              # an agent's edit, as committed
    exported: dict = field(default_factory=dict)     # label -> the files its export holds
    where: dict = field(default_factory=dict)        # a fleet's: its tasks, workers, losses
    control: dict | None = None                      # the incumbent's A/A control
    drift: list = field(default_factory=list)        # files of the folder edited mid-step
    variants: list = field(default_factory=list)     # the incumbent first, then candidates
    candidates: list = field(default_factory=list)   # still in the running
    proposed: list = field(default_factory=list)     # every candidate proposed
    values: dict = field(default_factory=dict)       # label -> the value it tries
    outcome: dict = field(default_factory=dict)      # label -> (Outcome, why), judged ones
    screened: dict = field(default_factory=dict)     # label -> (Outcome, why), screened out
    screen_ratios: dict = field(default_factory=dict)
    judge_passed: bool = False                       # some candidate passed the judge
    judged: judge.JudgeResult | None = None
    timing: phases.Timing | None = None
    passes: list = field(default_factory=list)       # summaries of the timing's passes
    best: str | None = None                          # the label the decision is about
    compile_ahead: dict = field(default_factory=dict)

    @property
    def kind(self) -> Kind:
        return self.proposal.kind

    @property
    def rules(self):
        return self.s.playbook.rules

    @property
    def allowed(self) -> list:
        """What children may import from inside the repository: the exported code, the run's
        pinned tree, and the iteration's work folder, where torch.compile and Triton write
        the modules they then import (each child's own cache). Not the kernel folder: what
        runs is the commit, never the working tree."""
        assert self.pinned is not None   # (pinned before any child runs)
        return [self.work, self.s.copies(self.tag), self.pinned.root]

    @property
    def dispatching(self) -> bool:
        """A change of the dispatch table: a dispatch or a bucket joint search."""
        return (self.kind == Kind.PLAYBOOK and self.proposal.optimization is not None
                and self.proposal.optimization.knob == dispatch.KEY)

    @property
    def shapes(self) -> list:
        """Every shape timed: the benchmark's, and the held-back ones ([[held_back]], and
        those drawn from a declared workload with the run's seed) for a dispatch change and,
        where the kernel declares a workload, for every experiment but the baseline: a
        regression at one of them reverts the change (perfloop.plan.decide)."""
        spec = self.s.spec
        declared = spec.workload is not None and spec.workload.declared
        if not (self.dispatching or declared and self.kind != Kind.BASELINE):
            return list(spec.shapes)
        return list(spec.shapes) + list(workload.held_out(spec, self.s.state.workload_seed))

    @property
    def timed_shapes(self) -> list[dict]:
        """`shapes` for the timer, each with the workload's bucket whose knobs it runs: where
        the kernel has no bucket() hook, the buckets decisions are taken in."""
        return workload.timer_shapes(self.s.spec, self.shapes)

    @property
    def choosing(self):
        """Where it is screened and its fastest candidate chosen: the headline, or the shape a
        bucket joint search was planned at (the only bucket it changes)."""
        at = (self.proposal.sampler or {}).get("shape")
        return next((sh for sh in self.s.spec.shapes if sh.name == at), self.s.spec.headline)


def run(s: Session, proposal: Proposal) -> records.Experiment:
    """Run one experiment to its record. The caller has checked the tree, the branch and what
    is pinned; from here on every outcome is recorded."""
    with progress.task(f"iteration {len(s.records())}", (proposal.describe or proposal.name)[:60]):
        trial = begin(s, proposal)
        propose_variants(trial)
        if trial.kind == Kind.PLAYBOOK and len(trial.candidates) > trial.rules.search.screen_above:
            screen(trial)
        judge_and_time(trial)
        verdict = weigh_trial(trial)
        commit = commit_trial(trial, verdict)
        record = record_trial(trial, verdict, commit)
        with recorded.past(record, "finishing it (its ref, the branch, the table's row)",
                           recorded.FINISH):
            finish(s, record)
        return record


def begin(s: Session, proposal: Proposal) -> Trial:
    """The in-flight marker, an agent's edits read once and committed as they are, and the
    pinned tree checked."""
    iteration, started, t0 = len(s.records()), time.time(), time.monotonic()
    tag = f"iter-{iteration:02d}-{phases.nonce()}"
    trial = Trial(s, proposal, iteration, tag, s.work / tag, started, t0,
                  t0 + s.playbook.rules.iteration_timeout_s)
    s.state.in_flight = {"iteration": iteration, **proposal.to_json(), "commit": None,
                         "message": None, "knobs_sha256": None, "tag": tag, "started_at": started}
    s.save_state()
    trial.incumbent_files = snapshot.from_commit(s.repo, s.state.incumbent, s.folder_rel)
    if proposal.kind == Kind.AGENT:
        t = time.monotonic()
        trial.candidate_files = snapshot.from_worktree(s.repo, s.root, s.folder_rel)
        _commit(s, _commit_message(trial, None), trial.candidate_files)
        trial.phase_s["commit"] = phases.elapsed(t)
    crashpoint("started", iteration)
    trial.work.mkdir(parents=True, exist_ok=True)
    trial.pinned = s.pinned(fresh=True)
    trial.contract_dir = trial.pinned.contract
    trial.incumbent_knobs = _knobs_of(s, trial.incumbent_files, s.state.incumbent)
    return trial


def _knobs_of(s: Session, files: dict, where: str) -> dict:
    """The knobs a folder's files commit (its knobs.json, as committed)."""
    data = files.get(KNOBS, (0, b""))[1]
    return parse_knobs(data.decode("utf-8", "replace"),
                       f"{s.folder_rel}/{KNOBS} at {where[:12] if where else 'the edit'}")


def propose_variants(t: Trial) -> None:
    """The incumbent, its A/A control and each candidate, each from an export of the files it
    commits (perfloop.store.snapshot), written in a random order at folders of one shape: no
    path, name or time of writing tells a variant which role it plays."""
    s, proposal = t.s, t.proposal
    jobs = [(INCUMBENT, t.incumbent_files), (CONTROL, t.incumbent_files)]
    if t.kind == Kind.AGENT:
        assert t.candidate_files is not None   # (an agent's experiment reads its edit first)
        jobs.append((label_for(0), t.candidate_files))
        values = [None]
    elif t.kind == Kind.PLAYBOOK:
        from perfloop.plan import search
        opt, recs = proposal.optimization, s.records()
        assert opt is not None   # (a playbook experiment's proposal names its entry)
        # a joint search's patch holds where the headline runs; a catalog entry's everywhere
        bucket = (search.headline_bucket(recs, s.spec.headline.name)
                  if opt.knob == naming.MULTI and not opt.knobs else None)
        measured = search.measured_buckets(recs, s.spec.headline.name)
        values = list(proposal.values)
        for i, v in enumerate(values):
            knobs = _with_measured(_knobs_with(t.incumbent_knobs, opt, v, bucket), measured)
            jobs.append((label_for(i), snapshot.with_file(t.incumbent_files, KNOBS,
                                                          knobs_text(knobs))))
    folders = {}
    for label, files in random.sample(jobs, len(jobs)):
        folders[label] = snapshot.export(files, s.copies(t.tag), s.folder_rel)
    t.exported = dict(jobs)
    incumbent = {"label": INCUMBENT, "folder": folders[INCUMBENT], "knobs": t.incumbent_knobs}
    t.incumbent_dir = folders[INCUMBENT]
    t.control = {"label": CONTROL, "folder": folders[CONTROL], "knobs": t.incumbent_knobs}
    if t.kind == Kind.AGENT:
        assert t.candidate_files is not None
        _require_exported(s, t.candidate_files, folders[label_for(0)])
    candidates = [incumbent] if t.kind == Kind.BASELINE else [
        {"label": label, "folder": folders[label],
         "knobs": _knobs_of(s, files, "" if t.kind == Kind.AGENT else s.state.incumbent)}
        for label, files in jobs[2:]]
    t.variants = [incumbent] + ([] if t.kind == Kind.BASELINE else candidates)
    t.candidates, t.proposed = list(candidates), list(candidates)
    t.values = dict(zip((v["label"] for v in candidates), proposal.values)) \
        if t.kind == Kind.PLAYBOOK else {}


def _require_exported(s: Session, files: dict, folder: Path) -> None:
    """The agent's commit holds, byte for byte, the files its export runs."""
    assert s.state.in_flight is not None   # (an agent's experiment is always in flight)
    committed = snapshot.from_commit(s.repo, s.state.in_flight["commit"], s.folder_rel)
    if committed != files or snapshot.read_back(folder) != files:
        raise EnvironmentFailure(f"commit {s.state.in_flight['commit'][:12]} does not hold the "
                                 f"files perfloop read from {s.folder_rel}/ and exported: git's "
                                 "object store or the sandbox folder was changed meanwhile; "
                                 "`perfloop step --resume` runs the experiment again",
                                 during=True)


def _with_measured(knobs: dict, measured: list[str]) -> dict:
    """The knobs with their dispatch table (if any) listing every measured bucket, so that a
    launch in an unmeasured one runs as the nearest measured bucket, as the timer counts it."""
    table = dispatch.complete(dispatch.table(knobs), measured)
    return {**knobs, dispatch.KEY: table} if table else knobs


def _knobs_with(knobs: dict, opt, value, bucket: str | None) -> dict:
    if opt.knob == naming.MULTI and not opt.knobs:   # a joint search's patch
        from perfloop.plan import search
        return search.apply_joint(knobs, value, bucket)
    if opt.knob == dispatch.KEY:
        return {**knobs, opt.knob: value}
    return decide.step_knobs(opt, knobs, value)   # a catalog step (record: "every_bucket")


def screen(t: Trial) -> None:
    """Many candidates: time each at one shape first, and judge only the fastest few."""
    start = time.monotonic()
    timing = screening.screen(t)
    out = {v["label"]: (Outcome.OK, "") for v in t.candidates}
    if not timing.crashed and timing.raw:
        apply_timing(out, timing, Kind.PLAYBOOK)
        void(out, t.s.foreign_imports(t.allowed)(timing.imports), "kernel code imported {} "
             "from outside its folder while screened, which no experiment commits")
    t.screened, t.screen_ratios = screening.sift(out, timing, t.rules.search.screen_keep,
                                                 t.choosing.name)
    t.phase_s["screen"] = phases.elapsed(start)
    t.candidates = [v for v in t.candidates if v["label"] not in t.screened]
    t.variants = [t.variants[0]] + t.candidates


def judge_and_time(t: Trial) -> None:
    """The judge and the timer (perfloop.measure.measurement), here or on a fleet's worker."""
    s = t.s
    declared = dispatch.declared(getattr(s.spec.workload, "finalists", ()))
    assert t.control is not None and t.pinned is not None   # (propose_variants, the step)
    same = t.kind != Kind.BASELINE and all(_same_code(c["folder"], t.incumbent_dir)
                                           for c in t.candidates)
    plan = trial.Plan(
        kind=t.kind, iteration=t.iteration, incumbent=t.variants[0], control=t.control,
        candidates=t.candidates,
        finalists=finalist_variants(t.candidates, declared,
                                    t.incumbent_knobs if same else None),
        shapes=t.timed_shapes, choosing=t.choosing.name, tolerance=s.spec.tolerance,
        rules=t.rules, requires_gpu=s.spec.requires_gpu, deadline=t.deadline,
        only_buckets=_touched_buckets(t), always=[s.spec.headline.name, *_tuned(t)])
    place = trial.Place(
        root=s.root, work=t.work, pinned=t.pinned,
        env=phases.child_env(s.playbook_dir, s.playbook.rules.pass_env),
        confinement=s.confinement(), cache=s.compile_cache, ceilings_cache=s.ceilings_cache,
        foreign=s.foreign_imports(t.allowed))
    if s.fleet is not None:   # on a fleet's workers (perfloop.fleet.driver)
        got = s.fleet.measure(s, t, plan)
        t.where = got.where
    else:
        pool, s.judges = s.judges, None  # started while the previous experiment was timed
        waiting, s.timer = s.timer, None
        got = measurement.measure(plan, place, pool=pool, waiting=waiting,
                                  after_judge=lambda: ahead.start(s))
    t.outcome, t.judged, t.timing, t.passes, t.best = (got.outcome, got.judged, got.timing,
                                                       got.passes, got.best)
    t.judge_passed, t.compile_ahead = got.judge_passed, got.compile_ahead
    t.phase_s.update(got.phase_s)
    if s.perfloop_changed():  # (where no sandbox kept kernel code from perfloop's files)
        _fail_all(t, "perfloop's own source files changed while kernel code ran")
    _check_drift(t)


def _fail_all(t: Trial, why: str) -> None:
    t.outcome = dict.fromkeys(t.outcome, (Outcome.FAIL, why))
    t.passes, t.best = [], None


def _check_drift(t: Trial) -> None:
    """What ran is the commit, whatever the working tree says; but an edit to the kernel folder
    made while the step ran is refused, not raced: nothing is kept, and perfloop leaves the
    edit where it is (perfloop.run.finish)."""
    s = t.s
    expected = t.candidate_files if t.kind == Kind.AGENT else t.incumbent_files
    assert expected is not None and t.control is not None
    live = snapshot.from_worktree(s.repo, s.root, s.folder_rel)
    t.drift = sorted(p for p in set(live) | set(expected) if live.get(p) != expected.get(p))
    changed = [v["label"] for v in t.proposed + [t.variants[0], t.control]
               if snapshot.read_back(v["folder"]) != t.exported[v["label"]]]
    if changed:   # (children cannot write there: a process of the user's did, unconfined)
        _fail_all(t, f"the exported code of {', '.join(changed)} changed while it ran: what "
                     "ran is not known to be the commit")
        return
    if t.drift:
        what = "baseline" if t.kind == Kind.BASELINE else "step"
        _fail_all(t, f"{s.folder_rel}/ was edited while the {what} ran "
                     f"({gitops.listing(t.drift)}): what was judged and timed is the commit, "
                     f"but a {what} counts only on a folder nobody edits meanwhile; the edit "
                     "is left as it is, uncommitted")


def _same_code(a, b) -> bool:
    """Whether two kernel folders hold the same Python files, byte for byte."""
    def code(folder):
        return {p.name: plainfile.read_bytes(p) for p in sorted(Path(folder).glob("*.py"))}
    try:
        return code(a) == code(b)
    except OSError:
        return False


def _tuned(t: Trial) -> list[str]:
    """Held-out shapes in buckets no benchmark shape measured, where the workload says unseen =
    "tune": a launch there runs whichever finalist (any measured bucket's knobs, or a declared
    one) was fastest, so a change of any bucket's entry may change its time, whatever bucket
    it counts in."""
    return [shape["name"] for shape in t.timed_shapes if shape.get("tuned")]


def _touched_buckets(t: Trial) -> list[str] | None:
    """The buckets a change of the dispatch table touches, in any of its candidates (None for
    any other experiment): only their shapes, and the headline, are timed."""
    if not t.dispatching:
        return None
    before = dispatch.table(t.incumbent_knobs)
    return sorted({b for v in t.proposal.values
                   for b in dispatch.changed_buckets(before, thaw(v))})


def weigh_trial(t: Trial) -> decide.Verdict:
    """The playbook's verdict (perfloop.plan.weigh) on what was judged and timed."""
    summary = _summary(t)
    rules, head = t.rules.decision, t.s.spec.headline.name
    if summary is None:
        crashed = t.timing.crashed if t.timing is not None else ""
        return weigh.untimed(t.kind, {**t.outcome, **t.screened}, crashed, t.judge_passed)
    if t.kind == Kind.BASELINE:
        return weigh.baseline(summary, head, rules, t.rules.verify.max_control_gap)
    chosen = t.values.get(t.best) if t.dispatching else None
    assert t.best is not None   # (a summary is only had with a best)
    return weigh.verdict(summary, t.best, head, rules, dispatch_value=chosen,
                       incumbent_knobs=t.incumbent_knobs)


def _deciding(t: Trial) -> dict | None:
    """The pass the decision is about (the last), as summarized; None without a best."""
    return t.passes[-1] if t.passes and t.best is not None else None


def _summary(t: Trial) -> weigh.Summary | None:
    """The deciding pass, typed as the record holds it."""
    deciding = _deciding(t)
    return records.summary(deciding) if deciding is not None else None


def _chosen(t: Trial) -> dict:
    return next((v for v in t.variants if v["label"] == t.best),
                (t.candidates or t.proposed)[0])


def committed_knobs(t: Trial, verdict: decide.Verdict) -> dict:
    """What the experiment commits: the chosen candidate's knobs, its dispatch table without
    the buckets the verdict left out (there, the incumbent's entries)."""
    knobs = _chosen(t)["knobs"]
    if not verdict.dropped_buckets:
        return knobs
    before, after = dispatch.table(t.incumbent_knobs), dispatch.table(knobs)
    table = {b: (before if b in verdict.dropped_buckets else after).get(b)
             for b in sorted(set(before) | set(after))}
    table = {b: entry or {} for b, entry in table.items()}
    out = {k: v for k, v in knobs.items() if k != dispatch.KEY}
    return {**out, dispatch.KEY: table} if any(table.values()) else out


def commit_trial(t: Trial, verdict: decide.Verdict) -> str:
    """The experiment's commit, whatever its outcome: the chosen candidate's knobs.json (a
    dispatch change kept in some buckets: in those only), on the incumbent's other files."""
    s, start = t.s, time.monotonic()
    if t.kind == Kind.BASELINE:
        commit = s.state.incumbent
    elif t.kind == Kind.AGENT:
        assert s.state.in_flight is not None   # (always, in a step)
        commit = s.state.in_flight["commit"]
    else:
        text = knobs_text(committed_knobs(t, verdict))
        assert s.state.in_flight is not None   # (always, in a step)
        s.state.in_flight["knobs_sha256"] = knobs_digest(text)
        s.save_state()
        if not t.drift:   # the working tree follows the commit; an edit made meanwhile stays
            (s.spec.folder / KNOBS).write_text(text, encoding="utf-8")
        commit = _commit(s, _commit_message(t, t.values.get(_chosen(t)["label"]),
                                            verdict.dropped_buckets),
                         snapshot.with_file(t.incumbent_files, KNOBS, text))
    t.phase_s["commit"] = t.phase_s.get("commit", 0) + phases.elapsed(start)
    crashpoint("commit", t.iteration)
    return commit


def _commit_message(t: Trial, value, dropped: tuple = ()) -> str:
    head = f"perfloop: iteration {t.iteration}: "
    if t.kind == Kind.AGENT:
        return f"{head}agent edit: {t.proposal.describe}"
    opt = t.proposal.optimization
    assert opt is not None   # (neither a baseline nor an agent's edit)
    if opt.id == naming.DISPATCH:
        return f"{head}dispatch: {naming.dispatch_kept(t.proposal.describe, dropped)}"
    if opt.id == naming.BUCKET_JOINT:
        return head + naming.bucket_joint_row(t.incumbent_knobs.get(opt.knob), value)
    return f"{head}{opt.id} ({naming.setting(opt.knob, thaw(value))})"


def _commit(s: Session, message: str, files: dict) -> str:
    """Commit exactly `files` as the kernel folder. Announce the commit in the marker first, so
    recovery can tell it is perfloop's."""
    assert s.state.in_flight is not None   # (commits are made only in flight)
    s.state.in_flight["message"] = message
    s.save_state()
    sha = gitops.commit_files(s.repo, s.folder_rel, files, message)
    s.state.in_flight["commit"] = sha
    s.save_state()
    return sha


def record_trial(t: Trial, verdict: decide.Verdict, commit: str) -> records.Experiment:
    """The record line, written: the point of no return."""
    s, deciding, chosen = t.s, _deciding(t), _chosen(t)
    knob = t.proposal.optimization.knob if t.proposal.optimization else None
    knobs = _knobs_of(s, snapshot.from_commit(s.repo, commit, s.folder_rel), commit)
    value = t.values.get(chosen["label"])
    if verdict.dropped_buckets:  # the table committed, and the headline where it runs
        value = knobs.get(dispatch.KEY, {})
    labels = ({label: thaw(x) for label, x in t.values.items()}
              if t.kind == Kind.PLAYBOOK else {})
    line = {
        "schema": records.SCHEMA, "iteration": t.iteration, "kind": t.kind,
        "optimization": t.proposal.name, "describe": t.proposal.describe,
        "family": t.proposal.optimization.family if t.proposal.optimization else None,
        "knob": knob, "value": thaw(value) if t.kind == Kind.PLAYBOOK else None,
        "candidates": thaw(t.proposal.values),
        "incumbent_value": thaw(t.incumbent_knobs.get(knob))
        if knob in t.incumbent_knobs else None,
        "knobs": {k: thaw(x) for k, x in knobs.items()},
        "commit": commit, "incumbent_before": s.state.incumbent, "branch": s.state.branch,
        "ref": s.ref_name(t.iteration), "status": verdict.status,
        "correctness": verdict.correctness,
        "latency_ms": _headline_ms(t, records.summary(deciding), verdict) if deciding else None,
        "decision": asdict(verdict),
        "outcomes": {label: {"value": labels.get(label), "outcome": o[0], "reason": o[1]}
                     for label, o in {**t.outcome, **t.screened}.items()},
        "correctness_detail": _correctness_detail(t.judged),
        "timing": _timing_detail(t, deciding or (t.passes or [None])[0]),
        "environment": t.timing.raw.get("environment") if t.timing and t.timing.raw else None,
        "phases_s": {**t.phase_s, "total": phases.elapsed(t.t0)},
        "compile_ahead": t.compile_ahead, "started_at": t.started, "finished_at": time.time(),
    }
    if t.kind == Kind.PLAYBOOK and (knob not in (None, naming.MULTI, dispatch.KEY)
                                    or t.proposal.optimization and t.proposal.optimization.knobs):
        line["every_bucket"] = True   # its values ran in every bucket's entry too
    if t.where:   # measured on a fleet: which machines and GPUs, and any worker lost
        line["fleet"] = t.where
    if t.proposal.sampler:  # a joint search: what chose its configs, out of how many
        line["sampler"] = t.proposal.sampler
    if t.screen_ratios:  # every candidate's ratio where it was screened (the headline's)
        line["screening"] = {"shape": t.choosing.name, "ratios": t.screen_ratios}
    record = records.Experiment.from_dict(line)  # (what is written is what resume reads)
    records.append(s.records_path, record)
    crashpoint("record", t.iteration)
    return record


def _headline_ms(t: Trial, summary: weigh.Summary, verdict: decide.Verdict) -> float:
    """The headline's median as committed: the incumbent's where its bucket was left out."""
    shape = summary[t.s.spec.headline.name]
    label = INCUMBENT if shape.bucket in verdict.dropped_buckets else t.best
    assert label is not None   # (a summary is only had with a best)
    return shape.variants[label].median_ms


def _correctness_detail(judged: judge.JudgeResult | None) -> dict:
    judged = judged or judge.JudgeResult(detail="none left to judge")
    return {"passed": judged.passed, "crashed": judged.crashed, "cases": judged.cases,
            "detail": judged.detail}


def _timing_detail(t: Trial, summary: dict | None) -> dict | None:
    """The deciding pass; where no candidate was carried to a decision (each fell off a cliff
    at some shape), the pass that timed them at the others: what a dispatch is planned from."""
    if summary is None:
        return None
    assert t.timing is not None   # (a summary is of a timing's pass)
    raw = t.timing.raw
    labels = {label: thaw(x) for label, x in t.values.items()} if t.kind == Kind.PLAYBOOK else {}
    return {"shapes": summary, "selection": t.passes[0] if len(t.passes) > 1 else None,
            "method": raw.get("method"), "ceilings": raw.get("ceilings"), "chosen": t.best,
            "labels": labels}
