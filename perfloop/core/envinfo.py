"""What a reviewer needs to reproduce a measurement: GPU, driver, clocks, versions."""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata


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


# nvidia-smi field -> key in the environment record
SMI_FIELDS = {"driver_version": "driver", "clocks.sm": "clock_sm", "clocks.max.sm": "clock_sm_max",
              "clocks.mem": "clock_mem", "clocks.max.mem": "clock_mem_max",
              "clocks.applications.graphics": "clock_sm_app", "temperature.gpu": "temperature",
              "power.draw": "power", "power.limit": "power_limit"}


def capture(gpu: bool, device: int | None = None) -> dict:
    """Versions come from package metadata, so nothing heavy is imported without a GPU. The GPU
    facts are those of the device in use (by PCI bus id), not of physical GPU 0."""
    env = {"python": platform.python_version(), "host": platform.node(),
           "torch": _version("torch"), "cutile": _version("cuda-tile")}
    if gpu:
        env["tileiras"] = _tileiras_version()
        import torch
        index = torch.cuda.current_device() if device is None else device
        props = torch.cuda.get_device_properties(index)
        bus = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
        env.update(gpu_name=props.name, gpu_index=index, pci_bus_id=bus,
                   sm=f"sm_{props.major}{props.minor}", sm_count=props.multi_processor_count,
                   l2_bytes=props.L2_cache_size)
        values = _run(["nvidia-smi", f"--id={bus}", f"--query-gpu={','.join(SMI_FIELDS)}",
                       "--format=csv,noheader,nounits"])
        fields = [v.strip() for v in values.splitlines()[0].split(",")] if values else []
        if len(fields) == len(SMI_FIELDS):
            env.update(zip(SMI_FIELDS.values(), fields))
    return env

