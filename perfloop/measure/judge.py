"""The parent's side of the judge: the kernel's correctness tests, run in two kinds of process.

- Kernel passes (perfloop.child.judge_plugin) run the judge with kernel code, in up to
  `processes` pytest processes side by side, and deliver each case's output as data.
- One reference pass (perfloop.referee.judge_plugin) runs the same judge in a process that
  never imports kernel code, computes each case's expected value, and, once perfloop names
  the kernel passes' output folders, compares and writes the verdict.

A kernel pass that dies, hangs or stops before all its cases ran has each of its variants
judged again whole in a process of its own, so one bad candidate does not void the others;
whatever a kernel pass reports can only fail a variant, never pass it. The request of each
process travels in a file named on its command line, which no process reads before perfloop
writes it (its name carries a fresh nonce).
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from perfloop.core import plainfile, progress
from perfloop.core.atomic import digest, json_bytes, write_bytes
from perfloop.contract.kernel import code_digest
from perfloop.isolation.sandbox import Confinement, kernel_env, linked_cache
from perfloop.measure import process
from perfloop.measure.phases import nonce, variants_json
from perfloop.store.pinned import Pinned

KERNEL_PLUGIN, REFEREE_PLUGIN = "perfloop.child.judge_plugin", "perfloop.referee.judge_plugin"


@dataclass
class JudgeResult:
    crashed: dict = field(default_factory=dict)  # label -> why its judge died
    passed: dict = field(default_factory=dict)   # label -> bool, for labels judged to the end
    cases: dict = field(default_factory=dict)    # label -> [case records]
    imports: set = field(default_factory=set)    # every file a judge process imported
    doubted: dict = field(default_factory=dict)  # label -> why its kernel pass failed it
    wall_s: float = 0.0
    passes_s: float = 0.0                        # of wall_s, until every kernel pass ended
    detail: str = ""
    processes: int = 1                           # kernel-pass processes run side by side
    replay: dict | None = None                   # the judge's replayable cases: {path, digest}


def _cmd(tree: Pinned, root: Path, plugin: str, option: str, request: Path) -> list[str]:
    """The judge's copy in the run's pinned tree, with the pinned pytest configuration and the
    tree as pytest's rootdir (its process runs there). `root`: the repository's, whose files
    the child compiles from their source. (A judge whose request file does not exist yet was
    started ahead: it waits for it.)"""
    return process.python(root, "pytest", str(tree.judge), "-q", "-p", "no:cacheprovider", "-p",
                          plugin, f"{option}={request}", "-c", str(tree.ini), "-o", "addopts=",
                          "--rootdir", str(tree.root))


def _kernel_cmd(tree: Pinned, root: Path, request: Path) -> list[str]:
    return _cmd(tree, root, KERNEL_PLUGIN, "--perfloop-request", request)


def _referee_cmd(tree: Pinned, root: Path, request: Path) -> list[str]:
    return _cmd(tree, root, REFEREE_PLUGIN, "--perfloop-reference", request)


def contract_of(tree: Pinned) -> dict:
    """What perfloop.correctness reads the kernel's declared tolerances and hooks from: the
    pinned copy of the kernel folder, wherever the judge looks for it."""
    return {"folder": str(tree.contract), "copy": str(tree.contract)}


@dataclass
class JudgePool:
    """Judge processes started ahead of the experiment that will use them: each has started
    pytest, loaded its plugins and imported perfloop.isolation.lifeline.PRELOAD, and waits for its
    request file. `judge` takes them in place of new processes; `discard` kills what is left."""

    key: tuple                                       # (judge file, environment, confinement)
    ready: list = field(default_factory=list)        # kernel passes: [(request, Running, cache)]
    referee: tuple | None = None                     # the reference pass: (request, Running)

    def take(self, key: tuple):
        """A waiting kernel pass for a judge with this key, or None."""
        while self.ready and key == self.key:
            found = self.ready.pop(0)
            if found[1].proc.poll() is None:
                return found
            found[1].kill()
        return None

    def take_referee(self, key: tuple):
        found, self.referee = self.referee, None
        if found and key == self.key and found[1].proc.poll() is None:
            return found
        if found:
            found[1].kill()
        return None

    def discard(self) -> None:
        while self.ready:
            self.ready.pop()[1].kill()
        if self.referee:
            self.referee[1].kill()
            self.referee = None


def _pool_key(tree: Pinned, env: dict, confinement: Confinement) -> tuple:
    return str(tree.judge), tuple(sorted(env.items())), confinement


def _kernel_folder(work: Path) -> Path:
    """A kernel pass's own folder, the only place it may write (its name carries a nonce)."""
    folder = work / f"k-{nonce()}"
    folder.mkdir(parents=True)
    return folder


