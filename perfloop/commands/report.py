import json
import time
from contextlib import nullcontext
from pathlib import Path

from perfloop.core.atomic import write_bytes, write_text
from perfloop.core.errors import UserError
from perfloop.core.naming import show_patch, show_value
from perfloop.core.vocab import Correctness, Kind, Status
from perfloop.report import htmlpage, results, review, views
from perfloop.store import gitops, preflight
from perfloop.store.session import Session

HELP = "a reviewer's summary of the run: the kept changes, the speedup, each shape against its floor"
DESCRIPTION = """\
Reads the run's record (sandbox/<kernel>/experiments.jsonl) and summarizes it: each kept change
with the knobs it moved (old -> new; per bucket for a dispatch) and its gain, the final knobs
and commit, the speedup of the final incumbent over the baseline as timed in one process when
the run stopped (with its 95% interval; "not confirmed" before that), per shape the best time
and its share of the physical floor, the competitors timed by the last `perfloop bench`
(sandbox/<kernel>/bench.json), the time per phase, the stop reason and the environment; and
each --describe experiment with the change it judged (`git show <ref>`; in --json, --html and
--results its diff, cut when long). Without a current run, the latest archived one. Only
reads the record; --html, --png and --results write the files they name.
  --html PATH  one self-contained HTML file: this report, with plots (latency per iteration
               per shape, share of the floor per shape), images embedded, nothing fetched
  --png PATH   the latency plot alone
  --results PATH
               the current result as one short Markdown page (a kernel's RESULTS.md): the
               machine, the run's table as written, the one-process confirmation per shape,
               the last bench against peers and its workload rows; the kernel folder's own
               RESULTS.md may be written once the run has stopped"""

BENCH, PROFILE, RESULTS = "bench.json", "profile.json", "RESULTS.md"
KERNELS = "optional"   # --all in place of --kernel: every kernel's run in one summary


def add_arguments(p):
    p.add_argument("--all", action="store_true",
                   help="every kernel under kernels/ that has a run, one row each (a fleet's "
                        "summary): where it was measured, its experiments, wall time, speedup, "
                        "share of the floor and workload against its peers")
    p.add_argument("--html", metavar="PATH", help="write the report as one self-contained HTML file")
    p.add_argument("--png", metavar="PATH", help="write the latency-per-iteration plot as a PNG")
    p.add_argument("--results", metavar="PATH",
                   help="write the current result as Markdown (e.g. the kernel's RESULTS.md)")


def _frame(recs):
    import pandas as pd  # here, so that the other commands start fast

    return pd.DataFrame([{**views.experiment(r), "seconds": r.phases_s["total"],
                          **{f"{k}_s": v for k, v in r.phases_s.items() if k != "total"}}
                         for r in recs])


def _output(path: str | None, s: Session, results: bool = False) -> Path | None:
    """Where --html/--png/--results may write: a file in an existing folder, outside the kernel
    folder (whose uncommitted files would make the next step refuse); --results also the
    folder's own RESULTS.md once the run has stopped (no experiment follows to refuse)."""
    if path is None:
        return None
    out = Path(path).expanduser().resolve()
    if out.is_dir():
        raise UserError(f"{path} is a folder; name the file to write")
    if not out.parent.is_dir():
        raise UserError(f"cannot write {path}: the folder {out.parent} does not exist")
    if results and out == s.spec.folder / RESULTS:
        if s.state.stop is None:
            raise UserError(f"refused: the run has not stopped, and experiments commit the kernel "
                            f"folder {s.folder_rel}/; write {RESULTS} there once it stops, or "
                            "elsewhere now (e.g. sandbox/)")
        return out
    if out == s.spec.folder or s.spec.folder in out.parents:
        raise UserError(f"refused: {path} is inside the kernel folder {s.folder_rel}/, which "
                        "experiments commit; write the report elsewhere (e.g. sandbox/)")
    preflight.require_writable({out.parent: "the report"})
    return out


