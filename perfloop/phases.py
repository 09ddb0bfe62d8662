"""The two measured phases of an experiment, each in a child process under a deadline:
the judge (the kernel's pytest file) and the timing worker."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from perfloop import child, stats
from perfloop.atomic import write_json
from perfloop.correctness import LOG_ENV, VARIANTS_ENV
from perfloop.playbook import Rules, thaw

PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


def _env(phase: str, extra: dict) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    env["PERFLOOP_PHASE"] = phase
    env.pop("PERFLOOP_CRASH_AT", None)  # fault injection is for the parent only
    env.update(extra)
    return env


def _variants_json(variants: list[dict]) -> list[dict]:
    return [{**v, "folder": str(v["folder"]),
             "knobs": {k: thaw(x) for k, x in v["knobs"].items()}} for v in variants]


@dataclass
class JudgeResult:
    crashed: bool
    detail: str
    passed: dict = field(default_factory=dict)   # label -> bool
    cases: dict = field(default_factory=dict)    # label -> [case records]
    wall_s: float = 0.0


def judge(judge_file: Path, variants: list[dict], *, cwd: Path, work: Path, tag: str,
          timeout_s: float) -> JudgeResult:
    log = work / f"{tag}-correctness.jsonl"
    log.unlink(missing_ok=True)
    env = _env("correctness", {VARIANTS_ENV: json.dumps(_variants_json(variants)),
                               LOG_ENV: str(log)})
    cmd = [sys.executable, "-m", "pytest", str(judge_file), "-q", "-p", "no:cacheprovider",
           "-o", "addopts=", "--rootdir", str(cwd)]
    res = child.run(cmd, timeout_s=timeout_s, log=work / f"{tag}-correctness.log", env=env, cwd=cwd)
    if res.died or res.returncode not in (0, 1):
        return JudgeResult(True, f"judge {res.describe()} (log: {res.log})", wall_s=res.wall_s)
    cases: dict[str, list] = {v["label"]: [] for v in variants}
    if log.exists():
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            cases.setdefault(entry["label"], []).append(entry)
    # a variant the judge never reported on was not judged, so it does not pass
    passed = {label: bool(c) and all(e["passed"] for e in c) for label, c in cases.items()}
    if res.returncode == 1 and all(passed.values()):
        # a test failed outside perfloop.correctness.check: no variant can be trusted
        passed = dict.fromkeys(passed, False)
    return JudgeResult(False, f"judge {res.describe()}", passed, cases, res.wall_s)


@dataclass
class Timing:
    crashed: bool
    detail: str
    raw: dict = field(default_factory=dict)
    wall_s: float = 0.0


def time_variants(variants: list[dict], shapes: list[dict], rules: Rules, *, ceilings_cache: Path,
                  work: Path, tag: str, timeout_s: float, cwd: Path) -> Timing:
    out = work / f"{tag}-timing.json"
    out.unlink(missing_ok=True)
    spec = {"variants": _variants_json(variants), "shapes": shapes,
            "measure": vars(rules.measure), "ceilings_cache": str(ceilings_cache), "out": str(out)}
    spec_path = work / f"{tag}-timing-spec.json"
    write_json(spec_path, spec)
    res = child.run([sys.executable, "-m", "perfloop.worker", str(spec_path)], timeout_s=timeout_s,
                    log=work / f"{tag}-timing.log", env=_env("timing", {}), cwd=cwd)
    if res.died or res.returncode != 0 or not out.exists():
        return Timing(True, f"timing worker {res.describe()} (log: {res.log})", wall_s=res.wall_s)
    return Timing(False, "timed", json.loads(out.read_text()), res.wall_s)


CONTROL = "incumbent-again"  # the incumbent timed a second time: the A/A control


def summarize_timing(raw: dict, labels: list[str], incumbent: str,
                     control: str = CONTROL) -> dict:
    """Per shape: each variant's statistics, and each variant's comparison to the incumbent
    with the noise that the A/A control showed on that shape."""
    shapes = {}
    ceiling = raw.get("ceilings") or {}
    for name, shape in raw["shapes"].items():
        per_variant = {}
        round_medians = {}
        for label in labels:
            rounds = shape["rounds"][label]
            samples = [s for r in rounds for s in r]
            round_medians[label] = [statistics.median(r) for r in rounds]
            summary = stats.summarize(samples)
            entry = {"median_ms": summary.median, "ci_low_ms": summary.ci_low,
                     "ci_high_ms": summary.ci_high, "n": summary.n,
                     "round_medians_ms": round_medians[label], "samples_ms": samples}
            if shape.get("floor_ms"):
                entry["gbps"] = shape["bytes"] / summary.median / 1e6
                entry["share_of_ceiling"] = shape["floor_ms"] / summary.median
                if ceiling.get("copy_gbps"):
                    entry["share_of_copy_bw"] = entry["gbps"] / ceiling["copy_gbps"]
            per_variant[label] = entry
        noise = 0.0
        if control in labels:
            noise = stats.noise_of(stats.compare(round_medians[incumbent], round_medians[control]))
        comparisons = {label: vars(stats.compare(round_medians[incumbent], round_medians[label],
                                                 noise=noise))
                       for label in labels if label != incumbent}
        shapes[name] = {"bytes": shape["bytes"], "flops": shape["flops"],
                        "floor_ms": shape.get("floor_ms"), "reps_per_round": shape["reps"],
                        "noise": noise, "variants": per_variant, "vs_incumbent": comparisons}
    return shapes


def elapsed(start: float) -> float:
    return round(time.monotonic() - start, 3)
