from perfloop.commands import options
from perfloop.report import views
from perfloop.run import ahead, loop
from perfloop.store.session import Session, require_gpu

HELP = "start a run: create its branch and measure the baseline (iteration 0)"
DESCRIPTION = """\
Creates the branch cutile-perf-<kernel>-<yyyymmdd> (suffixed if taken) from the current
commit, then runs iteration 0: the kernel's correctness tests and a timing of the unchanged
kernel against itself, which also measures the noise. The kernel folder and its judge must be
committed; the judge, the shapes and the tolerances are pinned for the whole run. Refuses
uncommitted changes to tracked files, and a kernel that has a run already, finished or not
(--new archives it). A baseline that does not pass is undone (back on your branch, the
attempt archived under sandbox/_archive/). Then use `perfloop next` and
`perfloop step`, or `perfloop run --resume` for the rest.
--max-control-gap, --cliff-ratio and --time-budget set those rules for this run over
kernel.toml's [rules] and the playbook's rules.toml; the run keeps them (state.json)."""


def add_arguments(p):
    options.add_settings(p)
    p.add_argument("--new", action="store_true",
                   help="archive this kernel's run, finished or not, under sandbox/_archive/ "
                        "(status and report still read it) and start over")


def execute(args):
    s = Session(args.kernel, args.playbook, options.overrides(args))
    if s.spec.requires_gpu:
        require_gpu()
    with s.lock(), loop.interruptible(s):
        try:
            record, undone = loop.start(s, new=args.new)
        finally:
            ahead.discard(s)
    if undone:
        return {"experiment": views.experiment(record), "undone": undone,
                "status": None, "exit_code": 1, "failure": undone}
    return {"experiment": views.experiment(record), "undone": None, "status": views.status(s)}


def render(r):
    if r["undone"]:
        return "\n".join([views.experiment_line(r["experiment"]), r["undone"]])
    st = r["status"]
    lines = [f"run of {st['kernel']} on branch {st['branch']} "
             f"({st['kernel_class'] or 'unclassified'})",
             views.experiment_line(r["experiment"])]
    if st["stopped"]:
        lines.append(f"stopped: {st['stopped']}")
    lines.append(f"table: {st['table']}")
    return "\n".join(lines)
