"""The one place that decides what the loop does next: `next_step(view)` returns the next
experiment (a Proposal) or why the run stops (a Stop), from the record alone (a RunView,
perfloop.plan.view). What is on offer: a per-shape dispatch right after an experiment that won
only on some buckets, then the playbook's ranking for this kernel, and the joint searches,
which go first once a stop rule would otherwise end the run, or when the time budget has room
for little more than them. The loop, `step` and `next` ask it; no other module decides what
comes next."""

from __future__ import annotations

import dataclasses

from perfloop.core import dispatch_table as dispatch
from perfloop.core.naming import SEARCH_IDS
from perfloop.core.vocab import Kind, Status, Stop, StopReason
from perfloop.plan import bucket_stops, budget, decide, profile_rank, search
from perfloop.plan.proposal import Proposal
from perfloop.plan.view import RunView
from perfloop.store.records import Experiment, incumbent_timed


# ---- what is on offer -------------------------------------------------------------------
def penalties(v: RunView) -> dict[str, int]:
    out: dict[str, int] = {}
    for record in v.records:
        if record.decision.get("lower_family") and record.family:
            out[record.family] = out.get(record.family, 0) + v.rules.decision.family_penalty
    return out


def catalog(v: RunView) -> list[decide.Suggestion]:
    """The catalog's entries for this kernel, ranked by its class (or tags), and re-ranked by a
    profile of the incumbent when one is recorded (`perfloop profile`)."""
    tried = {r.optimization for r in v.records if r.kind == Kind.PLAYBOOK}
    ranked = decide.rank(v.playbook.optimizations, v.kernel_class, v.knobs, v.spec.candidates,
                         tried, penalties(v), v.spec.tags, space=v.space)
    if v.profile is None or not ranked:
        return ranked
    return profile_rank.adjust(ranked, v.profile["metrics"], v.profile_rules, v.kernel_class,
                               v.spec.tags, source=f"the profile of {v.profile['commit'][:12]}")


def _dispatch(v: RunView, recs: list[Experiment]) -> list[decide.Suggestion]:
    found = v.rules.search.dispatch and search.dispatch_changes(
        recs, v.incumbent, v.knobs, v.rules.decision, v.spec.headline.name, same=v.space.same)
    if not found or v.space.why_not({**v.knobs, dispatch.KEY: found[0]}) is not None:
        return []
    table, said, why = found
    return [decide.Suggestion(search.optimization(search.DISPATCH, (table,)), (table,), 0,
                              f"won only on some buckets: {why}", describe=said)]


def _joint(v: RunView, recs: list[Experiment]) -> list[decide.Suggestion]:
    rules, knobs = v.rules.search, v.knobs
    if search.joint_tried_since_keep(recs):
        return []
    where = search.headline_bucket(recs, v.spec.headline.name)
    plan = search.joint_plan(
        recs, knobs, v.spec.headline.name, rules.joint_margin, rules.joint_max_configs,
        list(rules.interactions),
        worth=lambda p: v.space.worth(knobs, search.apply_joint(knobs, p, where), where),
        pair_share=rules.pair_share)
    if not plan.patches:
        return []
    values = tuple(plan.patches)
    moved = ", ".join(sorted({k for p in plan.patches for k in p}))
    return [decide.Suggestion(
        search.optimization(search.JOINT, values), values, 0,
        f"{len(values)} configs of {moved}, the values within {100 * rules.joint_margin:g}% of "
        f"the best in one-knob steps, measured together: {plan.said()}",
        sampler=plan.as_record())]


def _bucket_joints(v: RunView, recs: list[Experiment]) -> list[decide.Suggestion]:
    rules, knobs, out = v.rules.search, v.knobs, []
    for tables, plan in search.bucket_joint_plans(
            recs, knobs, v.spec.headline.name, rules.joint_margin, rules.joint_max_configs,
            list(rules.interactions),
            worth=lambda t, b: v.space.worth(knobs, {**knobs, dispatch.KEY: t}, b),
            pair_share=rules.pair_share):
        if not tables:
            continue
        values = tuple(tables)
        moved = ", ".join(sorted({k for p in plan.patches for k in p}))
        out.append(decide.Suggestion(
            search.optimization(search.BUCKET_JOINT, values), values, 0,
            f"{len(tables)} configs of {moved} at {plan.bucket} only, the values within "
            f"{100 * rules.joint_margin:g}% of the best at {plan.shape} in one-knob steps, "
            f"measured together: {plan.said()}",
            describe=f"at {plan.bucket}: {len(tables)} configs of {moved}",
            sampler=plan.as_record()))
    return out


