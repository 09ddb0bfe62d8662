import argparse
import math
import time

from perfloop.contract import dispatch, knobspace, traffic, variants
from perfloop.core import naming, progress
from perfloop.core.errors import UserError
from perfloop.contract.kernel import MODULE, find_folder, load_module
from perfloop.contract.manifest import load_spec
from perfloop.contract.playbook import load, resolve_dir, thaw
from perfloop.store import gitops

HELP = "compile every variant the playbook can produce, ahead of time, without a GPU"
ALL_CAP = 5000   # --all past this many combinations is refused: at a few seconds a compile,
                 # a kernel with a dozen knobs (about 10**6 of them) would compile for weeks
DESCRIPTION = """\
Compiles the kernel for each target architecture with cuTile's ahead-of-time path (tileiras;
no GPU needed) for a set of knob combinations in which every value of every knob, and every
pair of values of any two knobs, occurs at least once (--all: every combination, refused past
5000), plus the committed knobs of each bucket of knobs.json's "dispatch" table and each
finalist kernel.toml's [workload] declares. Combinations that kernel.py's
restrict(knobs) rules out are left out (and said). Each combination is compiled for the dtypes
of all benchmark shapes. --sample N compiles a seeded subset of that set instead (every
value of every knob at least once, plus N more of its combinations) and says how many of
its variants and value pairs that covers. Reports each failure with its knob values; exits
1 if any variant fails."""


def add_arguments(p):
    p.add_argument("--arch", default="sm_90,sm_100",
                   help="comma-separated targets (default: sm_90,sm_100)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--all", action="store_true",
                     help="every combination of knob values instead of a pairwise-covering set")
    how.add_argument("--sample", type=_count, metavar="N",
                     help="a quick check: of the pairwise-covering set, the combinations that "
                          "hold every knob value at least once, plus N more drawn at random")
    p.add_argument("--seed", type=int, default=0,
                   help="with --sample: which N are drawn (default: 0)")


def _shown(folder, root) -> str:
    """The folder as the user knows it: from the repository's root when inside it."""
    return str(folder.relative_to(root)) if folder.is_relative_to(root) else str(folder)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"takes a whole number of variants, not '{text}'")
    return int(text)


def execute(args):
    folder = find_folder(args.kernel, gitops.cwd_root())
    root = gitops.root(gitops.find_repo(folder))
    spec = load_spec(folder, root)
    playbook = load(resolve_dir(args.playbook, root))
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    if not archs or any(not a.startswith("sm_") for a in archs):
        raise UserError(f"--arch takes targets like sm_90,sm_100, not '{args.arch}'")
    module = load_module(folder, f"check_{spec.name}", _shown(folder, root) + "/" + MODULE)
    if hasattr(module, "traffic"):  # a compile-only folder may lack it; run and bench refuse
        traffic.check(module, spec)   # the benchmark's bytes and operations, read as a run will
    if not hasattr(module, "compile_ahead"):
        raise UserError(f"kernel '{spec.name}' has no compile_ahead(knobs, shapes, arch) in kernel.py")
    committed = spec.read_knobs()
    combos, ruled_out, coverage = _combinations(args, folder, spec, playbook, committed)
    # each bucket of the committed dispatch table launches its own variant: compile it too
    buckets = [dispatch.knobs_for(committed, b) for b in dispatch.table(committed)]
    # and so does each finalist [workload] declares, where a launch tunes among them
    declared = dispatch.declared_finalists(getattr(spec.workload, "finalists", ()))
    finalists = [dispatch.config(committed, name, declared) for name in declared]
    combos += buckets + finalists
    failures, t0 = [], time.monotonic()
    with progress.task("compile", total=len(archs) * len(combos)) as bar:
        for arch in archs:
            for knobs in combos:
                bar.update(f"{arch} " + " ".join(f"{k}={naming.show_value(thaw(v))}"
                                                 for k, v in knobs.items())[:70])
                try:
                    _compile(module, knobs, spec.shapes, arch)
                except Exception as exc:
                    message = str(exc).strip().splitlines()
                    failures.append({"arch": arch,
                                     "knobs": {k: thaw(v) for k, v in knobs.items()},
                                     "error": f"{type(exc).__name__}: "
                                              f"{message[0] if message else ''}"})
                bar.update(advance=1)
    out = {"kernel": spec.name, "archs": archs, "variants": len(combos),
           "dtypes": sorted({d for s in spec.shapes for d in (s.dtype, *s.dtypes.values())}),
           "compiled": len(combos) * len(archs) - len(failures),
           "failures": failures, "seconds": round(time.monotonic() - t0, 1),
           "coverage": coverage["what"], "sample": coverage.get("sample"),
           "dispatch_buckets": len(buckets), "finalists": len(finalists),
           "ruled_out": ruled_out}   # combinations (--all) or value pairs restrict() rules out
    if failures:
        out.update(exit_code=1, failure=f"{len(failures)} of {len(combos) * len(archs)} "
                                        "variants did not compile")
    return out


