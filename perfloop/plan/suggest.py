"""What to try next, derived from the record: a per-shape dispatch right after an experiment
that won only on some buckets, then the playbook's ranking for this kernel, and the joint
search, which goes first once a stop rule would otherwise end the run."""

from __future__ import annotations

import dataclasses

from perfloop.core import dispatch, knobspace
from perfloop.core.vocab import Kind
from perfloop.measure import profiling
from perfloop.plan import budget, decide, profile_rank, search
from perfloop.store import records
from perfloop.store.session import Session


def penalties(s: Session, recs: list[records.Experiment]) -> dict[str, int]:
    out: dict[str, int] = {}
    for record in recs:
        if record.decision.get("lower_family") and record.family:
            out[record.family] = out.get(record.family, 0) + \
                s.playbook.rules.decision.family_penalty
    return out


def catalog(s: Session, recs: list[records.Experiment] | None = None
            ) -> list[decide.Suggestion]:
    """The catalog's entries for this kernel, ranked by its class (or tags), and re-ranked by a
    profile of the incumbent when one is recorded (`perfloop profile`)."""
    recs = s.records() if recs is None else recs
    tried = {r.optimization for r in recs if r.kind == Kind.PLAYBOOK}
    knobs = s.incumbent_knobs()
    ranked = decide.rank(s.playbook.optimizations, s.state.kernel_class, knobs,
                         s.spec.candidates, tried, penalties(s, recs), s.spec.tags,
                         space=knobspace.space_for(s.spec.folder))
    profile = profiling.of_incumbent(s)
    if profile is None or not ranked:
        return ranked
    return profile_rank.adjust(ranked, profile["metrics"], profile_rank.load(s.playbook_dir),
                               s.state.kernel_class, s.spec.tags,
                               source=f"the profile of {profile['commit'][:12]}")


def searches(s: Session, recs: list[records.Experiment] | None = None
             ) -> list[decide.Suggestion]:
    """The dispatch and joint experiments the record supports now."""
    recs = records.plain(s.records() if recs is None else recs)  # (search reads plain lines)
    knobs = s.incumbent_knobs()
    space = knobspace.space_for(s.spec.folder)
    out = []
    found = s.playbook.rules.search.dispatch and search.dispatch_changes(
        recs, s.state.incumbent, knobs, s.playbook.rules.decision, s.spec.headline.name,
        same=space.same)
    if found and space.why_not({**knobs, dispatch.KEY: found[0]}) is None:
        table, said, why = found
        out.append(decide.Suggestion(search.optimization(search.DISPATCH, (table,)), (table,),
                                     0, f"won only on some buckets: {why}", describe=said))
    rules = s.playbook.rules.search
    if not search.joint_tried_since_keep(recs):
        where = search.headline_bucket(recs, s.spec.headline.name)
        plan = search.joint_plan(
            recs, knobs, s.spec.headline.name, rules.joint_margin, rules.joint_max_configs,
            list(rules.interactions),
            worth=lambda p: space.worth(knobs, search.apply_joint(knobs, p, where), where),
            pair_share=rules.pair_share)
        patches = plan.patches
        if patches:
            values = tuple(patches)
            out.append(decide.Suggestion(
                search.optimization(search.JOINT, values), values, 0,
                f"{len(patches)} configs of {', '.join(sorted({k for p in patches for k in p}))}"
                f", the values within {100 * rules.joint_margin:g}% of the best in one-knob "
                f"steps, measured together: {plan.said()}", sampler=plan.as_record()))
    for tables, plan in search.bucket_joint_plans(
            recs, knobs, s.spec.headline.name, rules.joint_margin, rules.joint_max_configs,
            list(rules.interactions),
            worth=lambda t, b: space.worth(knobs, {**knobs, dispatch.KEY: t}, b),
            pair_share=rules.pair_share):
        bucket = plan.bucket
        if tables:
            values = tuple(tables)
            moved = sorted({k for p in plan.patches for k in p})
            out.append(decide.Suggestion(
                search.optimization(search.BUCKET_JOINT, values), values, 0,
                f"{len(tables)} configs of {', '.join(moved)} at {bucket} only, the values "
                f"within {100 * rules.joint_margin:g}% of the best at {plan.shape} in one-knob "
                f"steps, measured together: {plan.said()}",
                describe=f"at {bucket}: {len(tables)} configs of {', '.join(moved)}",
                sampler=plan.as_record()))
    return out