def shared_cache(cache: Path | None, folders) -> Path | None:
    """The compile cache a kernel pass shares with the timer's launchers (perfloop.measure.
    phases): its variants' code's, where they all have one code, so the cases it compiles
    are in cache when the timer replays them (RMSNorm's baseline on an H100 spent 55.6 s
    compiling 13 replayed cases again). A process never writes the cache of code it does
    not run: with several codes, a cache of its own."""
    codes = {code_digest(Path(f)) if f else None for f in folders}
    if cache is None or len(codes) != 1 or None in codes:
        return None
    code = codes.pop()
    assert code is not None   # (refused above)
    return Path(cache) / code


def _start_kernel_pass(tree: Pinned, root: Path, work: Path, env: dict,
                       confinement: Confinement, shared: Path | None = None) -> tuple:
    """(request, Running, shared): a kernel pass waiting for its request, in a folder of its
    own, with the compile cache `shared` where one is given (its own otherwise)."""
    folder = _kernel_folder(work)
    request = folder / "request.json"
    if shared is not None:
        env = {**env, "CUDA_TILE_CACHE_DIR": linked_cache(folder, shared)}
    return request, process.start(
        _kernel_cmd(tree, root, request), log=folder / "pytest.log", cwd=tree.root,
        env=kernel_env(env, folder, root, confinement)), shared


def start_judges(tree: Pinned, *, root: Path, work: Path, env: dict, processes: int,
                 confinement: Confinement = Confinement(), cache: Path | None = None,
                 code_folder: Path | None = None) -> JudgePool:
    """Start `processes` kernel passes and a reference pass for the next experiment; the
    kernel passes share the compile cache of `code_folder`'s code (shared_cache), which the
    variants they are given must all have for them to be taken."""
    pool = JudgePool(_pool_key(tree, env, confinement))
    shared = shared_cache(cache, [code_folder])
    for _ in range(processes):
        pool.ready.append(_start_kernel_pass(tree, root, work, env, confinement, shared))
    request = work / f"referee-{nonce()}.json"
    pool.referee = (request, process.start(_referee_cmd(tree, root, request),
                                           log=request.with_suffix(".log"), env=env,
                                           cwd=tree.root))
    return pool


def _kernel_files(request: Path) -> list[Path]:
    """A kernel pass's request, case log, audit and output folder, in its own folder: none
    exists before perfloop writes the request."""
    folder = request.parent
    return [request, folder / "cases.jsonl", folder / "audit.json", folder / "outputs"]


def _referee_files(request: Path) -> list[Path]:
    stem = request.name[:-len(".json")]
    return [request, request.with_name(f"{stem}-compare.json"),
            request.with_name(f"{stem}-verdict.json"), request.with_name(f"{stem}-cases.pt")]


def _fresh(ready: tuple | None, files) -> tuple | None:
    """A process started ahead, unless someone wrote its request or outputs first (or it has
    died while it waited)."""
    if ready and (ready[1].proc.poll() is not None or any(p.exists() for p in files(ready[0]))):
        ready[1].kill()
        return None
    return ready


