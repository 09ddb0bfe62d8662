"""What a reviewer needs to reproduce a measurement: GPU, driver, clocks, versions."""

from __future__ import annotations

import functools
import platform
from importlib import metadata
import subprocess


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


@functools.cache
def _tileiras_version() -> str:
    try:
        from cuda.tile._compile import _find_compiler_bin  # private, hence the guard
        out = _run([_find_compiler_bin().path, "--version"])
    except Exception:
        return ""
    return next((line for line in out.splitlines() if "release" in line), out[-80:])


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def capture(gpu: bool) -> dict:
    """Versions come from package metadata, so nothing heavy is imported without a GPU."""
    env = {"python": platform.python_version(), "host": platform.node(),
           "torch": _version("torch"), "cutile": _version("cuda-tile")}
    if gpu:
        env["tileiras"] = _tileiras_version()
        import torch
        props = torch.cuda.get_device_properties(0)
        env.update(gpu_name=props.name, sm=f"sm_{props.major}{props.minor}",
                   sm_count=props.multi_processor_count, l2_bytes=props.L2_cache_size)
        query = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw"
        values = _run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"])
        fields = [v.strip() for v in values.splitlines()[0].split(",")] if values else []
        if len(fields) == 6:
            env.update(driver=fields[0], clock_sm=fields[1], clock_sm_max=fields[2],
                       clock_mem=fields[3], temperature=fields[4], power=fields[5])
    return env
