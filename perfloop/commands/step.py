import json

from perfloop.commands import options
from perfloop.contract import knobspace
from perfloop.core import dispatch_table, naming
from perfloop.core.errors import UserError
from perfloop.contract.playbook import freeze, thaw
from perfloop.core.vocab import Kind
from perfloop.plan import decide, search
from perfloop.plan.planner import searches
from perfloop.plan.proposal import Proposal
from perfloop.report import views
from perfloop.run import confirm, experiment, loop, planning, recorded
from perfloop.store.session import Session, require_gpu

HELP = "one iteration: a playbook optimization (--opt), or your own edits (--describe)"
DESCRIPTION = """\
Runs one full iteration on the current run (start one with `perfloop init`):
  --opt ID [--value V]  apply a playbook optimization; without --value every candidate value
                        is measured and the fastest correct one is carried into the decision.
                        V is JSON, a list as the table writes it, or a bare word: 8,
                        true, '[1,2048]', 1x2048, gather_scatter.
  --describe TEXT       judge your own uncommitted edits inside the kernel folder; TEXT names
                        the change in the table. Edits outside the folder, and edits to the
                        pinned kernel.toml, are refused.
  --resume              finish an iteration that was interrupted (kill, crash, Ctrl-C).
--time-budget S replaces the run's time budget from this step on (kept in state.json); the
run's other rules stay as pinned when it started.
The experiment is committed either way; a reverted one stays reachable under refs/perfloop/."""


def add_arguments(p):
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--opt", metavar="ID", help="a playbook optimization id (see `perfloop next`)")
    what.add_argument("--describe", metavar="TEXT", help="judge your own edits in the kernel folder")
    what.add_argument("--resume", action="store_true", help="finish an interrupted iteration")
    p.add_argument("--value", metavar="V", help="with --opt: measure only this candidate value")
    options.add_settings(p, at_start=False)


def _search_proposal(s: Session, opt_id: str, value_text: str | None) -> Proposal:
    found = next((sg for sg in searches(planning.view(s)) if sg.optimization.id == opt_id), None)
    if found is None:
        why = ("the last experiment won on no bucket of shapes against what is in force"
               if opt_id == search.DISPATCH else "fewer than two knobs have values worth "
               "measuring together" + (" at any bucket but the headline's" if opt_id ==
                                       search.BUCKET_JOINT else "") +
               ", or it ran since the last kept change")
        raise UserError(f"no {opt_id} experiment to run now: {why}")
    if value_text is not None:
        raise UserError(f"--value does not go with --opt {opt_id}: its values come from the record")
    return Proposal(Kind.PLAYBOOK, found.optimization, found.candidates, describe=found.describe,
                    sampler=found.sampler)


def _playbook_proposal(s: Session, opt_id: str, value_text: str | None) -> Proposal:
    if opt_id in search.IDS:
        return _search_proposal(s, opt_id, value_text)
    opt = s.playbook.get(opt_id)
    knobs = s.incumbent_knobs()
    missing = [k for k in opt.moves if k not in knobs]
    if missing:
        raise UserError(f"optimization '{opt.id}' changes knob '{missing[0]}', which kernel "
                        f"'{s.spec.name}' does not have (its knobs: {', '.join(knobs)})")
    allowed = s.spec.candidates.get(opt.key, opt.values)
    space = knobspace.space_for(s.pinned().contract)   # the contract's, never an edit's
    what = "+".join(opt.moves)
    if value_text is None:
        values = decide.candidates_for(opt, knobs, s.spec.candidates, space)
        if not values:
            raise UserError(f"every candidate of '{opt.id}' builds the incumbent's kernel "
                            f"(equal {what}, or equal by kernel.py's canonical()) or "
                            "cannot work beside the incumbent's other knobs (kernel.py's "
                            "restrict())")
        return Proposal(Kind.PLAYBOOK, opt, values)
    value = naming.read_value(value_text)
    if opt.knobs:  # a patch, as JSON: {"tile": [..], "num_ctas": 2}
        if not isinstance(value, dict) or set(value) != set(opt.knobs):
            raise UserError(f"a value of '{opt.id}' is a JSON object of {', '.join(opt.knobs)}"
                            f", e.g. {json.dumps(thaw(allowed[0]))}")
        value = {k: freeze(v) for k, v in value.items()}
    if value not in allowed:
        raise UserError(f"value {value_text} is not a candidate of '{opt.id}' (candidates: "
                        f"{', '.join(json.dumps(thaw(v)) for v in allowed)})")
    changed = decide.step_knobs(opt, knobs, value)
    if (all(changed[k] == knobs[k] for k in opt.moves)
            and dispatch_table.table(changed) == dispatch_table.table(knobs)):
        raise UserError(f"the incumbent already has {what}={value_text}")
    why = space.why_not(changed)
    if why:
        raise UserError(f"{what}={value_text} cannot work beside the incumbent's other "
                        f"knobs, by kernel.py's restrict(): {why}")
    return Proposal(Kind.PLAYBOOK, opt, (value,))


def execute(args):
    if args.value is not None and not args.opt:
        raise UserError("--value goes with --opt")
    s = Session(args.kernel, args.playbook, options.overrides(args))
    with s.lock(), loop.interruptible(s):
        return _execute(s, args)


def _execute(s: Session, args) -> dict:
    s.require_run()
    if args.resume:
        if s.state.in_flight is None:
            raise UserError("nothing to resume: no iteration was interrupted")
        if s.spec.requires_gpu:
            require_gpu()
        record = loop.resume(s)
        if record is None:  # the interrupted iteration had been recorded: recovery finished it
            record = s.records()[-1]
        retuned = loop.retune(s)
        if retuned:  # (the stop rules, under the new budget)
            planning.settle(s)
    else:
        if args.describe is not None:
            if not args.describe.strip():
                raise UserError("--describe needs a short text naming the change")
            proposal = Proposal(Kind.AGENT, describe=" ".join(args.describe.split()))
        else:
            proposal = _playbook_proposal(s, args.opt, args.value)
        loop.prepare_step(s, proposal.kind)
        if s.spec.requires_gpu:
            require_gpu()
        retuned = loop.retune(s)
        record = experiment.run(s, proposal)
        planning.settle(s)
    if s.state.stop:
        with recorded.past(record, f"timing the run's result (it stopped: {s.state.stop})",
                           recorded.CONFIRM):
            confirm.ensure(s)
    with recorded.past(record, "answering", "`perfloop status` shows where the run stands"):
        st = views.status(s)
        return {"experiment": views.experiment(record), "incumbent": st["incumbent"],
                "stopped": st["stopped"], "stopped_by": st["stopped_by"],
                "never_tried": st["never_tried"],
                "next": [sg.optimization.id for sg in planning.offered(s)][:3],
                "retuned": retuned}


def render(r):
    lines = views.retuned_lines(r.get("retuned")) + [views.experiment_line(r["experiment"])]
    if r["stopped"]:
        lines.append(f"a stop rule fired: {r['stopped']}")
    if r["next"]:
        lines.append(f"next: {', '.join(r['next'])}")
    return "\n".join(lines)