def _kernel_pass(tree: Pinned, variants: list[dict], *, root: Path, work: Path,
                 deadline: float, stall_s: float, env: dict, cancel: threading.Event,
                 confinement: Confinement, shown=None,
                 shard: tuple | None = None, ready: tuple | None = None,
                 cache: Path | None = None) -> tuple:
    """Run one kernel pass: (its ChildResult, its case-log entries, its audit, its outputs)."""
    shared = shared_cache(cache, [v.get("folder") for v in variants])
    ready = _fresh(ready, _kernel_files)
    if ready is not None and ready[2] != shared:  # started for other code: not this one's cache
        ready[1].kill()
        ready = None
    if ready is None:
        ready = _start_kernel_pass(tree, root, work, env, confinement, shared)
    request, running, _ = ready
    _, log, imports, outputs = _kernel_files(request)
    outputs.mkdir()
    body = json_bytes({"variants": variants_json(variants), "log": str(log),
                       "outputs": str(outputs), "imports_out": str(imports),
                       **({"shard": list(shard)} if shard else {}),
                       "contract": contract_of(tree)})
    running.adopt(progress=[log])
    write_bytes(request, body)  # (atomic: the waiting process reads all of it or nothing)
    # its audit, written last in its session, is all it delivers besides its cases and
    # outputs: what it does after that counts for nothing, so its teardown is not awaited
    # (a pass that writes an audit early only cuts its own cases short)
    res = running.wait(deadline=deadline, stall_s=stall_s, cancel=cancel,
                       on_progress=shown.watch(log) if shown else None,
                       done=imports.exists)
    entries = _read_lines(log)
    audit = _read_json(imports)
    if audit:
        audit["foreign_request"] = audit.get("request") != digest(body)
    return res, entries, audit, outputs


def _read_lines(path: Path) -> list[dict]:
    out = []
    if path.exists():
        try:
            text = plainfile.read_text(path, errors="replace")
        except OSError:  # (kernel code may have made its log a FIFO: no log, no cases)
            text = ""
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("label"), str):
                out.append(entry)
    return out


def _read_json(path: Path) -> dict:
    try:
        raw = json.loads(plainfile.read_text(path)) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _incomplete(res: process.ChildResult, audit: dict) -> str:
    """Why a kernel pass cannot stand, or "": it died or hung, pytest itself failed, or it
    ended before every case it was given had run (its audit says how many did)."""
    if res.died:
        return res.describe()
    if res.returncode is None:   # ended once it delivered: its audit says how pytest ended
        status = audit.get("exitstatus")
        if status not in (0, 1):
            return f"pytest ended its session with status {status}"
    elif res.returncode not in (0, 1):
        return res.describe()
    if audit.get("selected") is None:
        return (f"{res.describe()} without finishing its session (an exit from inside a test?), "
                "so not every case it was given ran")
    if audit.get("finished") != audit["selected"]:
        return f"ended after {audit.get('finished')} of {audit['selected']} cases"
    if audit.get("foreign_request"):
        return ("judged a request perfloop did not write (its request file was replaced while "
                "the process waited for it)")
    return ""


