"""What a reviewer reads about a run, as pure functions over the typed record: the
journey of kept changes with their knob diffs, per-shape times against the physical floor and
the last bench's competitors, and the latency of every experiment for the plots.

Times from different experiments come from different processes; only a confirmation (the
baseline and the final incumbent timed in one process) gives a speedup. Every figure here says
which kind it is.
"""

from __future__ import annotations

from perfloop.core import dispatch_table as dispatch
from perfloop.core import naming
from perfloop.core.naming import (
    show_value,
)
from perfloop.contract.playbook import freeze
from perfloop.core.vocab import Correctness, Kind, Status
from perfloop.store.records import (
    Confirmation,
    Experiment,
    incumbent_timed,
    shape_stats,
    shape_timed,
)

DIFF_LINES, DIFF_CHARS = 120, 8000   # an edit's diff in a report; git show holds the rest
ONE_PROCESS = "one-process confirmation"
NOTHING_KEPT = "nothing kept: the final incumbent is the baseline, so nothing was timed"
# bench's label of the kernel itself, and of its second timing (the A/A control)
BENCH_SELF, BENCH_AGAIN = "cutile", "cutile-again"


def knob_changes(before: dict, after: dict) -> list[dict]:
    """[{knob, bucket, old, new}] from one knob set to the next: plain knobs (bucket None), and
    for knobs.json's dispatch table each bucket's knobs against what ran there before (the
    bucket's old entry over the plain knobs)."""
    out = []
    plain = sorted({k for k in (*before, *after) if k != dispatch.KEY})
    for knob in plain:
        old, new = freeze(before.get(knob)), freeze(after.get(knob))
        if old != new:
            out.append({"knob": knob, "bucket": None, "old": old, "new": new})
    old_table, new_table = dispatch.table(before), dispatch.table(after)
    for bucket in dispatch.changed_buckets(old_table, new_table):
        was, now = ({k: freeze(v) for k, v in dispatch.knobs_for(knobs, bucket).items()}
                    for knobs in (before, after))
        for knob in sorted({*old_table.get(bucket, {}), *new_table.get(bucket, {})}):
            if was.get(knob) != now.get(knob):
                out.append({"knob": knob, "bucket": bucket, "old": was.get(knob),
                            "new": now.get(knob)})
    return out


def show_change(change: dict) -> str:
    where = f"[{change['bucket']}] " if change["bucket"] is not None else ""
    return (f"{where}{change['knob']}: {show_value(change['old'])} -> "
            f"{show_value(change['new'])}")






def journey(recs: list[Experiment]) -> list[dict]:
    """Each kept change after the baseline, in order, with the knobs it moved (from the
    incumbent before it) and its gain at the headline against that incumbent, in one process."""
    out, knobs = [], recs[0].knobs if recs else {}
    for record in recs[1:]:
        if record.status != Status.KEEP:
            continue
        changes = knob_changes(knobs, record.knobs)
        out.append({"iteration": record.iteration, "kind": record.kind,
                    "optimization": record.optimization,
                    "what": ("agent edit: " if record.kind == Kind.AGENT else "") + what(record),
                    "changes": [{**c, "old": _json(c["old"]), "new": _json(c["new"])}
                                for c in changes],
                    "diff": "; ".join(map(show_change, changes)) or
                            ("code edit (knobs unchanged)" if record.kind == Kind.AGENT
                             else "no knob changed"),
                    "gain": record.gain, "latency_ms": record.latency_ms,
                    "commit": record.commit, "reason": record.reason})
        knobs = record.knobs
    return out


def clip(text: str, lines: int = DIFF_LINES, chars: int = DIFF_CHARS) -> tuple[str, int]:
    """`text` cut to at most `lines` whole lines and `chars` characters, and how many of its
    lines were left out."""
    all_lines = text.splitlines()
    kept, size = [], 0
    for line in all_lines[:lines]:
        if size + len(line) + 1 > chars:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(kept) + ("\n" if kept else ""), len(all_lines) - len(kept)


def agent_edits(recs: list[Experiment], diffs: dict[int, str | None],
                lines: int = DIFF_LINES, chars: int = DIFF_CHARS) -> list[dict]:
    """Each --describe experiment, kept or not, with the change it judged: `diffs` holds each
    one's diff against the incumbent it was compared with (None: git no longer has it), cut
    to `lines` and `chars`; the whole change is `show`."""
    out = []
    for record in recs:
        if record.kind != Kind.AGENT:
            continue
        text = diffs.get(record.iteration)
        shown, left = clip(text, lines, chars) if text is not None else (None, 0)
        out.append({"iteration": record.iteration, "describe": record.describe,
                    "status": record.status, "gain": record.gain, "reason": record.reason,
                    "commit": record.commit,
                    "incumbent_before": record.incumbent_before,
                    "ref": record.ref, "show": f"git show {record.ref}", "diff": shown,
                    "diff_lines_left_out": left,
                    "note": edit_note(record.ref, text, left)})
    return out


def edit_note(ref: str, text: str | None, left: int) -> str | None:
    if text is None:
        return f"the diff is not in this repository any more (its commits were removed); " \
               f"the record names {ref}"
    if left:
        return f"{left} more lines of the diff left out; the whole change: `git show {ref}`"
    return None


def _json(value):
    return [_json(v) for v in value] if isinstance(value, tuple) else value