def _in_sandbox(s: Session, *outs: Path | None) -> bool:
    """A file written under sandbox/ is written beside a run's record: under its lock."""
    return any(out is not None and s.root / "sandbox" in out.parents for out in outs)


def _read_json(path: Path) -> tuple[dict | None, str | None]:
    if not path.exists():
        return None, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return None, f"{path} could not be read ({exc.__class__.__name__}); ignored"
    return (data, None) if isinstance(data, dict) else (None, f"{path} is not an object; ignored")


def _bench(s: Session, final_knobs: dict | None) -> tuple[dict | None, dict | None, str | None]:
    path = s.sandbox / BENCH
    bench, problem = _read_json(path)
    if bench is None:
        return None, None, problem
    same = final_knobs is not None and bench.get("knobs") == final_knobs
    return bench, {"path": str(path), "timed_at": path.stat().st_mtime,
                   "knobs": bench.get("knobs"), "same_knobs_as_final": same}, None


def execute(args):
    if getattr(args, "all", False):
        if args.kernel or args.png or args.results:
            raise UserError("--all summarizes every kernel: it takes neither --kernel nor "
                            "--png nor --results (report one kernel for those)")
        return _every(args)
    if not args.kernel:
        raise UserError("name the kernel to report: --kernel NAME (or --all for every one)")
    return _one(args)


def _every(args) -> dict:
    """One row per kernel with a run (current or archived), from its own report."""
    import argparse

    root = gitops.root(gitops.find_repo(Path.cwd()))
    rows = []
    for folder in sorted(p for p in (root / "kernels").glob("*") if (p / "kernel.toml").is_file()):
        one = _one(argparse.Namespace(kernel=str(folder), playbook=args.playbook, html=None,
                                      png=None, results=None))
        if one["experiments"]:
            rows.append(fleet_row(one))
    if not rows:
        raise UserError(f"no kernel under {root / 'kernels'} has a run to report")
    out = {"kernels": rows, "html": None}
    if args.html:
        path = Path(args.html).expanduser().resolve()
        if not path.parent.is_dir():
            raise UserError(f"cannot write {args.html}: the folder {path.parent} does not exist")
        write_text(path, htmlpage.page({"kernel": "every kernel", "branch": "", "archived": None},
                                       [], [("Every kernel's run", every_frame(out))]))
        out["html"] = str(path)
    return out


def fleet_row(r: dict) -> dict:
    """A kernel's line in the summary of every kernel, from its report."""
    env = r["environment"] or {}
    head: dict = next((sh for sh in r["shapes"] if sh["headline"]), {})
    workload = r.get("workload") or {}
    where = sorted({w.get("gpu") or "cpu" for w in r.get("fleet_where", [])})
    return {"kernel": r["kernel"], "branch": r["branch"], "archived": r["archived"],
            "gpu": env.get("gpu_name") or ("cpu" if env else None), "gpus": where,
            "experiments": r["experiments"], "wall_seconds": r["wall_seconds"],
            "speedup": r["speedup"]["speedup"], "confirmed": r["speedup"]["confirmed"],
            "share_of_floor": head.get("incumbent_share_of_floor"),
            "workload_geomean": workload.get("geomean_vs_best_peer"),
            "below_bar": workload.get("below_bar"),
            "stopped": r["stop_reason"]}


def every_frame(r: dict):
    import pandas as pd

    return pd.DataFrame([{
        "kernel": row["kernel"] + (" (archived)" if row["archived"] else ""),
        "measured on": row["gpu"] or "-", "experiments": row["experiments"],
        "wall s": f"{row['wall_seconds']:.0f}",
        "speedup": (f"{row['speedup']:.3f}x" + ("" if row["confirmed"] else " (not confirmed)"))
        if row["speedup"] else "-",
        "share of floor": _num(row["share_of_floor"], ".3f"),
        "workload vs best peer": _num(row["workload_geomean"], ".3f"),
        "stopped": (row["stopped"] or "running")[:60]} for row in r["kernels"]])


