import json

from perfloop.contract.playbook import MULTI, thaw
from perfloop.report import views
from perfloop.run import planning
from perfloop.store.session import Session

HELP = "the playbook's ranked suggestions for this kernel, skipping what was tried"
DESCRIPTION = """\
Lists the optimizations that apply to this kernel's class (memory-bound, balanced or
compute-bound, from its arithmetic intensity), best first, with the reason for each rank and
the candidate values an iteration would measure. Optimizations already tried in this run are
skipped. A profile of the incumbent (`perfloop profile`) re-ranks them by the rules of
playbook/profile_rules.toml, and each reason then quotes the metric that moved it. Apply one
with `perfloop step --opt ID`."""


def add_arguments(p):
    pass


def _profile(s: Session) -> dict | None:
    """Which profile the ranking used, or why a recorded one was not used."""
    data = s.profile(of_incumbent=False)
    if data is None:
        return None
    used = data.get("commit") == s.state.incumbent
    return {"commit": data.get("commit"), "used": used,
            "metrics": {k: m.get("value") for k, m in data["metrics"].items()},
            "why": "profile of the incumbent" if used else
                   "the profile is of an older incumbent: run `perfloop profile` again"}


def _moves(sg) -> list[str]:
    """The knobs a suggestion changes (a joint search's: those its configs set)."""
    opt = sg.optimization
    if opt.knob == MULTI and not opt.knobs:
        return sorted({k for patch in sg.candidates for k in patch})
    return list(opt.moves)


def execute(args):
    s = Session(args.kernel, args.playbook)
    ranked = planning.offered(s)
    return {"kernel_class": s.state.kernel_class or None, **views.stop_fields(s.state.stop),
            "profile": _profile(s),
            "suggestions": [{"id": sg.optimization.id, "title": sg.optimization.title,
                             "family": sg.optimization.family, "knob": sg.optimization.knob,
                             "knobs": _moves(sg),
                             "candidates": thaw(sg.candidates), "rank": sg.rank,
                             "reason": sg.reason} for sg in ranked]}


def render(r):
    lines = [f"{r['kernel_class'] or 'unclassified'} kernel; suggestions, best first:"]
    if r["profile"]:
        lines.insert(0, f"profile {r['profile']['commit'][:12]}: {r['profile']['why']}")
    for sg in r["suggestions"]:
        lines.append(f"  {sg['id']:<14} rank {sg['rank']:<3} {'+'.join(sg['knobs'])} in "
                     f"{json.dumps(sg['candidates'])}")
        lines.append(f"  {'':<14} {sg['reason']}")
    if not r["suggestions"]:
        lines.append("  nothing left to try")
    if r["stopped"]:
        lines.append(f"(the run's stop rule has fired: {r['stopped']})")
    return "\n".join(lines)
