import time

from perfloop import phases
from perfloop.atomic import write_json
from perfloop.session import Session, require_gpu

HELP = "the kernel against PyTorch eager and torch.compile on the same inputs, in one process"
DESCRIPTION = """\
Times the kernel as it is in its folder, PyTorch eager (the kernel's reference) and
torch.compile of it, on every benchmark shape, in alternating rounds in one child process,
with the same harness as the loop (CUDA events, L2 flushed, medians with 95% intervals). The
kernel is timed twice, so the table also shows how well the same code repeats. Answers: is my
cuTile kernel competitive? Needs an NVIDIA GPU; the result also goes to sandbox/<kernel>/bench.json."""

ORDER = ["cutile", "cutile-again", "torch-compile", "torch-eager"]  # cutile-again: A/A control


def add_arguments(p):
    pass


def execute(args):
    s = Session(args.kernel, args.playbook)
    if s.spec.requires_gpu:
        require_gpu()
    knobs = s.spec.read_knobs()
    base = {"folder": s.spec.folder, "knobs": knobs}
    variants = [{**base, "label": "cutile"}, {**base, "label": "cutile-again"},
                {**base, "label": "torch-compile", "torch": "compile"},
                {**base, "label": "torch-eager", "torch": "eager"}]
    s.work.mkdir(parents=True, exist_ok=True)
    tag = f"bench-{int(time.time())}"
    timing = phases.time_variants(variants, [sh.as_dict() for sh in s.spec.shapes],
                                  s.playbook.rules, ceilings_cache=s.ceilings_cache, work=s.work,
                                  tag=tag, timeout_s=s.playbook.rules.iteration_timeout_s,
                                  cwd=s.root)
    if timing.crashed:
        return {"error": timing.detail, "exit_code": 1}
    summary = phases.summarize_timing(timing.raw, ORDER, "cutile", control="cutile-again")
    rows = []
    for name, shape in summary.items():
        ours = shape["variants"]["cutile"]["median_ms"]
        for label in ORDER:
            v = shape["variants"][label]
            rows.append({"shape": name, "variant": label, "median_ms": v["median_ms"],
                         "ci_low_ms": v["ci_low_ms"], "ci_high_ms": v["ci_high_ms"],
                         "gbps": v.get("gbps"), "share_of_copy_bw": v.get("share_of_copy_bw"),
                         "vs_cutile": v["median_ms"] / ours,
                         "ratio_ci": [shape["vs_incumbent"][label]["ci_low"],
                                      shape["vs_incumbent"][label]["ci_high"]]
                         if label != "cutile" else [1.0, 1.0]})
    out = {"kernel": s.spec.name, "knobs": knobs, "rows": rows, "headline": s.spec.headline.name,
           "noise": {name: shape["noise"] for name, shape in summary.items()},
           "environment": timing.raw["environment"], "ceilings": timing.raw["ceilings"],
           "method": timing.raw["method"]}
    write_json(s.sandbox / "bench.json", {**out, "shapes": summary})
    return out


def render(r):
    if "error" in r:
        return f"bench failed: {r['error']}"
    env, ceil = r["environment"], r["ceilings"]
    lines = [f"{r['kernel']} on {env.get('gpu_name')} (driver {env.get('driver')}, cuTile "
             f"{env.get('cutile')}, torch {env.get('torch')}); copy ceiling "
             f"{ceil['copy_gbps']:.0f} GB/s", "",
             "| shape | variant | median ms | 95% CI ms | GB/s | share of copy ceiling | time / cuTile (95% CI) |",
             "|:--|:--|--:|--:|--:|--:|--:|"]
    for row in r["rows"]:
        shape = row["shape"] + (" (headline)" if row["shape"] == r["headline"] else "")
        lines.append(f"| {shape} | {row['variant']} | {row['median_ms']:.4f} | "
                     f"{row['ci_low_ms']:.4f}-{row['ci_high_ms']:.4f} | {row['gbps']:.0f} | "
                     f"{row['share_of_copy_bw']:.3f} | {row['vs_cutile']:.3f} "
                     f"({row['ratio_ci'][0]:.3f}-{row['ratio_ci'][1]:.3f}) |")
    return "\n".join(lines)
