from perfloop import views
from perfloop.session import Session

HELP = "a reviewer's summary of the run: best against baseline, kept vs reverted, time spent"
DESCRIPTION = """\
Reads the run's full record (sandbox/<kernel>/experiments.jsonl) and summarizes it: the
speedup of the final incumbent over the baseline as measured in one process when the run
stopped (with its 95% interval), the latencies per shape, how many experiments were kept,
reverted or crashed, the time spent per phase, and the environment of the measurements."""


def add_arguments(p):
    pass


def _frame(recs):
    import pandas as pd  # here, so that the other commands start fast

    return pd.DataFrame([{**views.experiment(r), "seconds": r["phases_s"]["total"],
                          **{f"{k}_s": v for k, v in r["phases_s"].items() if k != "total"}}
                         for r in recs])


def _shape_latencies(record):
    timing = record.get("timing") or {}
    label = timing.get("chosen", "incumbent")
    return {name: shape["variants"][label]["median_ms"]
            for name, shape in (timing.get("shapes") or {}).items()}


def execute(args):
    s = Session(args.kernel, args.playbook)
    s.require_run()
    recs = s.records()
    if not recs:
        return {"kernel": s.spec.name, "experiments": 0, "rows": []}
    df = _frame(recs)
    kept = [r for r in recs if r["status"] == "keep"]
    base, best = _shape_latencies(recs[0]), _shape_latencies(kept[-1]) if kept else {}
    speedup = views.speedup(s, recs)
    confirmed = speedup["shapes"] or {}
    shapes = [{"shape": n, "baseline_ms": base[n], "incumbent_ms": best.get(n),
               "speedup": confirmed[n]["speedup"] if n in confirmed else None,
               "speedup_ci": confirmed[n].get("speedup_ci") if n in confirmed else None}
              for n in base]
    env = next((r["environment"] for r in reversed(recs) if r.get("environment")), None)
    phase_cols = [c for c in df.columns if c.endswith("_s")]
    return {
        "kernel": s.spec.name, "branch": s.state.branch, "experiments": len(recs),
        "counts": df["status"].value_counts().to_dict(),
        "correctness_failures": int((df["correctness"] == "FAIL").sum()),
        "headline": s.spec.headline.name, "shapes": shapes,
        "speedup": {k: v for k, v in speedup.items() if k != "shapes"},
        "best_iteration": kept[-1]["iteration"] if kept else None,
        "seconds_total": float(df["seconds"].sum()),
        "wall_seconds": recs[-1]["finished_at"] - recs[0]["started_at"],
        "seconds_per_phase": {c[:-2]: float(df[c].sum()) for c in phase_cols},
        "stopped": s.state.stopped, "environment": env,
        "rows": df.drop(columns=["ref"]).to_dict(orient="records"),
    }


def _ms(value) -> str:
    return f"{value:.6f}" if value is not None else "-"


def render(r):
    if not r["experiments"]:
        return f"{r['kernel']}: no experiments recorded yet"
    lines = [f"{r['kernel']} on {r['branch']}: {r['experiments']} experiments "
             f"({', '.join(f'{v} {k}' for k, v in r['counts'].items())}), "
             f"{r['correctness_failures']} correctness failures"]
    sp = r["speedup"]
    if sp["speedup"] is not None:
        ci = (f" (95% CI {sp['ci'][0]:.3f}-{sp['ci'][1]:.3f})" if sp["ci"] else "")
        lines.append(f"speedup at the headline shape: {sp['speedup']:.3f}x{ci}, {sp['method']}")
    for sh in r["shapes"]:
        mark = " (headline)" if sh["shape"] == r["headline"] else ""
        inc = f"{sh['incumbent_ms']:.6f}" if sh["incumbent_ms"] else "-"
        speed = (f"{sh['speedup']:.3f}x in one process" if sh["speedup"] else
                 "not confirmed in one process")
        lines.append(f"  {sh['shape']:<24} baseline {_ms(sh['baseline_ms'])} ms  best {inc} ms"
                     f"  {speed}{mark}")
    lines.append(f"time: {r['seconds_total']:.0f} s in experiments, {r['wall_seconds']:.0f} s "
                 "wall; per phase " + ", ".join(f"{k} {v:.0f} s"
                                                 for k, v in r["seconds_per_phase"].items()))
    env = r["environment"] or {}
    if env.get("gpu_name"):
        lines.append(f"measured on {env['gpu_name']} (driver {env.get('driver')}, "
                     f"cuTile {env.get('cutile')}, torch {env.get('torch')})")
    lines.append(f"stopped: {r['stopped']}" if r["stopped"] else "no stop rule has fired")
    return "\n".join(lines)
