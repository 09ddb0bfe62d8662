from perfloop.report import views
from perfloop.store.session import Session

HELP = "where the run stands: incumbent, experiments so far, whether a stop rule fired"
DESCRIPTION = """\
Shows the run's branch, the kernel's class, the incumbent (commit, latency, knobs), every
experiment so far, whether a stop rule has fired, and any interrupted iteration. Without a
current run, the latest run set aside under sandbox/_archive/<kernel>/ (by --new, or a
baseline that did not pass), and says so."""


def add_arguments(p):
    pass


def execute(args):
    s = Session(args.kernel, args.playbook)
    s.read_run()
    return views.status(s)


def render(st):
    inc = st["incumbent"]
    lines = [f"{st['kernel']} on {st['branch']}, {st['kernel_class'] or 'unclassified'}"]
    if st.get("archived"):
        lines.insert(0, views.archived_line(st["archived"]))
    if st.get("class_basis"):
        lines.append(f"  class from {st['class_basis']}")
    own = views.settings_line(st["settings"])
    if own:
        lines.append(f"  {own}")
    for e in st["experiments"]:
        lines.append(views.experiment_line(e))
    if inc["latency_ms"]:
        lines.append(f"incumbent {inc['commit'][:12]} (iteration {inc['iteration']}): "
                     f"{inc['latency_ms']:.6f} ms"
                     + (f", {st['speedup_vs_baseline']:.3f}x the baseline"
                        if st["speedup_vs_baseline"] else ""))
    if st.get("impossible"):
        lines.append(f"impossible: iteration {', '.join(map(str, st['impossible']))} recorded "
                     "a time of 0 ms, which no clock gives (perfloop now refuses such a time); "
                     "the speedup leaves it out")
    if st["in_flight"]:
        lines.append(f"interrupted: iteration {st['in_flight']['iteration']} "
                     f"({st['in_flight']['optimization']}); `perfloop run --resume` finishes it")
    lines.append(f"stopped: {st['stopped']}" if st["stopped"] else "running: no stop rule has fired")
    return "\n".join(lines)
