import sys

from perfloop.commands import options
from perfloop.commands.options import non_negative, positive
from perfloop.contract import settings
from perfloop.core import progress
from perfloop.core.errors import UserError
from perfloop.core.vocab import Status, StopReason
from perfloop.measure import profiling
from perfloop.report import views
from perfloop.run import ahead, loop
from perfloop.store.session import Session, require_gpu

HELP = "the whole loop, unattended: baseline, then one optimization per iteration until a stop rule"
KERNELS = "many"   # --kernel a --kernel b, --all: a fleet's
DESCRIPTION = """\
Runs the optimization loop on a kernel: a new branch, iteration 0 (baseline), then the
playbook's optimizations one per iteration, each judged by the kernel's correctness tests and
timed against the incumbent in the same process, committed, then kept or reverted. Stops after
2 iterations in a row without improvement, after a kept gain under 2% (with several buckets:
when each bucket has stopped by one of those two), after iteration 25, when
nothing is left to try, or on Ctrl-C (then --resume continues). When a stop rule fires, the
baseline and the final incumbent are timed against each other in one process: that ratio is
the run's speedup in `perfloop report`. A kernel whose run has finished is refused: --new
archives that run and starts another. --max-control-gap, --cliff-ratio and --time-budget
set those rules for a new run over kernel.toml's [rules] and the playbook's rules.toml, and
the run keeps them; with --resume only --time-budget, which replaces the run's budget from
then on (a run its budget stopped goes on). Needs an NVIDIA GPU, unless the kernel is timed
by a clock of its own (requires_gpu = false).

On a fleet (docs/fleet.md; pip install -e ".[fleet]"): --gpus N|all|0,2 starts a Dask worker
per GPU of this machine, --workers N that many without GPUs (kernels timed on the CPU),
--scheduler tcp://HOST:8786 uses a cluster whose workers were started on each node. Several
kernels (--kernel a --kernel b, or --all) then run at once, each in a worktree of its own under
sandbox/worktrees/, and each step's candidates are judged and timed on several GPUs at once,
every one against the incumbent timed on its own GPU."""


def add_arguments(p):
    p.add_argument("--resume", action="store_true",
                   help="continue this kernel's run (after a kill, a crash or Ctrl-C)")
    p.add_argument("--new", action="store_true",
                   help="archive this kernel's run, finished or not, under sandbox/_archive/ "
                        "(status and report still read it) and start a new one")
    p.add_argument("--max-iterations", type=non_negative, metavar="N",
                   help="stop after N more iterations (the playbook's limits still apply)")
    options.add_settings(p)
    p.add_argument("--profile", action="store_true",
                   help="profile the incumbent with Nsight Compute after each kept change "
                        "(`perfloop profile`), so the next suggestions rank by it")
    p.add_argument("--all", action="store_true", help="every kernel under kernels/, on a fleet")
    p.add_argument("--from", dest="start", choices=["plain"],
                   help="plain: on a fleet, start each kernel from its kernel.toml [plain] "
                        "knobs (where it started, before any tuning), and write its "
                        "RESULTS.md from the record once its run stops")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpus", metavar="N|all|LIST",
                       help="a fleet of one Dask worker per GPU of this machine: the first N, "
                            "all, or those listed (0,2)")
    where.add_argument("--workers", type=positive, metavar="N",
                       help="a fleet of N Dask workers without GPUs (kernels timed on the CPU)")
    where.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                       help="a fleet on a running Dask scheduler, its workers each started "
                            "with one GPU (`dask worker ADDRESS --nworkers N --resources "
                            "GPU=1`)")




def execute(args):
    kernels, fleet = list(args.kernel or []), args.gpus or args.workers or args.scheduler
    if args.all and kernels:
        raise UserError("--all runs every kernel: name none with --kernel")
    if not (kernels or args.all):
        raise UserError("name the kernel to run: --kernel NAME (several, or --all, on a fleet)")
    if args.all or len(kernels) > 1 or fleet:
        if not fleet:
            raise UserError("several kernels run at once on a fleet: add --gpus all (or "
                            "--workers N for kernels timed on the CPU, --scheduler ADDRESS "
                            "for a cluster)")
        if args.profile:
            raise UserError("--profile profiles on this machine, not on a fleet's: run "
                            "`perfloop profile --kernel NAME` after the fleet")
        if args.start and args.resume:
            raise UserError("--from plain starts runs; --resume continues them")
        from perfloop.fleet import command

        return command.execute(args, kernels, options.overrides(args), _lane)
    if args.start:
        raise UserError("--from plain runs on a fleet (--gpus, --workers or --scheduler): "
                        "each kernel starts in a worktree of its own, on a commit of its plain "
                        "knobs, and your branch stays as it is")
    args.kernel = kernels[0]
    return _single(args)


