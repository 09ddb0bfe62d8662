"""Nsight Compute's command line (`ncu`): the command perfloop runs, and what its output means.

`ncu --csv --metrics a,b,...` prints one row per kernel launch and metric, after a header row:
  "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",
  "Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
(columns vary a little between versions; they are found by name). Values are formatted with
thousands separators ("1,024"). Lines of its own start with ==PROF==, ==WARNING== or ==ERROR==:
  ==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU
            Performance Counters on the target device 0. ...
  ==ERROR== Failed to find metric regex:^name$      (a metric this GPU or version lacks)
Parsing is pure (text in, plain data out), so it is tested without ncu.
"""

from __future__ import annotations

import csv
import re
import shutil
import subprocess

PERMISSION = "ERR_NVGPUCTRPERM"
_UNKNOWN = re.compile(r"Failed to find metric[^A-Za-z_]*(?:regex:)?\^?([A-Za-z0-9_]+(?:\\?\.[A-Za-z0-9_]+)*)")
_VERSION = re.compile(r"Version\s+([0-9][\w.]*)")


def find() -> str | None:
    return shutil.which("ncu")


def version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = _VERSION.search(out.stdout + out.stderr)
    lines = out.stdout.strip().splitlines()
    return found.group(1) if found else (lines[-1] if lines else None)


def command(path: str, metrics: list[str], target: list[str], *, log: str,
            launch_skip: int = 0, launch_count: int = 8, kernel_name: str | None = None) -> list[str]:
    """Profile only between the target's cudaProfilerStart and Stop (its one warm launch):
    every kernel that launch runs, up to `launch_count`, after skipping `launch_skip`. Values
    in base units (ns, not an auto-scaled us or ms)."""
    cmd = [path, "--csv", "--print-units", "base", "--metrics", ",".join(metrics),
           "--target-processes", "all",
           # the clocks the timer measured at: ncu's default locks them to base
           "--clock-control", "none",
           "--profile-from-start", "off", "--launch-skip", str(launch_skip),
           "--launch-count", str(launch_count), "--log-file", log]
    if kernel_name:
        cmd += ["--kernel-name", f"regex:{kernel_name}"]
    return cmd + target


def permission_denied(text: str) -> bool:
    return PERMISSION in text


def unknown_metrics(text: str, requested: list[str]) -> list[str]:
    """The requested metrics that ncu said it could not find."""
    bases = {m.group(1).replace("\\", "") for m in _UNKNOWN.finditer(text)}
    return [name for name in requested if any(name == b or name.startswith(b + ".") for b in bases)]


def errors(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.startswith("==ERROR==")]


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse(text: str) -> list[dict]:
    """[{id, name, block, grid, metrics: {name: {unit, value, raw}}}] per profiled kernel, in
    the order ncu profiled them."""
    kernels: dict = {}
    header = None
    for row in csv.reader(line for line in text.splitlines() if line.startswith('"')):
        if header is None:
            if row and row[0] == "ID" and "Metric Name" in row:
                header = {name: i for i, name in enumerate(row)}
            continue
        if len(row) < len(header) or row[0] == "ID":
            continue
        get = lambda col: row[header[col]] if col in header else None  # noqa: E731
        kernel = kernels.setdefault(get("ID"), {"id": get("ID"), "name": get("Kernel Name"),
                                                "block": get("Block Size"),
                                                "grid": get("Grid Size"), "metrics": {}})
        if get("Metric Name"):
            kernel["metrics"][get("Metric Name")] = {"unit": get("Metric Unit") or "",
                                                     "value": number(get("Metric Value") or ""),
                                                     "raw": get("Metric Value")}
    return list(kernels.values())


NS_PER = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
          "second": 1e9, "s": 1e9}


def main_kernel(kernels: list[dict], duration: str = "gpu__time_duration.sum") -> dict | None:
    """The kernel that took longest (a launch may run several), else the first."""
    if not kernels:
        return None

    def ns(kernel):
        m = kernel["metrics"].get(duration) or {}
        return (m.get("value") or 0) * NS_PER.get(m.get("unit", ""), 1)

    return max(kernels, key=ns)


def pick(kernel: dict, wanted: dict[str, list[str]]) -> dict[str, dict]:
    """{key: {metric, value, unit}}: for each key the first of its candidate metrics that the
    kernel has a number for."""
    out = {}
    for key, names in wanted.items():
        for name in names:
            m = kernel["metrics"].get(name)
            if m and m["value"] is not None:
                out[key] = {"metric": name, "value": m["value"], "unit": m["unit"]}
                break
    return out
