"""The driver's side of the fleet: an experiment's measurement sent to the workers as tasks
(perfloop.fleet.task), its candidates across as many GPUs as are free for its kernel, a lost
worker's task run again on another (named in the record, never the candidate's crash), and
Ctrl-C passed on to every worker's children."""

from __future__ import annotations

import threading
import time

from perfloop.core.errors import UserError
from perfloop.fleet import cluster, host
from perfloop.fleet import task as tasks
from perfloop.measure.trial import Measured, Plan
from perfloop.store import pinned

RUNS = 3            # a task's runs, a lost worker's included
WAIT_TICK_S = 0.25  # how often a waiting lane looks whether the fleet is stopping


class Stopping(KeyboardInterrupt):
    """The fleet was stopped (Ctrl-C, SIGTERM) while this lane waited for it."""


class Remote:
    """What a kernel's Session measures with when it runs in a fleet (perfloop.run.experiment):
    its experiments go to the workers; it shares them with the other lanes."""

    def __init__(self, fleet, measure=None, lanes: int = 1):
        """`fleet`: perfloop.fleet.cluster.Fleet; `measure`: what a worker does with a task
        (perfloop.fleet.worker.measure_task)."""
        self.fleet, self.measure_fn = fleet, measure
        self.lanes = max(1, lanes)
        self.stopping = threading.Event()
        self._futures: set = set()
        self._lock = threading.Lock()

    # ---- one experiment -------------------------------------------------------------------
    def width(self) -> int:
        """The workers one experiment may spread its candidates over."""
        return max(1, len(self.fleet.workers) // self.lanes)

    def measure(self, s, t, plan: Plan) -> Measured:
        """Measure the trial `t`'s plan on the fleet, as perfloop.measure.measurement would
        here."""
        files = {INC: t.exported[INC] for INC in (plan.incumbent["label"], plan.control["label"])}
        files.update({v["label"]: t.exported[v["label"]] for v in plan.candidates})
        tree_files, ini = pinned.files_for(s.repo, s.state.base_commit, s.folder_rel,
                                           s.state.judge)
        rules = plan.rules
        jobs = tasks.tasks(plan, files=files, kernel=s.spec.name, folder_rel=s.folder_rel,
                           pinned_files=tree_files, ini=ini, judge_rel=s.state.judge,
                           deadline_s=max(1.0, plan.deadline - time.monotonic()),
                           stop=self.fleet.stop, width=self.width(),
                           pass_env=rules.pass_env, confine=rules.confine)
        started = time.monotonic()
        results, lost = self.run(jobs)
        merged, select = tasks.merge(results, plan.choosing, rules.decision.regression_tolerance)
        fleet = {"tasks": len(jobs), "where": [got.where for got in results], "lost": lost}
        if select:
            at = [got.best for got in results].index(merged.best)
            [final], more = self.run([tasks.selection(jobs[at], merged.best)],
                                     near=(results[at].where or {}).get("worker"))
            lost += more
            merged.timing, merged.passes = final.timing, final.passes
            merged.best = final.best if final.outcome.get(merged.best, ("ok",))[0] == "ok" \
                else None
            if final.outcome.get(merged.best):
                merged.outcome[merged.best] = final.outcome[merged.best]
            fleet["selection"] = final.where
        merged.phase_s["fleet"] = round(time.monotonic() - started, 3)
        merged.where = fleet
        return merged

    # ---- tasks on the workers -------------------------------------------------------------
    def run(self, jobs: list, fn=None, near: str | None = None
            ) -> tuple[list[Measured], list[dict]]:
        """Every task to its result, in order, by `fn` on a worker (default: measuring it); a
        task whose worker was lost runs again on another (RUNS in all). `near`: the worker
        to run them on while it can. Returns the results and the workers lost."""
        from distributed import KilledWorker

        fn = fn or self.measure_fn
        client, lost = self.fleet.client, []
        resources = {"GPU": 1} if self.fleet.gpu else None
        pending = {i: 0 for i in range(len(jobs))}
        results: dict = {}
        while pending:
            futures = {i: self._submit(client, fn, jobs[i], resources, near) for i in pending}
            for i, future in futures.items():
                try:
                    results[i] = self._wait(future)
                    pending.pop(i)
                except KilledWorker as exc:
                    who = getattr(getattr(exc, "last_worker", None), "address", None)
                    lost.append({"task": jobs[i].key, "worker": who or str(exc)[:200]})
                    pending[i] += 1
                    if pending[i] >= RUNS:
                        raise UserError(f"the fleet lost {RUNS} workers running "
                                        f"{jobs[i].key}: {lost[-1]['worker']} last; nothing of "
                                        "it was recorded, `perfloop run --resume` runs it "
                                        "again") from None
                finally:
                    with self._lock:
                        self._futures.discard(future)
        return [results[i] for i in range(len(jobs))], lost

    def _submit(self, client, fn, job, resources, near=None):
        future = client.submit(host.watched, fn, job, self.fleet.stop,
                               key=f"{job.key}-{time.monotonic_ns()}", pure=False,
                               resources=resources, workers=[near] if near else None,
                               allow_other_workers=bool(near))
        with self._lock:
            self._futures.add(future)
        return future

    def _wait(self, future):
        """The future's result; a lane waiting while the fleet stops is interrupted."""
        from distributed import TimeoutError as DaskTimeout
        from distributed.client import FutureCancelledError

        while True:
            if self.stopping.is_set():
                raise Stopping()
            try:
                return future.result(timeout=WAIT_TICK_S)
            except (DaskTimeout, TimeoutError):
                continue
            except FutureCancelledError:
                if self.stopping.is_set():   # (cancelled by stop())
                    raise Stopping() from None
                raise

    def stop(self) -> None:
        """Stop every worker's children and every task of this fleet (Ctrl-C, SIGTERM)."""
        self.stopping.set()
        cluster.quiet()
        try:
            from distributed import Event

            Event(self.fleet.stop, client=self.fleet.client).set()
            with self._lock:
                futures = list(self._futures)
            if futures:
                self.fleet.client.cancel(futures)
        except Exception:   # (a scheduler already gone: its workers' children went with it)
            pass
