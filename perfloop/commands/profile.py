from perfloop.commands.options import non_negative
from perfloop.core import progress
from perfloop.measure import profiling
from perfloop.store.session import Session

HELP = "Nsight Compute metrics of the incumbent at the headline shape; `next` ranks by them"
DESCRIPTION = """\
Runs Nsight Compute (`ncu --csv --metrics ...`, which must be on PATH) around one warm launch
of the incumbent at the headline shape (its knobs.json, the benchmark's inputs) and records,
in sandbox/<kernel>/profile.json, the ncu version, the command and the raw values: DRAM and SM
throughput as shares of peak, achieved occupancy, registers per thread, local-memory loads
and stores (spills), the L2 hit rate and the tensor pipe's share (the names per GPU are in
playbook/profile_rules.toml; a metric ncu does not know is dropped and the rest measured).
`perfloop next` then re-ranks its suggestions by the rules in that file, quoting the metric
that moved each one, as long as the profile is of the current incumbent. Exits 3 without
ncu, without a GPU, or when ncu may not read the GPU's counters (ERR_NVGPUCTRPERM); 1 when
ncu profiled no kernel."""


def add_arguments(p):
    p.add_argument("--kernel-name", metavar="REGEX",
                   help="profile only kernels whose name matches (default: every kernel of "
                        "the launch; the longest one's metrics rank `next`)")
    p.add_argument("--launch-skip", type=non_negative, default=0, metavar="N",
                   help="kernels of the profiled launch to skip first (default 0)")
    p.add_argument("--launch-count", type=non_negative, default=8, metavar="N",
                   help="the most kernels of that launch to profile (default 8)")


def execute(args):
    s = Session(args.kernel, args.playbook)
    with s.lock(git=False):  # (it writes profile.json beside the run's record)
        return _execute(s, args)


def _execute(s: Session, args) -> dict:
    s.require_run()
    try:
        with progress.task("profile", f"the incumbent at {s.spec.headline.name}, with ncu"):
            record = profiling.profile(s, kernel_name=args.kernel_name,
                                       launch_skip=args.launch_skip,
                                       launch_count=max(args.launch_count, 1))
    except profiling.Failed as exc:
        return {"kernel": s.spec.name, "exit_code": 1, "failure": str(exc)}
    return {"kernel": s.spec.name, "commit": record["commit"], "iteration": record["iteration"],
            "shape": record["shape"]["name"], "kernel_name": record["kernel_name"],
            "metrics": record["metrics"], "unavailable": record["unavailable"],
            "ncu_version": record["ncu"]["version"], "record": str(s.sandbox / profiling.PROFILE),
            "wall_s": record["wall_s"]}


def render(r):
    if r.get("error"):
        return f"profile failed: {r['error']}"
    lines = [f"{r['kernel']}: incumbent {r['commit'][:12]} at {r['shape']}, kernel "
             f"{r['kernel_name']} (ncu {r['ncu_version']}, {r['wall_s']:.0f} s)"]
    for key, m in r["metrics"].items():
        lines.append(f"  {key:<14} {m['value']:>14g} {m['unit']:<12} {m['metric']}")
    if r["unavailable"]:
        lines.append(f"  not available here: {', '.join(r['unavailable'])}")
    lines.append(f"recorded in {r['record']}; `perfloop next` ranks by it")
    return "\n".join(lines)
