"""The judge's reference pass: `pytest JUDGE -p perfloop.referee.judge_plugin
--perfloop-reference FILE`, in a process that never imports kernel code.

It runs the same judge over the same cases as the kernel passes, but perfloop.correctness
gives it a stand-in for every kernel module and records, for each case, the expected value the
judge computes from its own inputs (perfloop.contract.judging). When its session ends it waits for
perfloop to name the kernel passes' output folders, reads each delivered output as data
(torch.load with weights_only: tensors, lists and numbers, never code), compares it with the
expected value within the case's tolerance, and writes the verdict. A case with no output, or
an output that differs, fails its variant; only this process says that a variant passed. It
also writes the cases the timer can replay where no pytest runs (perfloop.contract.judge_replay).
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path

import pytest

from perfloop.contract import judge_replay, judging, outputs
from perfloop.core import plainfile
from perfloop.core.atomic import digest, write_bytes, write_json

REQUEST_DIGEST = ""
READ_AT = 0.0        # (monotonic) when the request was read: the verdict says where time went
FAILED: dict = {}   # test id -> its first error line: the judge itself failed without kernel code
WAIT_S = 3600        # for the outputs, after the expected values are computed


def pytest_addoption(parser):
    parser.addoption("--perfloop-reference", default=None,
                     help="perfloop's reference-pass request (JSON)")


def pytest_configure(config):
    global REQUEST_DIGEST, READ_AT
    path = config.getoption("--perfloop-reference")
    if path:
        from perfloop.isolation.lifeline import guard_parent, wait_for_task
        from perfloop.isolation.spawn import set_dumpable

        guard_parent()
        set_dumpable(False)   # (the kernel passes beside it run kernel code)
        if not Path(path).exists() and not wait_for_task(Path(path)):
            pytest.exit("perfloop: no reference request came", returncode=3)
        raw = Path(path).read_bytes()
        judging.REQUEST, REQUEST_DIGEST = json.loads(raw), digest(raw)
        judging.MODE = judging.REFERENCE
        READ_AT = time.monotonic()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if judging.REQUEST and report.failed:
        lines = (report.longreprtext or "").strip().splitlines()
        FAILED[item.nodeid] = (lines[-1] if lines else "")[:300]


def pytest_sessionfinish(session, exitstatus):
    request = judging.REQUEST
    if not request:
        return
    marks = {"expected": time.monotonic()}
    replay = _write_cases(request)  # (while the kernel passes still run)
    marks["cases_written"] = time.monotonic()
    asked = _wait_for(Path(request["compare"]))
    marks["asked"] = time.monotonic()
    verdict: dict = {"request": REQUEST_DIGEST, "reference_failures": FAILED,
               "expected": len(judging.ORDER), "labels": {},
               **({"replay": replay} if replay else {})}
    if asked is not None:
        from perfloop.isolation.imports import imported_files

        verdict["imports"] = imported_files()
        marks["imports_listed"] = time.monotonic()
        with _one_thread():
            for label, folders in asked["labels"].items():
                verdict["labels"][label] = judge_label(label, [Path(f) for f in folders])
        marks["compared"] = time.monotonic()
    else:
        verdict["error"] = "no comparison was asked for"
    # seconds from reading the request to each mark (where a judge's time goes)
    verdict["marks_s"] = {k: round(t - READ_AT, 3) for k, t in marks.items()}
    write_json(Path(request["verdict"]), verdict)


@contextlib.contextmanager
def _one_thread():
    """torch's CPU ops on one thread while comparing: the comparison runs while the timer's
    launchers and the warmers compile, and a pool of a thread per core then waited on its
    busy threads (on an H100 host a SwiGLU step's 16 small cases took 2.2-3.5 s to compare,
    its baseline's 0.1 s; on one thread 0.54-0.59 s)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _write_cases(request: dict) -> dict | None:
    """The judge's replayable cases, for the timer (perfloop.contract.judge_replay): the file's
    digest travels in the verdict, so the timer reads only what this process wrote."""
    if not request.get("cases"):
        return None
    data, summary = judge_replay.case_file(judging.EXPECTED, judging.ORDER)
    write_bytes(Path(request["cases"]), data)
    return {**summary, "digest": digest(data)}


def _wait_for(path: Path) -> dict | None:
    until = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > until:
            return None
        time.sleep(0.01)
    return json.loads(path.read_text())


def judge_label(label: str, folders: list[Path]) -> dict:
    """Every expected case of `label` against what its kernel passes delivered."""
    delivered: dict = {}
    for folder in folders:
        for entry in _read_outputs(folder):
            if entry.get("label") == label:
                delivered.setdefault(entry.get("case"), []).append(entry)
    cases = []
    for key in [k for k in judging.ORDER if k[0] == label]:
        want = judging.EXPECTED[key]
        got = delivered.get(key[1]) or [{"error": "no output was delivered for this case"}]
        cases.append(_worst(key[1], [_one(entry, want) for entry in got]))
    return {"passed": bool(cases) and all(c["passed"] for c in cases), "cases": cases}


def _read_outputs(folder: Path) -> list[dict]:
    import torch

    out = []
    for path in sorted(folder.glob("*.pt")):
        try:
            entry = torch.load(io.BytesIO(plainfile.read_bytes(path)), map_location="cpu",
                               weights_only=True)
        except Exception as exc:  # a file that is not plain data is no output
            out.append({"label": None, "error": f"{path.name}: unreadable ({type(exc).__name__})"})
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _one(entry: dict, want: dict) -> dict:
    if entry.get("error"):
        return {"passed": False, "error": str(entry["error"])[:300]}
    return outputs.compare(entry.get("output"), want["expected"], {}, "", fixed=want["tolerance"])


def _worst(case: str, results: list[dict]) -> dict:
    bad = [r for r in results if not r["passed"]]
    return {"case": case, **(bad[0] if bad else results[0])}