def _one(args):
    s = Session(args.kernel, args.playbook)
    s.read_run()
    html_out, png_out = _output(args.html, s), _output(args.png, s)
    results_out = _output(args.results, s, results=True)
    recs = s.records()
    if not recs:
        if html_out or png_out or results_out:
            raise UserError(f"no experiments of '{s.spec.name}' recorded yet: nothing to draw")
        return {"kernel": s.spec.name, "experiments": 0, "rows": [],
                "archived": views.archived(s)}
    df = _frame(recs)
    st = s.state
    head = s.spec.headline.name
    kept = [r for r in recs if r.status == Status.KEEP]
    final = review.incumbent_record(recs, st.incumbent) or (kept[-1] if kept else None)
    confirmation = s.confirmation()
    bench, bench_info, bench_problem = _bench(s, final.knobs if final else None)
    profile, profile_problem = _read_json(s.sandbox / PROFILE)
    shapes = review.shapes(recs, [sh.name for sh in s.spec.shapes], st.incumbent, confirmation,
                           bench, head)
    speedup = views.speedup(s, recs)
    confirmed = speedup["method"] in (review.ONE_PROCESS, review.NOTHING_KEPT)
    env = next((r.environment for r in reversed(recs) if r.environment), None)
    out = {
        "kernel": s.spec.name, "branch": st.branch, "archived": views.archived(s),
        "experiments": len(recs),
        "counts": df["status"].value_counts().to_dict(),   # by status, the baseline included
        "changes": review.change_counts(recs),              # after the baseline
        "baseline": {"status": recs[0].status, "latency_ms": recs[0].latency_ms,
                     "commit": recs[0].commit},
        "correctness_failures": int((df["correctness"] == Correctness.FAIL).sum()),
        "headline": head, "shapes": shapes,
        "speedup": {**{k: v for k, v in speedup.items() if k != "shapes"},
                    "confirmed": confirmed},
        "journey": review.journey(recs),
        "edits": review.agent_edits(recs, _diffs(s, recs)),
        "final": {"commit": st.incumbent, "iteration": final.iteration if final else None,
                  "knobs": final.knobs if final else None},
        "best_iteration": kept[-1].iteration if kept else None,
        "seconds_total": float(df["seconds"].sum()),
        "wall_seconds": recs[-1].finished_at - recs[0].started_at,
        "seconds_per_phase": review.phase_seconds(recs, confirmation, profile),
        **views.stop_fields(st.stop), "stop_reason": views.line(st.stop), "environment": env,
        "bench": bench_info,
        "profile": _profile_summary(profile, st.incumbent),
        "notes": [p for p in (bench_problem, profile_problem) if p],
        "rows": df.drop(columns=["ref"]).to_dict(orient="records"),
        "fleet_where": [w for rec in recs for w in (rec.extra.get("fleet") or {}).get("where", [])],
        "workload": (bench or {}).get("workload"),   # the last bench's view (report --all)
    }
    if html_out or png_out:
        with s.lock(git=False) if _in_sandbox(s, html_out, png_out) else nullcontext():
            _draw(out, recs, bench, html_out, png_out)
    if results_out:
        write_text(results_out, results.page(_facts(s, recs, confirmation, bench, bench_info,
                                                    out["edits"])))
    out["html"], out["png"] = (str(html_out) if html_out else None), (str(png_out) if png_out else None)
    out["results"] = str(results_out) if results_out else None
    return out


def _diffs(s: Session, recs) -> dict[int, str | None]:
    """Each --describe experiment's change: its commit against the incumbent it was compared
    with, in the kernel folder (None where git no longer has either)."""
    return {r.iteration: gitops.diff(s.repo, r.incumbent_before or "", r.commit,
                                     s.folder_rel)
            for r in recs if r.kind == Kind.AGENT}