def _combinations(args, folder, spec, playbook, committed) -> tuple[list, int, dict]:
    """The knob combinations to compile, how many combinations (--all) or value pairs
    restrict() ruled out, and what they cover: {"what": ..., "sample": counts or None}."""
    plain = {k: v for k, v in committed.items() if k != dispatch.KEY}
    doms = variants.domains(playbook, plain, spec.candidates, spec.tags)
    space = knobspace.space_for(folder)
    if args.all and (count := math.prod(len(d) for d in doms.values())) > ALL_CAP:
        raise UserError(f"--all would compile {count} combinations of {len(doms)} knobs for each "
                        f"target, more than {ALL_CAP}: check without --all compiles a set "
                        "that holds every pair of values, --sample N a quicker one")
    combos, ruled_out = (variants.exhaustive if args.all else variants.pairwise)(
        doms, lambda knobs: space.why_not(knobs) is None)
    if args.all:
        return combos, ruled_out, {"what": "all combinations"}
    if args.sample is None:
        return combos, ruled_out, {"what": "every value pair"}
    picked = variants.sample(combos, args.sample, args.seed)
    counts = {"variants": len(picked), "of_variants": len(combos), "extra": args.sample,
              "seed": args.seed, "pairs": len(variants.pairs_covered(picked)),
              "of_pairs": len(variants.pairs_covered(combos))}
    return picked, ruled_out, {"what": "a sample", "sample": counts}


def _compile(module, knobs, shapes, arch) -> None:
    """compile_ahead, once more if the compiler itself was killed by a signal (tileiras
    crashed with return code -11 once in CI on a SwiGLU variant that compiles on every other
    try): a crash is not the variant's verdict, a second one is reported."""
    try:
        module.compile_ahead(knobs, shapes, arch)
    except Exception as exc:
        if not (type(exc).__name__ == "CompilerExecutionError"
                and str(exc).startswith("Return code -")):
            raise
        module.compile_ahead(knobs, shapes, arch)


def render(r):
    lines = [f"{r['kernel']}: {r['variants']} variants ({r['coverage']}) x {len(r['archs'])} "
             f"targets ({', '.join(r['archs'])}), dtypes {', '.join(r['dtypes'])}: "
             f"{r['compiled']} compiled, {len(r['failures'])} failed "
             f"in {r['seconds']} s"]
    extra = [f"{n} {what}" for n, what in ((r.get("dispatch_buckets"), "of the dispatch table's "
                                            "buckets"), (r.get("finalists"), "declared finalists"))
             if n]
    if extra:
        lines.append("the variants include " + " and ".join(extra))
    if r.get("sample"):
        c = r["sample"]
        lines.append(f"coverage: {c['variants']} of the {c['of_variants']} variants of the "
                     f"pairwise set (every knob value, plus {c['extra']} drawn with seed "
                     f"{c['seed']}), holding {c['pairs']} of its {c['of_pairs']} value pairs")
    if r["ruled_out"]:
        what = "combinations" if r["coverage"] == "all combinations" else "value pairs"
        lines.append(f"{r['ruled_out']} {what} left out: kernel.py's restrict() rules out "
                     "every combination tried that holds them")
    for f in r["failures"]:
        knobs = " ".join(f"{k}={v}" for k, v in f["knobs"].items())
        lines.append(f"FAIL {f['arch']} {knobs}: {f['error']}")
    return "\n".join(lines)
