"""Plain, JSON-ready views of the record, shared by the commands' JSON and text output."""

from __future__ import annotations

from perfloop.contract import settings
from perfloop.core.vocab import Status, Stop
from perfloop.report import review
from perfloop.store import records
from perfloop.store.session import Session

SCHEMA = 1


def experiment(record: records.Experiment) -> dict:
    return {"iteration": record.iteration, "kind": record.kind,
            "optimization": record.optimization, "knob": record.knob,
            "value": record.value, "describe": record.describe or None,
            "what": review.what(record),   # as the table's row names it
            "status": record.status, "correctness": record.correctness,
            "latency_ms": record.latency_ms, "gain": record.gain,
            "reason": record.reason, "commit": record.commit, "ref": record.ref}


def experiment_line(e: dict) -> str:
    what = f"agent edit: {e['what']}" if e["kind"] == "agent" else e["what"]
    latency = f"{e['latency_ms']:.6f} ms" if e["latency_ms"] is not None else "    (not timed)"
    return (f"iteration {e['iteration']:<3} {what[:48]:<48} {latency:>14}  {e['correctness'] or '-':<4} "
            f"{e['status']:<6} {e['reason']}")


def incumbent(s: Session, recs: list[records.Experiment]) -> dict:
    kept = [r for r in recs if r.status == Status.KEEP]
    last = kept[-1] if kept else None
    return {"commit": s.state.incumbent, "iteration": last.iteration if last else None,
            "latency_ms": last.latency_ms if last else None,
            "knobs": last.knobs if last else None}


def speedup(s: Session, recs: list[records.Experiment]) -> dict:
    """The headline speedup of the incumbent over the baseline: the one-process confirmation
    when the run has one for this incumbent, else the product of the kept experiments' ratios
    (each measured in one process against its own incumbent)."""
    head = s.spec.headline.name
    confirmed = s.confirmation()
    if confirmed and head in confirmed.shapes:
        shape = confirmed.shapes[head]
        if confirmed.nothing_kept:
            return {"speedup": 1.0, "ci": None, "method": review.NOTHING_KEPT,
                    "shapes": confirmed.shapes}
        return {"speedup": shape["speedup"], "ci": shape.get("speedup_ci"),
                "method": review.ONE_PROCESS, "shapes": confirmed.shapes}
    value, left_out = 1.0, impossible(recs)
    for r in recs[1:]:
        if r.status == Status.KEEP and r.gain is not None and r.iteration not in left_out \
                and r.gain < 1.0:
            value /= 1.0 - r.gain
    return {"speedup": value if recs else None, "ci": None,
            "method": "product of the kept experiments' in-process ratios (not confirmed)"
                      + (f"; iterations {', '.join(map(str, left_out))} left out: a time of "
                         "0 ms is impossible" if left_out else ""),
            "shapes": None}


def impossible(recs: list[records.Experiment]) -> list[int]:
    """The iterations whose time is impossible (records.Experiment.impossible)."""
    return [r.iteration for r in recs if r.impossible or r.gain is not None and r.gain >= 1.0]


def status(s: Session) -> dict:
    recs = s.records()
    st = s.state
    baseline = recs[0].latency_ms if recs else None
    inc = incumbent(s, recs)
    return {"kernel": st.kernel, "run_id": st.branch, "branch": st.branch,
            "kernel_class": st.kernel_class or None,
            "intensity_flop_per_byte": st.intensity, "class_basis": st.class_basis or None,
            "base_commit": st.base_commit,
            "incumbent": inc, "baseline_latency_ms": baseline,
            "speedup_vs_baseline": speedup(s, recs)["speedup"],
            "iterations": len(recs), "experiments": [experiment(r) for r in recs],
            "impossible": impossible(recs),
            **stop_fields(st.stop), "interrupted": line(st.interrupted),
            "in_flight": st.in_flight, "table": str(s.table_path), "record": str(s.records_path),
            "archived": archived(s), "settings": settings_in_force(s)}


def settings_in_force(s: Session) -> dict:
    """{key: {value, from}} of the settings a kernel or a flag may set (perfloop.contract.settings),
    as the run pinned them: from a flag, kernel.toml's [rules], or rules.toml."""
    return {key: {"value": value,
                  "from": "flag" if key in s.state.overrides else
                          "kernel.toml" if key in s.spec.rules else "rules.toml"}
            for key, value in settings.in_force(s.playbook.rules).items()}


def settings_line(found: dict) -> str | None:
    """The settings not rules.toml's, in a line (None when all are)."""
    own = [f"{key} {_setting(x['value'])} ({x['from']})" for key, x in found.items()
           if x["from"] != "rules.toml"]
    return "settings: " + ", ".join(own) if own else None


def archived(s: Session) -> str | None:
    """The folder of the archived run a reader shows (no current run), else None."""
    return str(s.archived.relative_to(s.root)) if s.archived else None


def archived_line(folder: str) -> str:
    return (f"no current run: this is the latest archived run, kept in {folder} "
            "(`--new` or a baseline that did not pass set it aside)")


def retuned_lines(retuned: dict | None) -> list[str]:
    """What a command's flags changed in the run's pinned rules (loop.retune)."""
    return [f"{key}: {_setting(before)} -> {_setting(after)} for the rest of this run (kept "
            "in state.json)" for key, (before, after) in (retuned or {}).items()]


def _setting(value) -> str:
    return "off" if value is None else f"{value:g}"


def line(stop: Stop | None) -> str | None:
    return stop.detail if stop else None


def stop_fields(stop: Stop | None) -> dict:
    """`stopped`: the stop's line (as it always was); `stopped_by`: which rule, for code;
    `never_tried`: the catalog entries a time-budget stop left untried."""
    return {"stopped": line(stop), "stopped_by": stop.reason if stop else None,
            "never_tried": list(stop.never_tried) if stop else None}