def _facts(s: Session, recs, confirmation, bench, bench_info, edits) -> results.RunFacts:
    """What RESULTS.md is made of: the baseline's machine, the table as written, the
    confirmation, the last bench."""
    table = s.table_path.read_text(encoding="utf-8") if s.table_path.exists() else ""
    return results.RunFacts(
        kernel=s.spec.name, branch=s.state.branch, archived=views.archived(s),
        started_at=recs[0].started_at,
        stopped=views.line(s.state.stop), environment=recs[0].environment, table=table,
        shapes=[sh.name for sh in s.spec.shapes], headline=s.spec.headline.name,
        confirmation=(confirmation.shapes or None) if confirmation else None,
        confirmation_error=confirmation.error if confirmation else None,
        nothing_kept=bool(confirmation and confirmation.nothing_kept),
        bench=bench, bench_of_final=bool(bench_info and bench_info["same_knobs_as_final"]),
        edits=edits)


def _profile_summary(profile: dict | None, incumbent: str) -> dict | None:
    if not profile:
        return None
    return {"commit": profile.get("commit"), "of_incumbent": profile.get("commit") == incumbent,
            "shape": profile.get("shape"), "metrics": profile.get("metrics"),
            "kernel_name": profile.get("kernel_name")}


# ---- tables, shared by the text and the HTML ------------------------------------------------
def _pct(value) -> str:
    return f"{100 * value:+.2f}%" if value is not None else "-"


def _num(value, fmt: str = ".6f") -> str:
    return format(value, fmt) if value is not None else "-"


def journey_frame(r):
    import pandas as pd

    return pd.DataFrame([{"iteration": j["iteration"], "change": j["what"], "knobs": j["diff"],
                          "gain at headline": _pct(j["gain"]),
                          "latency_ms": _num(j["latency_ms"]), "commit": j["commit"][:12]}
                         for j in r["journey"]],
                        columns=["iteration", "change", "knobs", "gain at headline",
                                 "latency_ms", "commit"])


def shapes_frame(r):
    import pandas as pd

    rows = []
    for sh in r["shapes"]:
        row = {"shape": sh["shape"] + (" (headline)" if sh["headline"] else ""),
               "baseline_ms": _num(sh["baseline_ms"]),
               "best_ms": _num(sh["incumbent_ms"]),
               "best from iteration": sh["incumbent_iteration"],
               "floor_ms": _num(sh["floor_ms"]),
               "share of floor": (f"{_num(sh['baseline_share_of_floor'], '.3f')} -> "
                                  f"{_num(sh['incumbent_share_of_floor'], '.3f')}"
                                  if sh["floor_ms"] else "-"),
               **({"TFLOP/s": f"{_num(sh.get('baseline_tflops'), '.1f')} -> "
                              f"{_num(sh.get('incumbent_tflops'), '.1f')}"}
                  if sh.get("baseline_tflops") or sh.get("incumbent_tflops") else {}),
               "speedup (one process, 95% CI)": (
                   f"{sh['speedup']:.3f}x ({sh['speedup_ci'][0]:.3f}-{sh['speedup_ci'][1]:.3f})"
                   if sh["speedup"] is not None and sh["speedup_ci"] else
                   "1.000x (nothing kept)" if sh["speedup_method"] == review.NOTHING_KEPT
                   else "not confirmed")}
        for c in sh["competitors"]:
            row[f"{c['variant']} ms (bench)"] = _num(c["median_ms"])
            row[f"{c['variant']} / cutile (bench)"] = _num(c["vs_cutile"], ".3f")
        rows.append(row)
    return pd.DataFrame(rows)


def knobs_frame(r):
    import pandas as pd

    knobs = r["final"]["knobs"] or {}
    return pd.DataFrame([{"knob": k, "value": json.dumps(v) if isinstance(v, dict) else
                          show_value(v)} for k, v in knobs.items()], columns=["knob", "value"])


def phases_frame(r):
    import pandas as pd

    return pd.DataFrame([{"phase": k, "seconds": round(v, 1)}
                         for k, v in r["seconds_per_phase"].items()], columns=["phase", "seconds"])


