"""Profiler evidence for the incumbent: Nsight Compute (ncu) around one warm launch at the
headline shape, recorded in sandbox/<kernel>/profile.json (the ncu version, the command, every
profiled kernel's raw values, and the metrics `next` ranks by). Writes nothing else but its
logs under sandbox/<kernel>/work/.

The profiled process runs kernel code, so it starts as every such child does
(perfloop.child.bootstrap) and is confined like one: it may write only its own folder, not
ncu's log (which ncu writes from its own process) nor the record; what it left running is
killed when ncu ends."""

from __future__ import annotations

import json
import time
from pathlib import Path

from perfloop.core import plainfile
from perfloop.core.atomic import write_json
from perfloop.core.errors import NeedsGPU
from perfloop.isolation.sandbox import kernel_env
from perfloop.core.vocab import Status
from perfloop.measure import ncu, phases, process
from perfloop.plan import profile_rank
from perfloop.store.session import Session, require_gpu

PROFILE = "profile.json"  # (Session.profile reads it)
SCHEMA = 1
TRIES = 8   # each try may drop the metrics ncu says it does not know (it may name one a try)


class Failed(Exception):
    """ncu ran but gave nothing usable: the command answers with exit status 1."""






def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def profile(s: Session, *, kernel_name: str | None = None, launch_skip: int = 0,
            launch_count: int = 8) -> dict:
    """Profile the incumbent; returns the record written to profile.json."""
    st = s.state
    path = ncu.find()
    if path is None:
        raise NeedsGPU("profiling needs Nsight Compute's command line, `ncu`, on PATH, and "
                       "none was found (it comes with the CUDA toolkit); `next` keeps the "
                       "playbook's ranking")
    if s.spec.requires_gpu:
        require_gpu()
    rules = profile_rank.load(s.playbook_dir)
    started, t0 = time.time(), time.monotonic()
    work = s.work / f"profile-{phases.nonce()}"
    work.mkdir(parents=True, exist_ok=True)
    folder = s.export_commit(st.incumbent, s.copies(work.name))
    contract = s.pinned().contract
    knobs = json.loads(plainfile.read_text(folder / "knobs.json"))
    head = s.spec.headline
    mine = work / f"k-{phases.nonce()}"   # the profiled process's own folder
    mine.mkdir()
    target_spec = mine / "target.json"
    write_json(target_spec, {"contract_folder": str(contract), "folder": str(folder),
                             "knobs": knobs, "shape": head.as_dict(), "warmup": 3,
                             "launches": 1, "out": str(mine / "target-done.json")})
    target = process.python(s.root, "perfloop.child.profile_target", str(target_spec))
    requested, unavailable = rules.requested(), []
    env = kernel_env(phases.child_env(s.playbook_dir, s.playbook.rules.pass_env), mine, s.root,
                     s.confinement(folder, contract), keep_capabilities=True)
    deadline = time.monotonic() + s.playbook.rules.iteration_timeout_s
    for attempt in range(TRIES):
        csv_log = work / f"ncu-{attempt}.csv"
        cmd = ncu.command(path, requested, target, log=str(csv_log), launch_skip=launch_skip,
                          launch_count=launch_count, kernel_name=kernel_name)
        try:
            res = process.run(cmd, timeout_s=deadline - time.monotonic(),
                              log=work / f"ncu-{attempt}.log", env=env, cwd=mine)
        finally:
            process.kill_strays()   # (what the profiled kernel code left running)
        text = _read(csv_log) + "\n" + _read(res.log)
        if ncu.permission_denied(text):
            raise NeedsGPU("ncu may not read this GPU's performance counters "
                           "(ERR_NVGPUCTRPERM: run as an admin user, or load the driver with "
                           f"NVreg_RestrictProfilingToAdminUsers=0); log: {res.log}")
        unknown = ncu.unknown_metrics(text, requested)
        if not unknown or len(unknown) == len(requested) or res.died:
            break
        unavailable += unknown
        requested = [m for m in requested if m not in unknown]
    kernels = ncu.parse(_read(csv_log) + "\n" + _read(res.log))
    main = ncu.main_kernel(kernels)
    if main is None:
        why = (ncu.errors(text) or [f"ncu {res.describe()}"])[0]
        raise Failed(f"ncu profiled no kernel ({why[:200]}); its log: {res.log}")
    made = next((r for r in reversed(s.records()) if r.commit == st.incumbent
                 and r.status == Status.KEEP), None)
    record = {"schema": SCHEMA, "kernel": s.spec.name, "commit": st.incumbent,
              "iteration": made.iteration if made else None, "knobs": knobs,
              "shape": head.as_dict(),
              "ncu": {"path": path, "version": ncu.version(path)}, "command": cmd,
              "requested": requested, "unavailable": unavailable, "kernels": kernels,
              "kernel_name": main["name"], "metrics": ncu.pick(main, rules.metrics),
              "log": str(res.log), "started_at": started, "finished_at": time.time(),
              "wall_s": phases.elapsed(t0)}
    write_json(s.sandbox / PROFILE, record)
    return record
