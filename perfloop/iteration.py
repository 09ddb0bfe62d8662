"""One experiment: judge, time, commit, decide, record. And recovery of an interrupted one.

Order of durable effects, which recovery relies on:
  in-flight marker (state) -> [agent edits committed] -> judge -> timing -> experiment commit
  -> record line -> ref + branch back to the incumbent on revert -> table row -> marker cleared.
A record line is the point of no return: with it the experiment is finished on resume;
without it the experiment is set aside under a ref and redone.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from perfloop import decide, gitops, phases, records, table
from perfloop.playbook import Optimization, freeze, thaw
from perfloop.faults import crashpoint
from perfloop.session import Session
from perfloop.stats import Comparison

BASELINE, PLAYBOOK, AGENT = "baseline", "playbook", "agent"


@dataclass(frozen=True)
class Proposal:
    kind: str
    optimization: Optimization | None = None
    values: tuple = ()
    describe: str = ""

    @property
    def name(self) -> str:
        if self.kind == BASELINE:
            return "baseline"
        if self.kind == AGENT:
            return "agent-edit"
        return self.optimization.id

    def to_json(self) -> dict:
        return {"kind": self.kind, "optimization": self.name, "values": thaw(self.values),
                "describe": self.describe}


def label_for(value_index: int) -> str:
    return f"candidate-{value_index}"


def _row_name(record: dict) -> str:
    if record["kind"] == BASELINE:
        return "baseline"
    if record["kind"] == AGENT:
        return record["describe"]
    return f"{record['optimization']}: {record['knob']}={_show(record['value'])}"


def _show(value) -> str:
    if isinstance(value, list):
        return "x".join(str(v) for v in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def _variants(s: Session, proposal: Proposal, incumbent_dir, incumbent_knobs) -> list[dict]:
    incumbent = {"label": "incumbent", "folder": incumbent_dir, "knobs": incumbent_knobs}
    if proposal.kind == BASELINE:
        return [incumbent]
    if proposal.kind == AGENT:
        return [incumbent, {"label": label_for(0), "folder": s.spec.folder,
                            "knobs": s.spec.read_knobs()}]
    knob = proposal.optimization.knob
    return [incumbent] + [{"label": label_for(i), "folder": s.spec.folder,
                           "knobs": {**incumbent_knobs, knob: v}}
                          for i, v in enumerate(proposal.values)]


def _comparisons(summary: dict, label: str) -> dict[str, Comparison]:
    return {name: Comparison(**shape["vs_incumbent"][label]) for name, shape in summary.items()}


def _below_floor(summary: dict, label: str, tolerance: float) -> tuple[str, ...]:
    return tuple(name for name, shape in summary.items()
                 if shape["floor_ms"] and shape["variants"][label]["median_ms"]
                 < shape["floor_ms"] * (1 - tolerance))


def run(s: Session, proposal: Proposal) -> dict:
    """Run one experiment to its record. The caller has checked the tree and the branch."""
    state = s.state
    iteration = len(s.records())
    rules = s.playbook.rules
    started, t0 = time.time(), time.monotonic()
    deadline = t0 + rules.iteration_timeout_s
    phase_s: dict[str, float] = {}
    state.in_flight = {"iteration": iteration, **proposal.to_json(), "commit": None,
                       "started_at": started}
    s.save_state()
    if proposal.kind == AGENT:
        t = time.monotonic()
        state.in_flight["commit"] = gitops.commit_folder(
            s.repo, s.folder_rel, f"perfloop: iteration {iteration}: agent edit: {proposal.describe}")
        phase_s["commit"] = phases.elapsed(t)
        s.save_state()
    crashpoint("started", iteration)

    s.work.mkdir(parents=True, exist_ok=True)
    incumbent_dir = s.export_commit(state.incumbent)
    incumbent_knobs = s.spec.read_knobs(incumbent_dir)
    variants = _variants(s, proposal, incumbent_dir, incumbent_knobs)
    candidates = variants if proposal.kind == BASELINE else variants[1:]
    tag = f"iter-{iteration:02d}"

    judged = phases.judge(s.spec.judge, candidates, cwd=s.root, work=s.work, tag=tag,
                          timeout_s=deadline - time.monotonic())
    phase_s["correctness"] = judged.wall_s
    crashpoint("correctness", iteration)
    passing = [v for v in candidates if judged.passed.get(v["label"])]
    timing = summary = None
    chosen = candidates[0]  # what gets committed when nothing is timed
    if judged.crashed:
        verdict, detail = _crashed(judged.detail, correct=False), judged.detail
    elif not passing:
        verdict, detail = decide.decide(decide.Outcome(correct=False), rules.decision), judged.detail
    else:
        control = dict(variants[0], label=phases.CONTROL)
        timed = [variants[0], control] + (passing if proposal.kind != BASELINE else [])
        timing = phases.time_variants(timed, [sh.as_dict() for sh in s.spec.shapes], rules,
                                      ceilings_cache=s.ceilings_cache, work=s.work, tag=tag,
                                      timeout_s=deadline - time.monotonic(), cwd=s.root)
        phase_s["timing"] = timing.wall_s
        crashpoint("timing", iteration)
        if timing.crashed:
            verdict, detail = _crashed(timing.detail, correct=True), timing.detail
        else:
            summary = phases.summarize_timing(timing.raw, [v["label"] for v in timed], "incumbent")
            chosen, verdict = _weigh(s, proposal, timed, summary)
            detail = "timed"

    t = time.monotonic()
    commit = _commit_experiment(s, proposal, iteration, chosen, incumbent_knobs)
    phase_s["commit"] = phase_s.get("commit", 0) + phases.elapsed(t)
    state.in_flight["commit"] = commit
    s.save_state()
    crashpoint("commit", iteration)

    head_name = s.spec.headline.name
    latency = summary[head_name]["variants"][chosen["label"]]["median_ms"] if summary else None
    value = chosen["knobs"].get(proposal.optimization.knob) if proposal.kind == PLAYBOOK else None
    record = {
        "schema": records.SCHEMA, "iteration": iteration, "kind": proposal.kind,
        "optimization": proposal.name, "describe": proposal.describe,
        "family": proposal.optimization.family if proposal.optimization else None,
        "knob": proposal.optimization.knob if proposal.optimization else None,
        "value": thaw(value), "candidates": thaw(proposal.values),
        "knobs": {k: thaw(x) for k, x in chosen["knobs"].items()},
        "commit": commit, "incumbent_before": state.incumbent, "branch": state.branch,
        "ref": s.ref_name(iteration),
        "status": verdict.status, "correctness": verdict.correctness, "latency_ms": latency,
        "decision": asdict(verdict), "detail": detail,
        "correctness_detail": {"passed": judged.passed, "cases": judged.cases} if judged else None,
        "timing": {"shapes": summary, "method": timing.raw.get("method"),
                   "ceilings": timing.raw.get("ceilings"), "chosen": chosen["label"],
                   "labels": {v["label"]: thaw(v["knobs"].get(proposal.optimization.knob))
                              for v in variants[1:]} if proposal.kind == PLAYBOOK else {}}
        if summary else None,
        "environment": timing.raw.get("environment") if timing and not timing.crashed else None,
        "phases_s": {**phase_s, "total": phases.elapsed(t0)},
        "started_at": started, "finished_at": time.time(),
    }
    records.append(s.records_path, record)
    crashpoint("record", iteration)
    finish(s, record)
    return record


def _crashed(detail: str, correct: bool) -> decide.Verdict:
    return decide.Verdict(decide.CRASH, "PASS" if correct else "FAIL", detail)


def _weigh(s: Session, proposal: Proposal, timed: list[dict], summary: dict):
    """The fastest candidate at the headline shape, and the playbook's verdict on it."""
    rules = s.playbook.rules.decision
    head = s.spec.headline.name
    if proposal.kind == BASELINE:
        below = _below_floor(summary, "incumbent", rules.floor_tolerance)
        aa = summary[head]["vs_incumbent"][phases.CONTROL]
        if below:
            return timed[0], decide.Verdict(decide.REVERT, "PASS", "baseline measured faster "
                                            f"than the physical floor on {', '.join(below)}: "
                                            "the measurement is broken")
        return timed[0], decide.Verdict(decide.KEEP, "PASS", "baseline; the same code timed "
                                        f"twice differs by {100 * abs(aa['ratio'] - 1):.2f}% "
                                        f"(noise {100 * summary[head]['noise']:.2f}%) at the "
                                        "headline shape")
    best = min(timed[2:], key=lambda v: summary[head]["vs_incumbent"][v["label"]]["ratio"])
    outcome = decide.Outcome(correct=True, comparisons=_comparisons(summary, best["label"]),
                             headline=head,
                             below_floor=_below_floor(summary, best["label"], rules.floor_tolerance))
    return best, decide.decide(outcome, rules)