def searches(v: RunView) -> list[decide.Suggestion]:
    """The dispatch and joint experiments the record supports now."""
    recs = list(v.records)
    return _dispatch(v, recs) + _joint(v, recs) + _bucket_joints(v, recs)


def suggestions(v: RunView, ranked: list[decide.Suggestion] | None = None,
                extra: list[decide.Suggestion] | None = None,
                stop_due: bool = False, floor_shares: dict | None = None
                ) -> list[decide.Suggestion]:
    """Everything worth trying now, best first; `ranked` and `extra`: catalog(v) and
    searches(v), when the caller has them; `stop_due`: a stop rule would end the run but for
    the searches on offer (perfloop.plan.planner)."""
    ranked = catalog(v) if ranked is None else ranked
    extra = searches(v) if extra is None else extra
    first = [sg for sg in extra if sg.optimization.id == search.DISPATCH]
    joint = [sg for sg in extra if sg.optimization.id in (search.JOINT, search.BUCKET_JOINT)]
    joint = search.by_headroom(joint, floor_shares, v.spec.headline.name)
    # the joint searches go first, too, when the budget has room for little more than them
    reserve = joint[:v.rules.search.budget_reserve]
    done = spent(v)
    limit = v.rules.stop.time_budget_s
    if not limit:
        return first + (joint + ranked if stop_due else ranked + joint)
    planned = {id(sg): estimate(v, sg, done) for sg in first + ranked + joint}
    short = budget.over(done, [planned[id(sg)] for sg in first + ranked[:1] + reserve], limit)
    ordered = first + (joint + ranked if stop_due or short else ranked + joint)
    # an experiment that would end past the budget goes behind those that fit: the run stops
    # only when none does. A stop rule that only the searches hold off lets no catalog step
    # in ahead of them.
    movable, behind = (first + joint, ranked) if stop_due else (ordered, [])
    late = {id(sg) for sg in movable if budget.over(done, [planned[id(sg)]], limit)}
    left = limit - sum(x.seconds for x in done)
    return ([sg for sg in movable if id(sg) not in late]
            + [_over(sg, planned[id(sg)], left) for sg in movable if id(sg) in late] + behind)


def _over(sg: decide.Suggestion, planned_s: float, left_s: float) -> decide.Suggestion:
    return dataclasses.replace(sg, reason=f"{sg.reason} (estimated at {planned_s:.0f} s, over "
                                          f"the {max(left_s, 0):.0f} s left of the time budget)")


def spent(v: RunView) -> list[budget.Spent]:
    return [budget.spent(r) for r in v.records]


def estimate(v: RunView, sg: decide.Suggestion, done: list[budget.Spent] | None = None) -> float:
    """Seconds the experiment `sg` is expected to take, by the run's record (perfloop.plan.budget);
    `done`: spent(v), when the caller has it."""
    rules = v.rules.search
    return budget.estimate_s(budget.kind_of(sg.optimization.id), len(sg.candidates),
                             spent(v) if done is None else done,
                             screen_above=rules.screen_above, screen_keep=rules.screen_keep,
                             screen_s_per_config=rules.screen_s_per_config)


def check_space(optimizations, knobs: dict, candidates: dict, space, tags: tuple = ()) -> None:
    """Read the kernel's knob space (canonical(), restrict()) over every catalog candidate from
    the committed knobs, so a function that fails is refused in one line before a run starts,
    not after its first experiment (only entries offered to a kernel with these tags)."""
    for opt in optimizations:
        if all(k in knobs for k in opt.moves) and opt.offered_to(tags):
            decide.candidates_for(opt, knobs, candidates, space)


# ---- what comes next ---------------------------------------------------------------------
def verdicts(v: RunView) -> list[decide.Verdict]:
    return [decide.Verdict(**r.decision) for r in v.records if r.kind != Kind.BASELINE]


