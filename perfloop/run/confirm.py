"""The run's result, measured as one comparison: the baseline commit against the final
incumbent, timed in one process in alternating rounds with an A/A control, on every shape.
Latencies from different iterations come from different processes and drift; this does not.
It is recorded in experiments.jsonl (kind "confirmation", no table row) and quoted by report."""

from __future__ import annotations

import time

from perfloop.contract import workload
from perfloop.core import progress
from perfloop.core.vocab import CONTROL, INCUMBENT
from perfloop.measure import phases
from perfloop.store import records
from perfloop.store.session import Session

FINAL = "final"




def ensure(s: Session) -> records.Confirmation | None:
    """Confirm the run's result once it has stopped (no-op if already confirmed)."""
    if s.confirmation() is not None or not s.records():
        return s.confirmation()
    with progress.task("confirmation", "the baseline against the final incumbent, in one process"):
        record = records.Confirmation.from_dict(measure(s))
    records.append(s.records_path, record)
    return record


def measure(s: Session) -> dict:
    """Time the baseline commit against the incumbent now, in one process; not recorded."""
    st = s.state
    started, t0 = time.time(), time.monotonic()
    record = {"schema": records.SCHEMA, "kind": records.CONFIRMATION,
              "after_iteration": s.records()[-1].iteration, "baseline": st.base_commit,
              "incumbent": st.incumbent, "headline": s.spec.headline.name, "shapes": {},
              "started_at": started}
    if st.incumbent == st.base_commit:
        # 1.0 by definition, not a measurement: no interval to quote
        record.update(shapes={sh.name: {"speedup": 1.0, "speedup_ci": None, "ratio": 1.0}
                              for sh in s.spec.shapes},
                      detail="the incumbent is the baseline: nothing was kept")
    else:
        work = s.work / f"confirm-{phases.nonce()}"
        work.mkdir(parents=True, exist_ok=True)
        # each from an export of its commit, of one shape: none tells which it is
        code = s.copies(work.name)
        base_dir, again_dir, final_dir = (s.export_commit(sha, code) for sha in (
            st.base_commit, st.base_commit, st.incumbent))
        base = {"label": INCUMBENT, "folder": base_dir, "knobs": s.spec.read_knobs(base_dir)}
        variants = [base, {**base, "label": CONTROL, "folder": again_dir},
                    {"label": FINAL, "folder": final_dir, "knobs": s.spec.read_knobs(final_dir)}]
        rules = s.playbook.rules
        timing = phases.time_variants(
            variants, workload.timer_shapes(s.spec), rules, contract=s.pinned().contract,
            tolerance=s.spec.tolerance, headline=s.spec.headline.name,
            ceilings_cache=s.ceilings_cache, work=work,
            confinement=s.confinement(), cache=s.compile_cache,
            deadline=time.monotonic() + rules.iteration_timeout_s, cwd=s.root,
            env=phases.child_env(s.playbook_dir, s.playbook.rules.pass_env))
        failed = (timing.raw.get("failed") or {}) if not timing.crashed else {}
        if timing.crashed or failed or timing.excluded:
            why = timing.crashed or "; ".join(
                f"{k}: {v['reason']}" for k, v in {**failed, **timing.excluded}.items())
            record["error"] = f"the confirmation could not be timed: {why}"
        else:
            summary = records.summary(phases.summarize_pass(timing.raw["passes"][0],
                                                            ceiling=timing.raw.get("ceilings")))
            record["shapes"] = {name: _speedup(shape) for name, shape in summary.items()}
            record.update(environment=timing.raw.get("environment"),
                          method=timing.raw.get("method"))
    record.update(wall_s=round(time.monotonic() - t0, 3), finished_at=time.time())
    return record


def _inverse(x: float) -> float | None:
    return 1 / x if x > 0 else None   # (NaN or no time: no speedup to quote)


def _speedup(shape: records.ShapeSummary) -> dict:
    c = shape.vs_incumbent[FINAL]
    return {"ratio": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high,
            "noise": c.noise, "speedup": _inverse(c.ratio),
            "speedup_ci": [_inverse(c.ci_high), _inverse(c.ci_low)],
            "baseline_ms": shape.variants[INCUMBENT].median_ms,
            "final_ms": shape.variants[FINAL].median_ms}