def _commit_experiment(s: Session, proposal: Proposal, iteration: int, chosen: dict,
                       incumbent_knobs: dict) -> str:
    if proposal.kind == BASELINE:
        return s.state.incumbent
    if proposal.kind == AGENT:
        return s.state.in_flight["commit"]
    knob = proposal.optimization.knob
    s.spec.write_knobs({**incumbent_knobs, knob: chosen["knobs"][knob]})
    message = (f"perfloop: iteration {iteration}: {proposal.optimization.id} "
               f"({knob}={_show(thaw(chosen['knobs'][knob]))})")
    return gitops.commit_folder(s.repo, s.folder_rel, message)


def finish(s: Session, record: dict) -> None:
    """Everything after the record line; idempotent, so recovery can simply call it again."""
    state = s.state
    iteration = record["iteration"]
    gitops.set_ref(s.repo, record["ref"], record["commit"])
    if record["status"] == decide.KEEP:
        state.incumbent = record["commit"]
        if record["kind"] == BASELINE:
            _classify(s, record)
    elif gitops.head(s.repo) != state.incumbent:
        gitops.move_branch_to(s.repo, state.incumbent, s.folder_rel)
    crashpoint("git", iteration)
    rows = table.read_rows(s.table_path)
    if len(rows) == iteration:
        table.append_row(s.table_path, table.format_row(
            iteration, _row_name(record), record["latency_ms"], record["correctness"],
            record["status"]))
    crashpoint("table", iteration)
    state.in_flight = None
    state.stopped = _stop_after(s, record)
    s.save_state()


