from perfloop.playbook import thaw
from perfloop.session import Session
from perfloop.suggest import suggestions

HELP = "the playbook's ranked suggestions for this kernel, skipping what was tried"
DESCRIPTION = """\
Lists the optimizations that apply to this kernel's class (memory-bound, balanced or
compute-bound, from its arithmetic intensity), best first, with the reason for each rank and
the candidate values an iteration would measure. Optimizations already tried in this run are
skipped. Apply one with `perfloop step --opt ID`."""


def add_arguments(p):
    pass


def execute(args):
    s = Session(args.kernel, args.playbook)
    ranked = suggestions(s)
    return {"kernel_class": s.state.kernel_class or None, "stopped": s.state.stopped,
            "suggestions": [{"id": sg.optimization.id, "title": sg.optimization.title,
                             "family": sg.optimization.family, "knob": sg.optimization.knob,
                             "candidates": thaw(sg.candidates), "rank": sg.rank,
                             "reason": sg.reason} for sg in ranked]}


def render(r):
    lines = [f"{r['kernel_class'] or 'unclassified'} kernel; suggestions, best first:"]
    for sg in r["suggestions"]:
        lines.append(f"  {sg['id']:<14} rank {sg['rank']:<3} {sg['knob']} in {sg['candidates']}")
        lines.append(f"  {'':<14} {sg['reason']}")
    if not r["suggestions"]:
        lines.append("  nothing left to try")
    if r["stopped"]:
        lines.append(f"(the run's stop rule has fired: {r['stopped']})")
    return "\n".join(lines)