def experiments_frame(r):
    import pandas as pd

    cols = ["iteration", "optimization", "knob", "value", "describe", "status", "correctness",
            "latency_ms", "gain", "reason", "seconds"]
    frame = pd.DataFrame(r["rows"])[cols]
    frame["value"] = frame["value"].map(lambda v: "-" if v is None else
                                        show_patch(v) if isinstance(v, dict) else show_value(v))
    frame["describe"] = frame["describe"].map(lambda d: d or "-")
    frame["gain"] = frame["gain"].map(lambda g: _pct(g) if g == g and g is not None else "-")
    return frame


# ---- text -----------------------------------------------------------------------------------
def edit_lines(r) -> list[str]:
    """The --describe experiments, each with the command that shows its change."""
    if not r["edits"]:
        return []
    return ["", "your edits (--describe), each against the incumbent it was compared with:"] + [
        f"  iteration {e['iteration']} {e['status']} ({_pct(e['gain'])}): {e['describe']}; "
        f"`{e['show']}`" for e in r["edits"]]



def summary_lines(r) -> list[str]:
    c = r["changes"]
    fails = c["correctness_failures"]
    lines = [views.archived_line(r["archived"])] if r.get("archived") else []
    lines += [f"{r['kernel']} on {r['branch']}: the baseline and {c['total']} changes "
             f"({c['kept']} kept, {c['reverted']} reverted, {c['crashed']} crashed; "
             f"{fails} correctness failure{'s' if fails != 1 else ''})"]
    sp = r["speedup"]
    if sp["method"] == review.NOTHING_KEPT:
        lines.append(f"speedup at the headline shape ({r['headline']}): 1.000x, nothing kept "
                     "(the final incumbent is the baseline; nothing to time against it)")
    elif sp["confirmed"]:
        ci = f" (95% CI {sp['ci'][0]:.3f}-{sp['ci'][1]:.3f})" if sp["ci"] else ""
        lines.append(f"speedup at the headline shape ({r['headline']}): {sp['speedup']:.3f}x{ci}, "
                     "the baseline and the final incumbent timed in one process")
    elif sp["speedup"] is not None:
        lines.append(f"speedup at the headline shape ({r['headline']}): not confirmed in one "
                     f"process (the kept changes' in-process gains multiply to "
                     f"{sp['speedup']:.3f}x; the run confirms it when it stops)")
    final = r["final"]
    lines.append(f"final: commit {final['commit'][:12]}"
                 + (f" (iteration {final['iteration']})" if final["iteration"] is not None else ""))
    lines.append(f"stopped: {r['stopped']}" if r["stopped"] else "no stop rule has fired")
    return lines


def profile_line(r) -> str | None:
    p = r["profile"]
    if not p or not p.get("metrics"):
        return None
    which = "the final incumbent" if p["of_incumbent"] else f"an older incumbent, {str(p['commit'])[:12]}"
    values = ", ".join(f"{k} {m['value']:g}{m['unit'] if m['unit'] == '%' else ''}"
                       for k, m in p["metrics"].items())
    return f"profile (Nsight Compute, {which}, kernel {p['kernel_name']}): {values}"


def bench_line(r) -> str | None:
    b = r["bench"]
    if not b:
        return None
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(b["timed_at"]))
    which = ("the final knobs" if b["same_knobs_as_final"] else
             "other knobs than the final ones (run `perfloop bench` again)")
    return f"competitors: from the last bench ({b['path']}, {when}), which timed {which}"


