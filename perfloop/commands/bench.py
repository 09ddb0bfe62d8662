import dataclasses
import time

from perfloop.contract import traffic, workload
from perfloop.core.atomic import write_json
from perfloop.core.errors import UserError
from perfloop.contract.kernel import MODULE, load_module
from perfloop.core.vocab import CONTROL, INCUMBENT
from perfloop.measure import phases
from perfloop.report import workload_view
from perfloop.store.session import Session, require_gpu

HELP = "the kernel against PyTorch eager and torch.compile on the same inputs, in one process"
DESCRIPTION = """\
Times the kernel as it is in its folder, PyTorch eager (the kernel's reference), torch.compile
of it (compiled for each shape with dynamic=False) and the kernel's other competitors (its
kernel.py's competitors(), e.g. a Triton kernel), on every benchmark shape, in
alternating rounds in one child process, with the same clock as the loop (CUDA events, L2
flushed by a read, a sleep kernel ahead of each call so host time stays out of device time,
medians with 95% intervals). The kernel's timed outputs are checked against the reference.
Host time per call is reported beside device time. The kernel is timed twice, so the table
also shows how well the same code repeats. Where kernel.toml declares a [workload], shapes
drawn from it (never the benchmark's) are timed too, and a workload view follows the table:
per shape the best peer's time over cuTile's, the geometric mean, and the shapes below 0.90.
Answers: is my cuTile kernel competitive, at the shapes it will be called with? Needs an
NVIDIA GPU; the result also goes to sandbox/<kernel>/bench.json."""

LABELS = {INCUMBENT: "cutile", CONTROL: "cutile-again", "torch-compile": "torch-compile",
          "torch-eager": "torch-eager"}


def add_arguments(p):
    p.add_argument("--held-out", type=int, metavar="N", default=None,
                   help="shapes drawn from kernel.toml's [workload] to time beside the "
                        "benchmark's (default: its held_out; 0: none)")
    p.add_argument("--seed", type=int, metavar="S", default=None,
                   help="the seed they are drawn with (default: a new one, recorded; give the "
                        "run's workload_seed from state.json to time the shapes the run saw)")


def execute(args):
    s = Session(args.kernel, args.playbook)
    with s.lock(git=False):  # (it writes bench.json beside the run's record)
        return _execute(s, getattr(args, "held_out", None), getattr(args, "seed", None))


def drawn(spec, count: int | None, seed: int | None) -> tuple[int | None, tuple]:
    """(the seed, the shapes drawn from a declared workload): none without one."""
    wl = spec.workload
    if wl is None or not wl.declared or count == 0:
        return None, ()
    if count is not None and not 0 < count <= workload.MAX_HELD_OUT:
        raise UserError(f"--held-out must be between 0 and {workload.MAX_HELD_OUT}, not {count}")
    wl = dataclasses.replace(wl, held_out=count if count is not None else wl.held_out)
    seed = workload.choose_seed(wl) if seed is None else seed
    return seed, workload.draw(wl, seed, tuple(spec.shapes) + tuple(spec.held_back))


def _execute(s: Session, count: int | None = None, seed: int | None = None) -> dict:
    module = load_module(s.spec.folder, f"bench_{s.spec.name}", f"{s.folder_rel}/{MODULE}")
    traffic.check(module, s.spec)
    if not s.spec.requires_gpu or getattr(module, "DEVICE", "cuda") != "cuda":
        raise UserError(f"kernel '{s.spec.name}' is not timed on a GPU (requires_gpu = false, or "
                        "its own DEVICE), so there is no PyTorch GPU version to bench against")
    require_gpu()
    knobs = s.spec.read_knobs()
    base = {"folder": s.spec.folder, "knobs": knobs}
    variants = [{**base, "label": INCUMBENT}, {**base, "label": CONTROL},
                {**base, "label": "torch-compile", "torch": "compile"},
                {**base, "label": "torch-eager", "torch": "eager"}]
    # the kernel's own competitors (its contract's competitors(): e.g. a Triton kernel)
    others = sorted(module.competitors()) if hasattr(module, "competitors") else []
    variants += [{**base, "label": name, "torch": f"competitor:{name}"} for name in others]
    labels = {**LABELS, **{name: name for name in others}}
    work = s.work / f"bench-{int(time.time())}-{phases.nonce()}"
    work.mkdir(parents=True, exist_ok=True)
    rules = s.playbook.rules
    seed, held = drawn(s.spec, count, seed)
    shapes = list(s.spec.shapes) + list(held)
    timing = phases.time_variants(
        variants, workload.timer_shapes(s.spec, shapes), rules, contract=s.spec.folder,
        tolerance=s.spec.tolerance, headline=s.spec.headline.name,
        ceilings_cache=s.ceilings_cache, work=work,
        confinement=s.confinement(s.spec.folder), cache=s.compile_cache,
        deadline=time.monotonic() + rules.iteration_timeout_s * max(1, len(shapes) / 3),
        cwd=s.root, env=phases.child_env(s.playbook_dir, s.playbook.rules.pass_env))
    failed = {} if timing.crashed else {**(timing.raw.get("failed") or {}), **timing.excluded}
    mine = {k: v for k, v in failed.items() if k in (INCUMBENT, CONTROL)}
    if timing.crashed or mine:
        why = timing.crashed or "; ".join(f"{labels.get(k, k)}: {v['reason']}"
                                         for k, v in mine.items())
        return {"error": why, "exit_code": 1}
    # a peer that could not be timed (e.g. eager's host time past what a batch can hide at
    # a one-row shape) is named, not a reason to lose the others
    untimed = {labels.get(k, k): v["reason"] for k, v in failed.items()}
    labels = {k: v for k, v in labels.items() if k not in failed}
    summary = phases.summarize_pass(timing.raw["passes"][0], ceiling=timing.raw.get("ceilings"))
    rows = table_rows(summary, labels)
    out = {"kernel": s.spec.name, "knobs": knobs, "rows": rows, "headline": s.spec.headline.name,
           "noise": {name: shape["noise"] for name, shape in summary.items()},
           "environment": timing.raw["environment"], "ceilings": timing.raw["ceilings"],
           "method": timing.raw["method"], "untimed": untimed}
    if held:
        out["workload"] = workload_view.view(
            summary, labels, {sh.name: workload.shape_bucket(s.spec.workload, sh) for sh in held},
            seed)
    write_json(s.sandbox / "bench.json", {**out, "shapes": summary})
    return out