def suggestions(s: Session, recs: list[records.Experiment] | None = None,
                ranked: list[decide.Suggestion] | None = None,
                extra: list[decide.Suggestion] | None = None) -> list[decide.Suggestion]:
    """Everything worth trying now, best first; `ranked` and `extra`: catalog(s, recs) and
    searches(s, recs), when the caller has them."""
    recs = s.records() if recs is None else recs
    ranked = catalog(s, recs) if ranked is None else ranked
    extra = searches(s, recs) if extra is None else extra
    first = [sg for sg in extra if sg.optimization.id == search.DISPATCH]
    joint = [sg for sg in extra if sg.optimization.id in (search.JOINT, search.BUCKET_JOINT)]
    from perfloop.run.experiment import (  # (iteration imports this module)
        floor_shares,
        stop_inputs,
    )

    joint = search.by_headroom(joint, floor_shares(s, recs), s.spec.headline.name)

    iteration, verdicts, searched = stop_inputs(s, recs)
    stop_due = bool(verdicts) and decide.stop_reason(
        iteration, verdicts, s.playbook.rules.stop, len(ranked), searched=searched) is not None
    # the joint searches go first, too, when the budget has room for little more than them
    reserve = joint[:s.playbook.rules.search.budget_reserve]
    done = spent(recs)
    limit = s.playbook.rules.stop.time_budget_s
    if not limit:
        return first + (joint + ranked if stop_due else ranked + joint)
    planned = {id(sg): estimate(s, recs, sg, done) for sg in first + ranked + joint}
    short = budget.over(done, [planned[id(sg)] for sg in first + ranked[:1] + reserve], limit)
    ordered = first + (joint + ranked if stop_due or short else ranked + joint)
    # an experiment that would end past the budget goes behind those that fit: the run stops
    # only when none does (on the H100 RMSNorm stopped with 72 s left before a joint search
    # estimated at 91 s, while a one-candidate step estimated at 71 s was on offer). A stop
    # rule that only the searches hold off lets no catalog step in ahead of them.
    movable, behind = (first + joint, ranked) if stop_due else (ordered, [])
    late = {id(sg) for sg in movable if budget.over(done, [planned[id(sg)]], limit)}
    left = limit - sum(x.seconds for x in done)
    return ([sg for sg in movable if id(sg) not in late]
            + [_over(sg, planned[id(sg)], left) for sg in movable if id(sg) in late] + behind)


def _over(sg: decide.Suggestion, planned_s: float, left_s: float) -> decide.Suggestion:
    return dataclasses.replace(sg, reason=f"{sg.reason} (estimated at {planned_s:.0f} s, over "
                                          f"the {max(left_s, 0):.0f} s left of the time budget)")


def spent(recs: list[records.Experiment]) -> list[budget.Spent]:
    return [budget.spent(r) for r in recs]


def estimate(s: Session, recs: list[records.Experiment], sg: decide.Suggestion,
             done: list[budget.Spent] | None = None) -> float:
    """Seconds the experiment `sg` is expected to take, by the run's record (perfloop.plan.budget);
    `done`: spent(recs), when the caller has it."""
    rules = s.playbook.rules.search
    return budget.estimate_s(budget.kind_of(sg.optimization.id), len(sg.candidates),
                             spent(recs) if done is None else done,
                             screen_above=rules.screen_above,
                             screen_keep=rules.screen_keep,
                             screen_s_per_config=rules.screen_s_per_config)


def check_space(s: Session) -> None:
    """Read the kernel's knob space (canonical(), restrict()) over every catalog candidate from
    the committed knobs, so a function that fails is refused in one line before a run starts,
    not after its first experiment."""
    knobs = s.spec.read_knobs()
    space = knobspace.space_for(s.spec.folder)
    for opt in s.playbook.optimizations:
        if all(k in knobs for k in opt.moves):
            decide.candidates_for(opt, knobs, s.spec.candidates, space)