def render(r):
    import pandas as pd

    if "kernels" in r:   # --all
        with pd.option_context("display.width", 200, "display.max_colwidth", 80):
            text = every_frame(r).to_string(index=False)
        return text + (f"\nHTML written to {r['html']}" if r.get("html") else "")
    if not r["experiments"]:
        return "\n".join(([views.archived_line(r["archived"])] if r.get("archived") else [])
                         + [f"{r['kernel']}: no experiments recorded yet"])
    width = {"display.width": 200, "display.max_colwidth": 80}
    with pd.option_context(*[x for kv in width.items() for x in kv]):
        lines = summary_lines(r)
        journey = journey_frame(r)
        lines += ["", "kept changes (gain against the incumbent before it, in one process):",
                  journey.to_string(index=False) if len(journey) else "  none"]
        lines += edit_lines(r)
        lines += ["", "final knobs:", knobs_frame(r).to_string(index=False)]
        lines += ["", "per shape (baseline and best each from its own experiment, in different "
                      "processes; the speedup from one process):",
                  shapes_frame(r).to_string(index=False)]
    lines += [line for line in (bench_line(r), profile_line(r)) if line]
    lines += [""] + [f"note: {n}" for n in r["notes"]]
    lines.append(f"time: {r['seconds_total']:.0f} s in experiments, {r['wall_seconds']:.0f} s "
                 "wall; per phase " + ", ".join(f"{k} {v:.0f} s"
                                                 for k, v in r["seconds_per_phase"].items()))
    env = r["environment"] or {}
    if env.get("gpu_name"):
        lines.append(f"measured on {env['gpu_name']} (driver {env.get('driver')}, "
                     f"cuTile {env.get('cutile')}, torch {env.get('torch')})")
    elif env:
        lines.append("measured on " + ", ".join(f"{k} {v}" for k, v in env.items()))
    for what in ("html", "png", "results"):
        if r.get(what):
            lines.append(f"{what.upper()} written to {r[what]}")
    return "\n".join(lines)


# ---- files ----------------------------------------------------------------------------------
def _figures(r, recs, bench):
    from perfloop.report import plots

    panels = {sh["shape"]: review.latency_points(recs, sh["shape"]) for sh in r["shapes"]}
    floors = {sh["shape"]: sh["floor_ms"] for sh in r["shapes"]}
    compiled = {sh["shape"]: next((c["median_ms"] for c in sh["competitors"]
                                   if c["variant"] == "torch-compile"), None) for sh in r["shapes"]}
    return (plots.latency(panels, floors, compiled, r["headline"]), plots.floor_shares(r["shapes"]))


def _draw(r, recs, bench, html_out: Path | None, png_out: Path | None) -> None:
    from perfloop.report import plots

    latency_fig, share_fig = _figures(r, recs, bench)
    latency_png = plots.png(latency_fig)
    if png_out:
        write_bytes(png_out, latency_png)
    if html_out:
        notes = summary_lines(r)
        line = bench_line(r)
        notes += [line] if line else ["No bench result recorded: `perfloop bench` times the "
                                      "competitors."]
        if share_fig is None:
            notes.append("No physical floor was recorded (the kernel is timed by a CPU clock), "
                         "so there is no share of the floor to draw.")
        notes += [line for line in [profile_line(r)] if line] + r["notes"]
        sections = [("Kept changes", journey_frame(r))]
        if r["edits"]:
            sections.append(("Your edits (--describe): each change against the incumbent it "
                             "was compared with", r["edits"]))
        sections += [("Final knobs", knobs_frame(r)),
                     ("Per shape (the speedup from one process; the other times each from its "
                      "own experiment's process)", shapes_frame(r)),
                     ("Latency per iteration: the median at each shape; kept, reverted, failed "
                      "and crashed experiments and their other candidates marked apart; the "
                      "floor and torch.compile as lines", latency_png)]
        if share_fig is not None:
            sections.append(("Share of the physical floor per shape, baseline and final "
                             "(1.0 is the floor)", plots.png(share_fig)))
        workload_fig = plots.workload((bench or {}).get("workload"))
        if workload_fig is not None:
            sections.append(("The workload (last bench): the best peer's time over cuTile's per "
                             "shape, held-out shapes apart (above 1: cuTile faster)",
                             plots.png(workload_fig)))
        sections += [("Time per phase (seconds)", phases_frame(r)),
                     ("Environment", _env_frame(r)), ("Every experiment", experiments_frame(r))]
        write_text(html_out, htmlpage.page(r, notes, sections))


def _env_frame(r):
    import pandas as pd

    env = r["environment"] or {}
    return pd.DataFrame([{"field": k, "value": str(v)} for k, v in env.items()],
                        columns=["field", "value"])
