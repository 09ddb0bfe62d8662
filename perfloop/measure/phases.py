"""The timing phase of an experiment, in child processes under a deadline (the judge's side is
perfloop.measure.judge).

Both children get the same environment: nothing tells kernel code whether it is being judged
or timed (the request travels in a file named on the command line). Each child writes only
files whose names carry a fresh nonce, so a child left over from a killed run can never be
mistaken for the current one. When a child dies or hangs, the candidate it was running is
recorded as crashed and the others are judged or timed without it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from perfloop.core import progress, stats
from perfloop.core.atomic import digest, json_bytes, write_bytes, write_json
from perfloop.core.errors import EnvironmentFailure
from perfloop.contract.kernel import code_digest
from perfloop.isolation.mounts import filesystem
from perfloop.contract.playbook import Rules, thaw
from perfloop.isolation.sandbox import Confinement, kernel_env, linked_cache, passed_environment
from perfloop.core.vocab import CONTROL, INCUMBENT, Outcome
from perfloop.measure import process

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # the folder holding perfloop/


def child_env(playbook_dir: Path, passed: tuple = ()) -> dict:
    """The one environment of every child: of perfloop's own, only what the children need
    (perfloop.isolation.sandbox.passed_environment, with the rules' pass_env as `passed`)."""
    env = passed_environment(dict(os.environ), passed)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    env["PERFLOOP_PLAYBOOK"] = str(playbook_dir)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PERFLOOP_CRASH_AT", None)  # fault injection is for the parent only
    # any git a child runs (pytest-benchmark's `git describe --dirty` rewrites the index) runs
    # no repository hook, as perfloop's own (perfloop.store.gitops.NO_HOOKS)
    env["GIT_CONFIG_PARAMETERS"] = " ".join(
        p for p in (env.get("GIT_CONFIG_PARAMETERS"), "'core.hooksPath=/dev/null'") if p)
    for name in ("PYTEST_VERSION", "PYTEST_CURRENT_TEST"):  # the judge hides pytest's own too
        env.pop(name, None)
    return env


def variants_json(variants: list[dict]) -> list[dict]:
    return [{**v, "folder": str(v["folder"]),
             "knobs": {k: thaw(x) for k, x in v["knobs"].items()}} for v in variants]


def nonce() -> str:
    return secrets.token_hex(4)


class _TimingShown:
    """The timer's progress line: which variant it times at which shape, from the worker's
    progress file (the one the hang watchdog reads)."""

    def __init__(self, shapes: list[str], rounds: int):
        self.shapes, self.rounds = shapes, rounds
        self.bar = progress.task("timing", f"{len(shapes)} shapes", total=len(shapes))
        self.pass_, self.shape, self.events = 1, None, 0

    def watch(self, path: Path, labels: int):
        tail = progress.Tail(path)

        def seen():
            for line in tail.lines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                name = event.get("shape")
                if name is None or name not in self.shapes:
                    self.bar.update(f"{event.get('label')}: {event.get('stage')}")
                    continue
                if name != self.shape:
                    if self.shape is not None and self.shapes.index(name) < self.shapes.index(self.shape):
                        self.pass_ += 1  # the fastest candidate, timed again in fresh rounds
                    self.shape, self.events = name, 0
                self.events += event.get("stage") == "time"
                # each variant's batches: its first call, its warm-up, then one per round
                done = max(0, self.events - 2 * labels) // max(labels, 1)
                index = self.shapes.index(name)
                self.bar.update(f"pass {self.pass_}, {name} ({index + 1}/{len(self.shapes)}), "
                                f"round {min(done, self.rounds)}/{self.rounds}, "
                                f"{event.get('label')}",
                                completed=index + min(done, self.rounds) / self.rounds)

        return seen


@dataclass
class Timing:
    crashed: str = ""                               # why the whole timing failed, if it did
    raw: dict = field(default_factory=dict)
    excluded: dict = field(default_factory=dict)    # label -> {reason, kind} of a dropped one
    imports: set = field(default_factory=set)
    wall_s: float = 0.0


def _last_progress(path: Path) -> dict | None:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


@dataclass
class Pending:
    """A timing worker started ahead of the judge: it imports, sets up the GPU and the profiler
    and builds the variants while the judge runs, then waits for the labels that passed."""

    common: dict
    variants: list
    work: Path
    cwd: Path
    env: dict
    stall_s: float
    started: float
    attempt: tuple | None = None  # (tag, running child) of the worker waiting for its go
    specs: dict = field(default_factory=dict)  # tag -> digest of the spec perfloop wrote

    def labels(self) -> set[str]:
        """The variants' labels (a culprit among none of them is the timer's own)."""
        return {v["label"] for v in self.variants}


def start_timer_ahead(*, cwd: Path, work: Path, env: dict) -> tuple:
    """A timing worker for the next experiment, started now: it imports perfloop.isolation.lifeline.PRELOAD and
    waits for its spec (see start_timing's `ahead`). Returns (spec path, running child)."""
    spec_path = work / f"timing-{nonce()}-spec.json"
    return spec_path, process.start(process.python(cwd, "perfloop.referee.timer", str(spec_path)),
                                  log=spec_path.with_name(spec_path.name[:-len("-spec.json")]
                                                          + ".log"), env=env, cwd=cwd)


def _launch(pending: Pending, variants: list[dict], go: dict | None,
            ahead: tuple | None = None) -> tuple:
    """Start a worker for these variants, or hand them to `ahead` (start_timer_ahead's), if it
    still waits."""
    work = pending.work  # (the worker's files: only an ahead worker's spec lies elsewhere)

    def files(tag: str | None) -> dict:
        return {"out": str(work / f"timing-{tag}.json"),
                "progress": str(work / f"timing-{tag}-progress.jsonl"),
                "imports_out": str(work / f"timing-{tag}-imports.json"),
                "go": str(work / f"timing-{tag}-go.json")}

    tag = ahead[0].name[len("timing-"):-len("-spec.json")] if ahead else None
    # dead, or someone wrote its spec or outputs first (their names carry a fresh nonce)
    if ahead and (ahead[1].proc.poll() is not None or any(
            Path(p).exists() for p in [ahead[0], *files(tag).values()])):
        ahead[1].kill()
        ahead = tag = None
    tag = tag or nonce()
    paths = files(tag)
    spec = json_bytes({**pending.common, "variants": variants_json(variants), **paths})
    pending.specs[tag] = digest(spec)
    spec_path = ahead[0] if ahead else work / f"timing-{tag}-spec.json"
    if go is not None:
        write_json(Path(paths["go"]), go)
    if ahead:
        ahead[1].adopt(progress=[Path(paths["progress"])])
        write_bytes(spec_path, spec)  # (atomic: the waiting worker reads all of it or nothing)
        return tag, ahead[1]
    write_bytes(spec_path, spec)
    running = process.start(process.python(pending.cwd, "perfloop.referee.timer", str(spec_path)),
                          log=work / f"timing-{tag}.log", env=pending.env, cwd=pending.cwd,
                          progress=[Path(paths["progress"])])
    return tag, running


def start_timing(variants: list[dict], shapes: list[dict], rules: Rules, *, contract: Path,
                 tolerance: dict, headline: str, ceilings_cache: Path, work: Path, cwd: Path,
                 env: dict,
                 only_buckets: list[str] | None = None, always: list[str] | tuple[str, ...] = (),
                 ahead: tuple | None = None, confinement: Confinement = Confinement(),
                 cache: Path | None = None, held_back_if_gain: bool = False) -> Pending:
    """Start the worker for these variants (the incumbent and its control first; every one of
    kernel code is checked alike). `only_buckets`: time only the shapes in these buckets (by the kernel's
    bucket()) and those named in `always`: a change of the dispatch table leaves every other
    bucket's code as it was. `ahead`: a worker started ahead (start_timer_ahead) takes them.
    `held_back_if_gain`: a pass times the held-back shapes only where some candidate was
    faster at a benchmark shape (a decision's timing: they only guard a keep)."""
    common = {"shapes": shapes, "measure": vars(rules.measure),
              **({"only_buckets": list(only_buckets), "always": list(always)}
                 if only_buckets is not None else {}),
              "contract_folder": str(contract), "root": str(cwd),
              "reply_timeout_s": rules.stall_timeout_s / 2, "log_cap_mb": rules.log_cap_mb,
              "regression_tolerance": rules.decision.regression_tolerance,
              "min_gain": rules.decision.min_gain,
              "tolerance": tolerance, "headline": headline, "ceilings_cache": str(ceilings_cache),
              "confinement": {"mode": confinement.mode, "reads": list(confinement.reads)},
              "cache": str(cache or work / "cache"),
              **({"held_back": "if-gain"} if held_back_if_gain else {})}
    pending = Pending(common, list(variants), work, cwd, env, rules.stall_timeout_s,
                      time.monotonic())
    pending.attempt = _launch(pending, pending.variants, None, ahead)
    return pending


def start_warmers(variants: list[dict], shapes: list[dict], *, processes: int, contract: Path,
                  work: Path, cwd: Path, env: dict, confinement: Confinement = Confinement(),
                  cache: Path | None = None) -> list:
    """Up to `processes` children (perfloop.child.warm) that launch the variants once at every
    shape, each its share of them, so their compiles land in cuTile's disk cache in parallel
    while the judge runs. Variants of one code share a cache (and a warmer); no process that
    runs one code may write another's. Stop them with stop_warmers."""
    groups: dict = {}
    for v in variants:
        groups.setdefault(code_digest(Path(v["folder"])), []).append(v)
    count, running = min(processes, len(variants)), []
    for code, group in groups.items():
        share = max(1, round(count * len(group) / len(variants)))
        for i in range(min(share, len(group))):
            folder = work / f"k-{nonce()}"
            folder.mkdir(parents=True)
            spec = folder / "warm.json"
            write_json(spec, {"contract_folder": str(contract), "shapes": shapes,
                              "variants": variants_json(group[i::share])})
            shared = (cache or work / "cache") / code
            mine = kernel_env({**env, "CUDA_TILE_CACHE_DIR": linked_cache(folder, shared)},
                              folder, cwd, confinement)
            running.append(process.start(process.python(cwd, "perfloop.child.warm", str(spec)),
                                         log=folder / "warm.log", env=mine, cwd=folder))
    return running


def wait_warmers(running: list, until: float) -> int:
    """Wait for the warmers to finish, until the monotonic time `until` at most; then stop
    them. Returns how many had finished."""
    while any(r.proc.poll() is None for r in running) and time.monotonic() < until:
        time.sleep(0.2)
    return stop_warmers(running)


def stop_warmers(running: list) -> int:
    """Stop the warmers; returns how many had finished by then."""
    done = sum(r.proc.poll() is not None for r in running)
    for r in running:
        r.kill()
    return done


def abandon(pending: Pending | None) -> None:
    """Nothing passed the judge: stop the waiting worker."""
    if pending is not None and pending.attempt:
        pending.attempt[1].kill()
        pending.attempt = None


def finish_timing(pending: Pending, labels: list[str], *, deadline: float,
                  select: bool = False, replay: dict | None = None) -> Timing:
    """Time the incumbent, its control and the candidates named in `labels` in one process;
    if the worker dies or hangs in a candidate's code, drop that candidate (recorded with the
    reason) and time the rest again in a new worker. `replay` ({path, digest}): the judge's
    cases, which the worker replays in each variant's launcher (perfloop.referee.replay)."""
    out = Timing()
    keep = {INCUMBENT, CONTROL, *labels}
    remaining = [v for v in pending.variants if v["label"] in keep]
    go = {"labels": [v["label"] for v in remaining], "select": select,
          **({"replay": {"path": replay.get("path"), "digest": replay.get("digest")}}
             if replay else {})}
    tag, running = pending.attempt or _launch(pending, remaining, go)
    if pending.attempt:
        write_json(pending.work / f"timing-{tag}-go.json", go)
        pending.attempt = None
    shown = (_TimingShown([sh["name"] for sh in pending.common["shapes"]],
                          pending.common["measure"]["rounds"]) if progress.enabled() else None)
    try:
        return _finish(pending, out, running, tag, remaining, go, deadline, select, shown)
    finally:
        if shown:
            shown.bar.close()


def _finish(pending: Pending, out: Timing, running, tag: str, remaining: list, go: dict,
            deadline: float, select: bool, shown) -> Timing:
    while True:
        watch = (shown.watch(pending.work / f"timing-{tag}-progress.jsonl", len(go["labels"]))
                 if shown else None)
        res = running.wait(deadline=deadline, stall_s=pending.stall_s, on_progress=watch)
        result = pending.work / f"timing-{tag}.json"
        written = pending.work / f"timing-{tag}-progress.jsonl"
        imports = pending.work / f"timing-{tag}-imports.json"
        if imports.exists():
            try:
                out.imports |= set(json.loads(imports.read_text()))
            except (OSError, ValueError):  # cut short: kernel code cannot write there
                cause = (f"the timing worker's list of what it imported ({imports}) is "
                         f"unreadable: the machine failed it (is {filesystem(imports)} full?), "
                         "not the candidate; free some space")
                raise EnvironmentFailure(
                    f"{cause}; nothing was recorded: `perfloop run --resume` runs the "
                    "experiment again", during=True, cause=cause) from None
        if res.returncode == 0 and result.exists():
            out.raw = _read_result(result) or {}
            if out.raw.get("spec") == pending.specs.get(tag):
                break
            out.raw = {}
            out.crashed = ("the timing worker's result is not of the spec perfloop wrote (its "
                           f"spec or result file was replaced; log: {res.log})")
            break
        last = _last_progress(written) or {}
        culprit = last.get("label")
        reason = last.get("reason") or f"timing worker {res.describe()} (log: {res.log})"
        kind = Outcome.FAIL if last.get("stage") == "tampered" else Outcome.CRASH
        if culprit not in go["labels"] and culprit not in pending.labels() \
                or culprit in (None, INCUMBENT, CONTROL) or res.timed_out and not res.stalled:
            out.crashed = f"{culprit}: {reason}" if culprit else reason
            break
        if culprit in go["labels"]:  # (else it died while built, and had failed the judge)
            out.excluded[culprit] = {"reason": f"its code {reason}" if kind == Outcome.FAIL
                                     else reason, "kind": kind}
        remaining = [v for v in remaining if v["label"] != culprit]
        if len(remaining) <= 2:  # only the incumbent and its control are left
            break
        go = {**go, "labels": [v["label"] for v in remaining]}
        tag, running = _launch(pending, remaining, go)
    out.wall_s = round(time.monotonic() - pending.started, 3)
    return out


def _read_result(path: Path) -> dict | None:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return raw if isinstance(raw, dict) else None


def time_variants(variants: list[dict], shapes: list[dict], rules: Rules, *, deadline: float,
                  select: bool = False, cliffs: bool = False, **where) -> Timing:
    """start_timing and finish_timing in one go, for timings no judge precedes. Without
    `cliffs` (bench and the confirmation, which compare variants far apart) no candidate is
    dropped for being slow."""
    if not cliffs:
        rules = dataclasses.replace(rules, measure=dataclasses.replace(rules.measure,
                                                                       cliff_ratio=None))
    pending = start_timing(variants, shapes, rules, **where)
    return finish_timing(pending, [v["label"] for v in variants], deadline=deadline,
                         select=select)


def summarize_pass(timed_pass: dict, incumbent: str = INCUMBENT, control: str = CONTROL,
                   ceiling: dict | None = None) -> dict:
    """Per shape: each variant's statistics, its host time, and its comparison to the
    incumbent with the noise that the A/A control showed on that shape."""
    shapes = {}
    ceiling = ceiling or {}
    for name, shape in timed_pass["shapes"].items():
        labels = list(shape["rounds"])
        per_variant, round_medians = {}, {}
        for label in labels:
            rounds = shape["rounds"][label]
            samples = [s for r in rounds for s in r]
            round_medians[label] = [statistics.median(r) for r in rounds]
            summary = stats.summarize(samples)
            host = shape.get("host_us", {}).get(label) or []
            entry = {"median_ms": summary.median, "ci_low_ms": summary.ci_low,
                     "ci_high_ms": summary.ci_high, "n": summary.n,
                     "round_medians_ms": round_medians[label], "samples_ms": samples,
                     "host_us_per_call": statistics.median(host) if host else None,
                     "host_us_samples": host,
                     "fresh_ratio": shape.get("fresh_ratio", {}).get(label)}
            tensor = sum(count for unit, count in (shape.get("flops_by_unit") or {}).items()
                         if unit.startswith("tensor."))
            if tensor and summary.median > 0:   # a compute-bound kernel's rate, as its peers say
                entry["tflops"] = tensor / summary.median / 1e9
            if shape.get("floor_ms") and summary.median > 0:
                entry["gbps"] = shape["bytes"] / summary.median / 1e6
                entry["share_of_floor"] = shape["floor_ms"] / summary.median
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
                        "flops_by_unit": shape.get("flops_by_unit"),
                        "bucket": shape.get("bucket"), "held_back": shape.get("held_back", False),
                        **({"routed_from": shape["routed_from"]}
                           if shape.get("routed_from") else {}),
                        **({"tuned": True} if shape.get("tuned") else {}),
                        "floor_ms": shape.get("floor_ms"), "reps_per_round": shape["reps"],
                        "pad_us": shape.get("pad_us"), "noise": noise, "variants": per_variant,
                        "bracket_subtracted": shape.get("bracket_subtracted"),
                        "vs_incumbent": comparisons}
    return shapes


def elapsed(start: float) -> float:
    return round(time.monotonic() - start, 3)
