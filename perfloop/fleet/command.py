"""`perfloop run` on a fleet: the kernels named (or --all), each in a lane of its own
(perfloop.fleet.lanes), every experiment measured on the fleet's workers
(perfloop.fleet.driver)."""

from __future__ import annotations

from pathlib import Path

from perfloop.core.errors import UserError
from perfloop.fleet import cluster, driver, lanes, worker
from perfloop.store import gitops


def execute(args, kernels: list[str], flags: dict, run_one) -> dict:
    """Run every kernel's loop at once; `run_one(session, args, say=...)` is `perfloop run`'s
    own for one kernel (its locks taken); `flags`, its settings' flags. The answer: each
    kernel's, and the fleet's workers."""
    cluster.require_dask()
    repo = gitops.find_repo(Path.cwd())
    root = gitops.root(repo)
    if Path(repo.git_dir).resolve() != Path(repo.common_dir).resolve():
        raise UserError(f"{root} is a linked worktree: run the fleet from the main one")
    names = kernels or lanes.every_kernel(root)
    with lanes.hold(repo):
        sessions = lanes.sessions(names, root, repo, args.playbook, flags,
                                  plain=args.start == "plain", new=args.new)
        fleet = cluster.start(gpus=args.gpus, workers=args.workers, scheduler=args.scheduler)
        try:
            needs = [s.spec.name for s in sessions if s.spec.requires_gpu]
            if needs and not fleet.gpu:
                raise UserError(f"kernel {needs[0]} is timed on a GPU, and --workers starts "
                                "workers without one: use --gpus (or --scheduler)")
            remote = driver.Remote(fleet, worker.measure_task, lanes=len(sessions))

            def body(s):
                s.fleet = remote
                return run_one(s, args, say=None if args.json else f"{s.spec.name}: ")

            answers = lanes.run(sessions, remote, body)
        finally:
            fleet.close()
    codes = [a.get("exit_code", 0) for a in answers.values()]
    code = 130 if 130 in codes else max(codes, default=0)
    workers = [{"address": address, **ident} for address, ident in fleet.workers.items()]
    return {"kernels": answers, "workers": workers, "exit_code": code,
            **({"failure": "; ".join(f"{k}: {a['error']}" for k, a in answers.items()
                                     if a.get("error"))} if code else {})}


def render(r: dict, render_one) -> str:
    """The fleet's answer in words, each kernel's by `render_one` (`perfloop run`'s)."""
    lines = [f"fleet of {len(r['workers'])} worker{'s' * (len(r['workers']) != 1)}: "
             + ", ".join(f"{w['host']}:{(w['gpus'] or ['cpu'])[0][:12]}" for w in r["workers"])]
    for name, answer in r["kernels"].items():
        if answer.get("status") is not None:
            lines += [f"{name}: {line}" for line in render_one(answer).splitlines()]
        else:
            lines.append(f"{name}: {answer.get('error') or answer.get('stop_reason')}")
    return "\n".join(lines)
