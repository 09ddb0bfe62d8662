"""The fleet's workers, on Dask distributed: one worker process per GPU of this machine, each
seeing only its own (CUDA_VISIBLE_DEVICES, a GPU=1 resource); N worker processes without GPUs
(CPU-timed kernels, tests); or a cluster whose workers were started on each node. Each worker
says at start which machine and which GPU it has: two workers on one GPU (the classic failure
of every engine) are refused, as is a GPU kernel's worker that sees none or several."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field

from perfloop.core.errors import UserError

EXTRA = "pip install -e \".[fleet]\" (Dask distributed)"
# what every GPU worker keeps in its environment: NVLink multicast off (a program that uses
# it can put a host's shared GPUs out of service)
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
CONNECT_S = 20.0
QUIET = {"DASK_LOGGING__DISTRIBUTED": "error"}   # the workers' own chatter off the terminal
# the scheduler's line for a worker lost under a task: the driver names the lost worker itself
# (and after Ctrl-C or SIGTERM every worker goes, which is no error)
LOST_WORKER = "workers died while trying to run it"


class _SaidByTheDriver(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return LOST_WORKER not in record.getMessage()


def quiet() -> None:
    """Dask's loggers off: a fleet closing or stopped (Ctrl-C, SIGTERM) loses its workers and
    comms on purpose, and perfloop says what happened in its own line."""
    manager = logging.Logger.manager
    for name in ["distributed", *[n for n in manager.loggerDict if n.startswith("distributed.")]]:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def require_dask():
    """distributed, or one line saying how to get it."""
    try:
        import distributed
    except ImportError:
        raise UserError(f"the fleet runs on Dask: {EXTRA}; without --gpus, --workers or "
                        "--scheduler perfloop runs one kernel here, as ever") from None
    return distributed


def local_gpus() -> list[str]:
    """This machine's GPUs as CUDA_VISIBLE_DEVICES names them (indices, or what the variable
    already lists)."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if seen is not None:
        return [g.strip() for g in seen.split(",") if g.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip().isdigit()]


def chosen_gpus(spec: str) -> list[str]:
    """--gpus: N (the first N), all, or a list (0,2) of this machine's GPUs."""
    have = local_gpus()
    if spec == "all":
        picked = have
    elif spec.isdigit():
        if int(spec) > len(have):
            raise UserError(f"--gpus {spec}: this machine has {len(have)} GPU"
                            f"{'s' * (len(have) != 1)} ({', '.join(have) or 'none'})")
        picked = have[:int(spec)]
    else:
        picked = [g.strip() for g in spec.split(",") if g.strip()]
        missing = [g for g in picked if g not in have]
        if missing or len(set(picked)) != len(picked):
            raise UserError(f"--gpus {spec}: no GPU {', '.join(missing) or 'twice'} here "
                            f"(this machine's: {', '.join(have) or 'none'})")
    if not picked:
        raise UserError(f"--gpus {spec}: this machine has no GPU that perfloop can see "
                        "(nvidia-smi); --workers N starts workers without GPUs")
    return picked


def cores_for(count: int) -> list[list[int]]:
    """This process's CPUs, dealt out to `count` workers (each its own share where there are
    enough: one worker's compiles never run on another's timing core)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 * count:
        return [[] for _ in range(count)]   # (too few to share out: none pinned)
    share = len(cpus) // count
    return [cpus[i * share:(i + 1) * share] for i in range(count)]


@dataclass
class Fleet:
    """A client of the fleet's scheduler, and what each worker said it is."""

    client: object
    cluster: object | None              # one started here (closed with the fleet)
    workers: dict = field(default_factory=dict)   # address -> identity (perfloop.fleet.host)
    stop: str = ""                      # the Dask event that stops every worker's children
    gpu: bool = True                    # its workers each have one GPU

    def close(self) -> None:
        quiet()
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()