def _classify(s: Session, record: dict) -> None:
    shape = record["timing"]["shapes"][s.spec.headline.name]
    s.state.kernel_class, s.state.intensity = decide.classify(shape["bytes"], shape["flops"])


def verdicts(recs: list[dict]) -> list[decide.Verdict]:
    return [decide.Verdict(**r["decision"]) for r in recs if r["kind"] != BASELINE]


def _stop_after(s: Session, record: dict) -> str | None:
    if record["kind"] == BASELINE:
        return None if record["status"] == decide.KEEP else (
            f"the baseline did not pass ({record['decision']['reason']}); fix the kernel first")
    from perfloop.suggest import suggestions

    return decide.stop_reason(record["iteration"], verdicts(s.records()),
                              s.playbook.rules.stop, len(suggestions(s)))


def recover(s: Session) -> Proposal | None:
    """Bring an interrupted run back to a consistent state. Returns what must be redone."""
    state = s.state
    flight = state.in_flight
    recs = s.records()
    if flight is None:
        if len(table.read_rows(s.table_path)) < len(recs):  # killed between record and row
            finish(s, recs[-1])
        return None
    done = next((r for r in recs if r["iteration"] == flight["iteration"]), None)
    if done is not None:
        finish(s, done)
        return None
    # not recorded: set the experiment aside and redo it
    proposal = _proposal_from_flight(s, flight)
    head = gitops.head(s.repo)
    # a commit made just before a kill may not be in the marker yet: it is then HEAD
    commit = flight.get("commit") or (head if head != state.incumbent else None)
    if commit and commit != state.incumbent:
        gitops.set_ref(s.repo, s.ref_name(flight["iteration"], "abandoned"), commit)
    if head != state.incumbent:
        gitops.move_branch_to(s.repo, state.incumbent, s.folder_rel)
    if proposal.kind == AGENT and commit:
        # put the agent's edits back as uncommitted changes, as they were before the step
        s.repo.git.restore(f"--source={commit}", "--worktree", "--", s.folder_rel)
    elif proposal.kind != AGENT:
        gitops.restore_folder(s.repo, state.incumbent, s.folder_rel)
    state.in_flight = None
    s.save_state()
    return proposal


def _proposal_from_flight(s: Session, flight: dict) -> Proposal:
    if flight["kind"] == PLAYBOOK:
        return Proposal(PLAYBOOK, s.playbook.get(flight["optimization"]),
                        tuple(freeze(v) for v in flight["values"]))
    return Proposal(flight["kind"], describe=flight.get("describe", ""))