def change_counts(recs: list[Experiment]) -> dict:
    """The experiments after the baseline by outcome: the baseline is not a kept change."""
    changes = recs[1:]
    return {"total": len(changes),
            "kept": sum(r.status == Status.KEEP for r in changes),
            "reverted": sum(r.status == Status.REVERT for r in changes),
            "crashed": sum(r.status == Status.CRASH for r in changes),
            "correctness_failures": sum(r.correctness == Correctness.FAIL for r in changes)}


def incumbent_record(recs: list[Experiment], commit: str) -> Experiment | None:
    """The timed experiment that made `commit` the incumbent."""
    return next((r for r in reversed(recs)
                 if r.status == Status.KEEP and r.commit == commit and r.timing), None)






def competitors(bench: dict | None) -> dict[str, list[dict]]:
    """{shape: [{variant, median_ms, ci, vs_cutile, share_of_floor}]} from bench.json, the
    kernel's own rows left out."""
    out: dict[str, list[dict]] = {}
    for row in (bench or {}).get("rows", []):
        if row["variant"] in (BENCH_SELF, BENCH_AGAIN):
            continue
        out.setdefault(row["shape"], []).append(
            {"variant": row["variant"], "median_ms": row["median_ms"],
             "ci_ms": [row.get("ci_low_ms"), row.get("ci_high_ms")],
             "vs_cutile": row.get("vs_cutile"), "share_of_floor": row.get("share_of_floor"),
             "tflops": row.get("tflops")})
    return out


def bench_self(bench: dict | None, shape: str) -> float | None:
    """The kernel's own median at `shape` in bench.json."""
    return next((row["median_ms"] for row in (bench or {}).get("rows", [])
                 if row["shape"] == shape and row["variant"] == BENCH_SELF), None)


def shapes(recs: list[Experiment], names: list[str], incumbent: str,
           confirmation: Confirmation | None, bench: dict | None, headline: str) -> list[dict]:
    """Per benchmark shape (`names`, in the kernel's order): the baseline's and the incumbent's
    medians (each from its own experiment, so from different processes), their shares of the
    physical floor, the one-process speedup when confirmed, and the last bench's competitors."""
    confirmed = confirmation.shapes if confirmation else {}
    same = bool(confirmation and confirmation.nothing_kept)
    method = NOTHING_KEPT if same else ONE_PROCESS
    rivals = competitors(bench)
    out = []
    for name in names:
        best, inc = incumbent_timed(recs, incumbent, name)
        base = shape_stats(recs[0], name)
        floor = shape_timed(best if inc else recs[0] if base else None, name)
        one = confirmed.get(name)
        out.append({
            "shape": name, "headline": name == headline,
            "baseline_ms": base and base.median_ms,
            "incumbent_ms": inc and inc.median_ms,
            "incumbent_iteration": best.iteration if best else None,
            "floor_ms": floor.floor_ms if floor else None,
            "baseline_share_of_floor": base and base.share_of_floor,
            "incumbent_share_of_floor": inc and inc.share_of_floor,
            "baseline_tflops": base and base.tflops,
            "incumbent_tflops": inc and inc.tflops,
            "speedup": one["speedup"] if one else None,
            "speedup_ci": one.get("speedup_ci") if one and not same else None,
            "speedup_method": method if one else None,
            "competitors": rivals.get(name, []),
        })
    return out


def latency_points(recs: list[Experiment], shape: str) -> list[dict]:
    """Every experiment at `shape`, for the latency plot: {iteration, ms, status, correctness,
    incumbent_ms}: the chosen variant's median (None when nothing was timed) and the
    incumbent's in the same pass; then each other candidate's median from the first pass
    (outcome ok) or its outcome where it was not timed (fail, crash, slow, screened)."""
    out = []
    for record in recs:
        chosen = shape_stats(record, shape)
        inc = shape_stats(record, shape, "incumbent")
        point: dict = {"iteration": record.iteration, "status": record.status,
                 "correctness": record.correctness, "ms": chosen and chosen.median_ms,
                 "incumbent_ms": inc and inc.median_ms, "candidates": []}
        timing = record.timing
        first = ((timing.selection or {}).get(shape) or timing.shapes.get(shape)
                 if timing else None)
        picked = timing.chosen if timing else None
        outcomes = record.outcomes or {}
        for label, o in outcomes.items():
            if label == picked or record.kind == Kind.BASELINE or len(outcomes) == 1:
                continue  # (a single candidate is the experiment's own point)
            timed = first.variants.get(label) if first else None
            ms = timed.median_ms if timed else None
            point["candidates"].append({"label": label, "outcome": o["outcome"], "ms": ms})
        out.append(point)
    return out


def phase_seconds(recs: list[Experiment], confirmation: Confirmation | None,
                  profile: dict | None) -> dict:
    """Seconds per phase over the run, the confirmation and the last profile included."""
    out: dict[str, float] = {}
    for record in recs:
        for phase, seconds in record.phases_s.items():
            if phase != "total" and seconds is not None:
                out[phase] = out.get(phase, 0.0) + seconds
    if confirmation and confirmation.wall_s is not None:
        out["confirmation"] = confirmation.wall_s
    if profile and profile.get("wall_s") is not None:
        out["profile"] = profile["wall_s"]
    return {k: round(v, 3) for k, v in out.items()}


def what(record: Experiment) -> str:
    """The experiment as its table row names it."""
    return naming.experiment(record)