def processes_for(requested: int) -> int:
    """The rules' judge_processes, at most one per CPU this process may run on: each judge
    process imports torch and pytest and compiles, so more than the CPUs only queue (on the
    2-core CPU machine, 6 processes for 6 candidates took twice the CPU time of 2)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(requested, cpus))


def split(variants: list[dict], processes: int,
          share_cases: bool = True) -> list[tuple[list[dict], tuple | None]]:
    """How the kernel passes share the work: (variants, shard) per process. With at least as
    many variants as processes, each process judges whole variants (a variant's cases share
    its compiles). With fewer, each variant's cases are cut into contiguous shards, one per
    process (cases next to each other differ least and share compiles). Without `share_cases`
    (a kernel with nothing to compile, whose judge is mostly start-up) fewer variants take
    fewer processes instead."""
    width = max(1, min(processes, len(variants)))
    if len(variants) >= processes or not share_cases:
        return [(variants[i::width], None) for i in range(width)]
    out = []
    for i, v in enumerate(variants):
        shards = processes // len(variants) + (i < processes % len(variants))
        out += [([v], (k, shards) if shards > 1 else None) for k in range(shards)]
    return out


@dataclass
class _Passes:
    """What the kernel passes left: per label its output folders, failures and log entries."""

    folders: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)   # label -> why its kernel pass failed it
    entries: dict = field(default_factory=dict)


def judge(tree: Pinned, variants: list[dict], *, root: Path, work: Path, deadline: float,
          stall_s: float, env: dict, processes: int = 1, share_cases: bool = False,
          replay_only: list[dict] | tuple[dict, ...] = (), pool: JudgePool | None = None,
          confinement: Confinement = Confinement(), cache: Path | None = None) -> JudgeResult:
    """Judge the variants: kernel passes side by side (see split) and one reference pass, which
    gives the verdict. `tree`: the run's pinned tree (the judge, its configuration and the
    kernel folder's copy whose tolerances and hooks perfloop.correctness reads); `root`: the
    repository's. `replay_only`: variants (the incumbent and its control) whose cases the
    reference pass records for the timer to replay, as it does for the variants judged, but
    which no kernel pass runs. `pool`: processes started ahead for this judge (start_judges);
    whatever is left of it is killed. `cache`: where the timer keeps each code's compile cache
    (shared_cache)."""
    out, t0 = JudgeResult(), time.monotonic()
    key = _pool_key(tree, env, confinement)
    judged = {v["label"] for v in variants}
    recorded = variants + [v for v in replay_only if v["label"] not in judged]
    referee = _start_referee(tree, recorded, root=root, work=work, env=env,
                             ready=pool.take_referee(key) if pool else None)
    pending = [(group, shard, pool.take(key) if pool else None)
               for group, shard in split(variants, processes, share_cases)]
    if pool:
        pool.discard()
    out.processes = len(pending)
    try:
        passes = _run_passes(tree, pending, out, root=root, work=work, deadline=deadline,
                             stall_s=stall_s, env=env, count=len(variants),
                             confinement=confinement, cache=cache)
        process.kill_strays()  # what kernel code left running ends with its judge
        out.passes_s = round(time.monotonic() - t0, 3)
        verdict = _finish_referee(referee, passes.folders, deadline, stall_s)
    finally:
        referee[1].kill()
    _settle(out, variants, passes, verdict)
    out.wall_s = round(time.monotonic() - t0, 3)
    return out


def _run_passes(tree: Pinned, pending: list, out: JudgeResult, *, count: int,
                **where) -> _Passes:
    """Every kernel pass to its end; a process that cannot stand has each of its variants judged
    again whole in a process of its own (never redone twice)."""
    passes = _Passes()
    cancel = threading.Event()  # Ctrl-C: every judge process is killed, none awaited
    threads = ThreadPoolExecutor(max(1, len(pending)), thread_name_prefix="perfloop-judge")
    shown = _Shown(count, len(pending)) if progress.enabled() else None
    try:
        while pending:
            runs = list(threads.map(lambda job: (job, _kernel_pass(
                tree, job[0], cancel=cancel, shown=shown, shard=job[1], ready=job[2],
                **where)), pending))
            pending = _absorb(runs, passes, out, where["deadline"])
    except BaseException:
        cancel.set()
        raise
    finally:
        threads.shutdown(wait=True)
        if shown:
            shown.bar.close()
    return passes


def _absorb(runs: list, passes: _Passes, out: JudgeResult, deadline: float) -> list:
    """Take in one round of kernel passes; return the jobs to run again."""
    cut: dict[str, set] = {}  # the shards of one variant cut one collection
    for (group, shard, _), (_, _, audit, _) in runs:
        if shard:
            cut.setdefault(group[0]["label"], set()).add(audit.get("collected"))
    redo: dict = {}
    for (group, shard, _), (res, entries, audit, folder) in runs:
        out.imports |= set(audit.get("imports", ()))
        why = _incomplete(res, audit)
        if not why and shard and len(cut[group[0]["label"]]) > 1:
            why = ("its shards collected different cases, or the same in another order "
                   "(parameters from a set?): some would be judged twice, others never")
        if why:
            if (len(group) > 1 or shard) and time.monotonic() < deadline:
                redo.update((v["label"], v) for v in group)
            else:
                out.crashed.update((v["label"], f"judge {why} (log: {res.log})") for v in group)
            continue
        out.detail = f"judge {res.describe()}"
        _record_pass(passes, group, entries, audit, folder)
    for label in redo:  # what a process that could not stand delivered does not count
        passes.folders.pop(label, None)
        passes.failures.pop(label, None)
        passes.entries.pop(label, None)
    return [([v], None, None) for label, v in redo.items() if label not in out.crashed]


def _record_pass(passes: _Passes, group: list, entries: list, audit: dict, folder: Path) -> None:
    labels = {v["label"] for v in group}
    failed = audit.get("failed") or {}
    for v in group:
        label = v["label"]
        passes.folders.setdefault(label, []).append(str(folder))
        mine = [e for e in entries if e["label"] == label]
        passes.entries.setdefault(label, []).extend(mine)
        tests = [t for t, who in failed.items() if who == label or who not in labels]
        if tests:
            passes.failures[label] = f"a test failed in the kernel pass ({tests[0]})"
        bad = [e for e in mine if e.get("passed") is False or e.get("error")]
        if bad and label not in passes.failures:
            passes.failures[label] = (f"case {bad[0].get('case')}: "
                                      f"{bad[0].get('error') or 'the judge logged it as failed'}")


def _start_referee(tree: Pinned, variants: list[dict], *, root: Path, work: Path, env: dict,
                   ready: tuple | None) -> tuple:
    ready = _fresh(ready, _referee_files)
    request, running = ready if ready else (work / f"referee-{nonce()}.json", None)
    _, compare, verdict, cases = _referee_files(request)
    body = json_bytes({"variants": variants_json(variants), "compare": str(compare),
                       "verdict": str(verdict), "cases": str(cases),
                       "contract": contract_of(tree)})
    if running is None:
        write_bytes(request, body)
        running = process.start(_referee_cmd(tree, root, request),
                                log=request.with_suffix(".log"), env=env, cwd=tree.root)
    else:
        running.adopt(progress=[])
        write_bytes(request, body)
    return request, running, digest(body)


def _finish_referee(referee: tuple, folders: dict, deadline: float, stall_s: float) -> dict:
    """Name the output folders to the reference pass, wait for its verdict."""
    request, running, body_digest = referee
    _, compare, verdict, cases = _referee_files(request)
    write_bytes(compare, json_bytes({"labels": folders}))
    res = running.wait(deadline=deadline, stall_s=None, done=verdict.exists)  # (atomic)
    found = _read_json(verdict)
    if res.died or not found:
        return {"error": f"the judge's reference pass {res.describe()} (log: {res.log})"}
    if found.get("request") != body_digest:
        return {"error": "the reference pass judged a request perfloop did not write"}
    if found.get("reference_failures"):
        test, why = next(iter(found["reference_failures"].items()))
        return {"error": f"the judge failed in its reference pass, which runs no kernel code "
                         f"({test}: {why}); the judge must compute expected values from its "
                         "own inputs, not from the kernel module"}
    if isinstance(found.get("replay"), dict):  # (the file is the one this request named)
        found["replay"] = {**found["replay"], "path": str(cases)}
    return found


def _settle(out: JudgeResult, variants: list[dict], passes: _Passes, verdict: dict) -> None:
    """The verdict per label: the reference pass's, failed by anything its kernel pass saw."""
    if verdict.get("error"):
        for v in variants:
            out.crashed.setdefault(v["label"], verdict["error"])
        return
    out.imports |= set(verdict.get("imports", ()))
    out.replay = verdict.get("replay")
    for v in variants:
        label = v["label"]
        if label in out.crashed:
            continue
        judged = verdict.get("labels", {}).get(label, {"passed": False, "cases": []})
        out.cases[label] = judged["cases"]
        out.passed[label] = bool(judged["passed"]) and label not in passes.failures
        if label in passes.failures:
            out.doubted[label] = passes.failures[label]


class _Shown:
    """The judge's progress line: the cases its kernel passes delivered, from their logs."""

    def __init__(self, candidates: int, processes: int):
        self.what = f"{candidates} candidate{'s' * (candidates != 1)} in {processes} " \
                    f"process{'es' * (processes != 1)}"
        self.bar = progress.task("judge", self.what)
        self.done = self.failed = 0
        self.lock = threading.Lock()

    def watch(self, log: Path):
        tail = progress.Tail(log)

        def seen():
            with self.lock:
                for line in tail.lines():
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    self.done += 1
                    self.failed += bool(entry.get("error")) or entry.get("passed") is False
                self.bar.update(f"{self.what}: {self.done} cases run"
                                + (f", {self.failed} failed" if self.failed else ""))

        return seen