def start(*, gpus: str | None = None, workers: int | None = None,
          scheduler: str | None = None, timeout_s: float = CONNECT_S) -> Fleet:
    """The fleet of --gpus, --workers or --scheduler (one of them), its workers checked."""
    distributed = require_dask()
    import dask

    from perfloop.fleet import host

    stop = f"perfloop-stop-{secrets.token_hex(6)}"
    # a worker lost mid-experiment raises at once: the driver runs it again elsewhere, and
    # says which worker it lost (the scheduler would rerun it silently)
    dask.config.set({"distributed.scheduler.allowed-failures": 0,
                     "distributed.worker.daemon": False,
                     "distributed.admin.system-monitor.gil.enabled": False,
                     "logging.distributed": "error"})
    scheduler_log = logging.getLogger("distributed.scheduler")
    if not any(isinstance(f, _SaidByTheDriver) for f in scheduler_log.filters):
        scheduler_log.addFilter(_SaidByTheDriver())
    cluster = None
    if scheduler:
        try:
            client = distributed.Client(scheduler, timeout=timeout_s)
        except (OSError, TimeoutError, ValueError) as exc:
            raise UserError(f"--scheduler {scheduler}: no scheduler answered in "
                            f"{timeout_s:g} s ({type(exc).__name__}); start one there "
                            "(`dask scheduler`) and its workers (`dask worker "
                            f"{scheduler} --nworkers N --resources GPU=1`)") from None
        client.register_plugin(host.Setup(cores=[]), name="perfloop")
        gpu = None   # (as its workers say: all with one GPU, or all without)
    else:
        names = chosen_gpus(gpus) if gpus else [None] * (workers or 1)
        cores = cores_for(len(names))
        specs = {}
        for i, (name, mine) in enumerate(zip(names, cores)):
            env = {**QUIET, **GPU_ENV, "CUDA_VISIBLE_DEVICES": name} if name is not None \
                else {**QUIET, "CUDA_VISIBLE_DEVICES": ""}
            specs[f"worker-{i}"] = {"cls": distributed.Nanny, "options": {
                "nthreads": 1, "env": env, "silence_logs": logging.ERROR,
                "resources": {"GPU": 1} if name is not None else {},
                "name": f"worker-{i}", "plugins": {host.Setup(cores=mine)}}}
        cluster = distributed.SpecCluster(
            workers=specs, scheduler={"cls": distributed.Scheduler,
                                      "options": {"dashboard": False, "dashboard_address": None,
                                                  "port": 0}},
            silence_logs=logging.ERROR)
        client = distributed.Client(cluster)
        gpu = gpus is not None
    fleet = Fleet(client, cluster, stop=stop)
    try:
        fleet.workers = _identities(client, gpu, timeout_s)
        fleet.gpu = any(ident["gpus"] for ident in fleet.workers.values())
    except BaseException:
        fleet.close()
        raise
    return fleet


def _identities(client, gpu: bool, timeout_s: float = CONNECT_S) -> dict:
    """Each worker's machine and GPU; refuses a worker that sees no GPU or several, and two
    workers that see the same one."""
    from perfloop.fleet import host

    try:
        client.wait_for_workers(1, timeout=timeout_s)
    except TimeoutError:
        raise UserError(f"the fleet's scheduler has no worker after {timeout_s:g} s: start "
                        "them (`dask worker ADDRESS --nworkers N --resources GPU=1`)") from None
    return checked(client.run(host.identity), gpu)


def checked(seen: dict, gpu: bool | None) -> dict:
    """{address: identity} as the workers said, refused where one sees no GPU or several, or
    two see the same one (GPU workers; None: as the first says)."""
    if not seen:
        raise UserError("the fleet has no worker")
    if gpu is None:
        gpu = bool(next(iter(seen.values()))["gpus"])
    if gpu:
        wrong = {a: i for a, i in seen.items() if len(i["gpus"]) != 1}
        if wrong:
            address, ident = next(iter(wrong.items()))
            raise UserError(f"worker {address} on {ident['host']} sees {len(ident['gpus'])} "
                            "GPUs: each worker must see exactly one (start it with its own "
                            "CUDA_VISIBLE_DEVICES, or `dask worker ... --resources GPU=1` "
                            "once per GPU)")
        taken: dict = {}
        for address, ident in seen.items():
            key = (ident["host"], ident["gpus"][0])
            if key in taken:
                raise UserError(f"workers {taken[key]} and {address} both see GPU "
                                f"{ident['gpus'][0]} on {ident['host']}: two timed processes "
                                "never share a GPU; give each worker its own")
            taken[key] = address
    return seen