def _single(args):
    flags = options.overrides(args)
    pinned = [x.flag for x in settings.SETTINGS if x.pinned_at_start and x.key in flags]
    if args.resume and pinned:
        raise UserError(f"{pinned[0]} is pinned when a run starts (it decides what the "
                        "experiments measure); start a new run with `perfloop run --new "
                        f"{pinned[0]} ...`")
    s = Session(args.kernel, args.playbook, flags)
    if s.spec.requires_gpu:
        require_gpu()
    s.ahead = True  # experiments follow one another: each starts the next one's children
    with s.lock(), loop.interruptible(s):
        try:
            return _execute(s, args)
        finally:
            ahead.discard(s)


def _lane(s, args, say: str | None):
    """One kernel of a fleet (perfloop.fleet.command), as `perfloop run` runs it here; from
    plain knobs, its RESULTS.md written from the record once the run stops."""
    with s.lock(), loop.interruptible(s):
        answer = _execute(s, args, say)
    if args.start == "plain" and s.state.stop is not None and answer.get("status"):
        answer["results"] = _results(s, args)
    return answer


def _results(s, args) -> str:
    """The kernel's RESULTS.md in the main tree (`perfloop report --results`)."""
    import argparse
    from pathlib import Path

    from perfloop.commands import report

    main = Path(s.repo.common_dir).resolve().parent
    path = main / s.folder_rel / report.RESULTS
    report.execute(argparse.Namespace(kernel=str(s.spec.folder), playbook=args.playbook,
                                      html=None, png=None, results=str(path)))
    return str(path)


def _execute(s, args, say: str | None = ""):
    """The run of one kernel; each experiment's line printed as it comes, after `say` (a
    fleet's lane: its kernel's name), or not at all (None)."""
    lines: list = []
    profiles: list = []

    def report(record):
        e = views.experiment(record)
        lines.append(e)
        if not args.json and say is not None:
            with progress.paused():
                print(say + views.experiment_line(e), flush=True)
        if args.profile and record.status == Status.KEEP and not any(
                p.get("gave_up") for p in profiles):
            profiles.append(_profile(s, record.iteration, quiet=args.json))

    if args.resume:
        if args.new:
            raise UserError("--resume and --new exclude each other")
        s.require_run()
        if (s.state.stop is None or loop.lifts_stop(s)) and args.max_iterations != 0:
            loop.require_no_edits_before_steps(s)
        redone = loop.resume(s)
        retuned = loop.retune(s)
    else:
        retuned = {}
        redone, undone = loop.start(s, new=args.new)
        if undone:
            report(redone)
            return {"experiments_this_call": lines, "stop_reason": undone,
                    "stopped_by": StopReason.BASELINE_FAILED, "status": None,
                    "retuned": {}, "exit_code": 1, "failure": undone}
    if redone:
        report(redone)
    stop = loop.run(s, report, args.max_iterations, recorded_before=redone is not None)
    st = views.status(s)
    out = {"experiments_this_call": lines, "stop_reason": stop.detail, "stopped_by": stop.reason,
           "never_tried": list(stop.never_tried), "status": st, "retuned": retuned}
    if args.profile:
        out["profiles"] = profiles
    if st["iterations"] and st["experiments"][0]["status"] != Status.KEEP:
        out.update(exit_code=1, failure=f"the baseline did not pass: "
                                        f"{st['experiments'][0]['reason']}")
    return out


def _profile(s, iteration: int, quiet: bool) -> dict:
    """Profile the new incumbent; a machine that cannot (no ncu, no counters) is told once."""
    try:
        with progress.task("profile", f"the incumbent of iteration {iteration}, with ncu"):
            record = profiling.profile(s)
    except (UserError, profiling.Failed) as exc:
        if not quiet:
            with progress.paused():
                print(f"profile after iteration {iteration}: {exc}; not profiling again",
                      file=sys.stderr, flush=True)
        return {"iteration": iteration, "error": str(exc), "gave_up": True}
    if not quiet:
        with progress.paused():
            print(f"profiled the incumbent of iteration {iteration} in "
                  f"{record['wall_s']:.0f} s", flush=True)
    return {"iteration": iteration, "wall_s": record["wall_s"], "metrics": record["metrics"]}


def render(r):
    if "kernels" in r:   # a fleet's
        from perfloop.fleet import command

        return command.render(r, render)
    st = r["status"]
    if st is None:
        return r["stop_reason"]
    inc = st["incumbent"]
    lines = views.retuned_lines(r.get("retuned")) + [f"stopped: {r['stop_reason']}"]
    if inc["latency_ms"] and st["baseline_latency_ms"]:
        lines.append(f"baseline {st['baseline_latency_ms']:.6f} ms -> incumbent "
                     f"{inc['latency_ms']:.6f} ms ({st['speedup_vs_baseline']:.3f}x) at "
                     f"{inc['commit'][:12]} on {st['branch']}")
    lines.append(f"table: {st['table']}")
    return "\n".join(lines)