def _num(value, fmt: str) -> str:
    return format(value, fmt) if value is not None else "-"


def table_rows(summary: dict, labels: dict) -> list[dict]:
    """One row per shape and variant. `vs_cutile` is the paired ratio (the median of the
    per-round ratios against cuTile), the statistic its interval belongs to; the ratio of the
    pooled medians could fall outside that interval (seen on an H100: 1.019, CI 1.001-1.015)."""
    rows = []
    for name, shape in summary.items():
        for label, shown in labels.items():
            if label not in shape["variants"]:
                continue
            v = shape["variants"][label]
            paired = shape["vs_incumbent"].get(label) if label != INCUMBENT else None
            rows.append({"shape": name, "variant": shown, "median_ms": v["median_ms"],
                         "ci_low_ms": v["ci_low_ms"], "ci_high_ms": v["ci_high_ms"],
                         "host_us_per_call": v["host_us_per_call"], "gbps": v.get("gbps"),
                         "tflops": v.get("tflops"),
                         "share_of_floor": v.get("share_of_floor"),
                         "vs_cutile": paired["ratio"] if paired else 1.0,
                         "ratio_ci": [paired["ci_low"], paired["ci_high"]] if paired
                         else [1.0, 1.0]})
    return rows


def render(r):
    if "error" in r:
        return f"bench failed: {r['error']}"
    env, ceil = r["environment"], r["ceilings"]
    rate = any(row.get("tflops") for row in r["rows"])   # tensor-core FLOPs: a compute kernel
    lines = [f"{r['kernel']} on {env.get('gpu_name')} (driver {env.get('driver')}, cuTile "
             f"{env.get('cutile')}, torch {env.get('torch')}); bandwidth ceiling "
             f"{ceil.get('bandwidth_gbps') or ceil['copy_gbps']:.0f} GB/s (copy "
             f"{ceil['copy_gbps']:.0f})", "",
             "| shape | variant | median ms | 95% CI ms | GB/s | " + ("TFLOP/s | " if rate else "")
             + "share of floor | time / cuTile, paired rounds (95% CI) |",
             "|:--|:--|--:|--:|--:|--:|--:|" + ("--:|" if rate else "")]
    for row in r["rows"]:
        shape = row["shape"] + (" (headline)" if row["shape"] == r["headline"] else "")
        lines.append(f"| {shape} | {row['variant']} | {row['median_ms']:.4f} | "
                     f"{row['ci_low_ms']:.4f}-{row['ci_high_ms']:.4f} | "
                     f"{_num(row['gbps'], '.0f')} | "
                     + (f"{_num(row.get('tflops'), '.1f')} | " if rate else "") +
                     f"{_num(row['share_of_floor'], '.3f')} | {row['vs_cutile']:.3f} "
                     f"({row['ratio_ci'][0]:.3f}-{row['ratio_ci'][1]:.3f}) |")
    for name, why in (r.get("untimed") or {}).items():
        lines.append(f"{name}: not timed ({why})")
    if r.get("workload"):
        lines += ["", *workload_view.render(r["workload"])]
    return "\n".join(lines)