def floor_shares(v: RunView) -> dict[str, float] | None:
    """The incumbent's share of the physical floor per benchmark shape, each from the latest
    experiment in the incumbent's line that timed it (None where a shape has no floor, e.g.
    on the CPU)."""
    timed = {sh.name: incumbent_timed(list(v.records), v.incumbent, sh.name)[1]
             for sh in v.spec.shapes}
    shares = {name: stats.share_of_floor if stats else None for name, stats in timed.items()}
    return shares if shares and None not in shares.values() else None


def per_bucket(v: RunView) -> dict:
    """The stop rules' per-bucket arguments (perfloop.plan.bucket_stops)."""
    return bucket_stops.stop_args(list(v.records), v.spec.headline.name,
                                  v.rules.decision, v.rules.stop.no_improvement_streak)


def _stop_rule(v: RunView, ranked: list, searches_: int, next_s: float,
               buckets: dict) -> Stop | None:
    """decide.stop_reason over the record; `buckets`: per_bucket(v)."""
    recs = v.records
    done = [r for r in recs if r.kind != Kind.BASELINE]
    verdicts_ = verdicts(v)
    return decide.stop_reason(
        recs[-1].iteration if recs else 0, verdicts_, v.rules.stop,
        len(ranked) if verdicts_ else 1, searched=[r.optimization in SEARCH_IDS for r in done],
        searches=searches_, floor_shares=floor_shares(v),
        spent_s=tuple(x.seconds for x in spent(v)), next_s=next_s, **buckets)


def plan(v: RunView) -> tuple[Stop | None, list]:
    """(the stop rule that fires now, or None; the suggestions on offer, best first)."""
    recs = v.records
    if recs and recs[0].kind == Kind.BASELINE and recs[0].status != Status.KEEP:
        return Stop(StopReason.BASELINE_FAILED, f"the baseline did not pass "
                                                f"({recs[0].reason}); fix the kernel first"), []
    ranked, extra = catalog(v), searches(v)
    verdicts_ = verdicts(v)
    searched = [r.optimization in SEARCH_IDS for r in recs if r.kind != Kind.BASELINE]
    buckets = per_bucket(v)
    due = bool(verdicts_) and decide.stop_reason(
        recs[-1].iteration, verdicts_, v.rules.stop, len(ranked), searched=searched,
        **buckets) is not None
    offered = suggestions(v, ranked, extra, stop_due=due, floor_shares=floor_shares(v))
    next_s = estimate(v, offered[0]) if v.rules.stop.time_budget_s and offered else 0.0
    stop = _stop_rule(v, ranked, len(extra), next_s, buckets)
    if stop and stop.reason is StopReason.TIME_BUDGET:
        # a rule that only the searches held off is what ends the run when the next does not
        # fit (no catalog step goes ahead of them then, though one may fit: py)
        held = _stop_rule(v, ranked, 0, 0.0, buckets)
        if held is not None:
            stop = Stop(held.reason, f"{held.detail} (and the next experiment on offer, "
                                     f"estimated at {next_s:.0f} s, would pass the time budget)")
    return with_untried(stop, ranked), offered


def with_untried(stop: Stop | None, ranked: list) -> Stop | None:
    """A time-budget stop names the catalog entries it leaves untried (`ranked`: those on
    offer), and how to go on: the budget cut them, not their merit."""
    if stop is None or stop.reason is not StopReason.TIME_BUDGET or not ranked:
        return stop
    ids = tuple(sg.optimization.id for sg in ranked)
    return Stop(stop.reason, f"{stop.detail}; never tried: {', '.join(ids)} (a larger budget "
                             "goes on: `perfloop run --resume --time-budget SECONDS`)", ids)


def next_step(v: RunView) -> Proposal | Stop:
    """The next experiment, or the reason the run stops now."""
    stop, offered = plan(v)
    return stop or first(offered)


def first(offered: list) -> Proposal | Stop:
    """The first suggestion as a proposal; nothing left to try when there is none."""
    if not offered:
        return decide.NOTHING_LEFT
    top = offered[0]
    return Proposal(Kind.PLAYBOOK, top.optimization, top.candidates, describe=top.describe,
                    sampler=top.sampler)
