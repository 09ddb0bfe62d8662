import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTED = Path(__file__).resolve().parent / "scripted"
LEGACY = Path(__file__).resolve().parent / "legacy" / "experiments.jsonl"   # written before the types

# How long a step that takes a second or two on an idle machine may take before a test calls it
# hung. Tests wait for events (a file, an exit, a line), never for a fixed time, so this only
# bounds a wait that would otherwise be forever: on the 2-core CPU machine at load 6-7 the
# default run took four times as long as idle, and a bound set for idle timing failed there.
HANG_S = 300.0


def eventually(condition, what: str, within_s: float = HANG_S, every_s: float = 0.02):
    """Poll `condition()` until it is true; fail naming `what` if it is not within `within_s`."""
    import time

    until = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > until:
            pytest.fail(f"{what}: not within {within_s:.0f} s")
        time.sleep(every_s)


class FakeTime:
    """A monotonic clock that moves only when slept on or advanced: a test of a deadline or a
    choice by time then depends on no machine's speed. Stands in for a module's `time`."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)

    advance = sleep


def _has_gpu() -> bool:
    try:
        import cuda.tile  # noqa: F401
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with cuTile")
    for item in items:
        if item.get_closest_marker("gpu"):  # the marker, not a keyword: a param id may be "gpu"
            item.add_marker(skip)


@pytest.fixture(scope="session")
def matmul():
    """The shipped matmul kernel.py, imported on the CPU (needs cuda.tile, not a GPU): its
    tolerance, inputs and launch plan are plain Python."""
    pytest.importorskip("cuda.tile")
    from perfloop.contract.kernel import import_module

    return import_module(ROOT / "kernels" / "matmul", "matmul_cpu")


def judge_of(kernel: str) -> Path:
    """A shipped kernel's judge, where its kernel.toml names it."""
    manifest = tomllib.loads((ROOT / "kernels" / kernel / "kernel.toml").read_text())
    return ROOT / manifest["judge"]


def pythonpath() -> str:
    """perfloop's checkout first, then whatever PYTHONPATH already holds (on the GPU machine,
    where cuTile itself comes from)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


class Scratch:
    """A throwaway git repository holding the scripted kernel, its judge and a playbook."""

    def __init__(self, path: Path):
        self.path = path
        self.kernel = path / "kernels" / "scripted"
        shutil.copytree(SCRIPTED / "kernel", self.kernel)
        (path / "tests").mkdir()
        shutil.copy(SCRIPTED / "judge_scripted.py", path / "tests" / "judge_scripted.py")
        shutil.copytree(ROOT / "playbook", path / "playbook")
        (path / "README.md").write_text("scratch\n")
        self.rules(pass_env='["SCRIPTED_*", "FAKE_NCU_*"]')   # (the test kernel's, ncu's)
        git(path, "init", "-q", "-b", "main")
        git(path, "config", "user.email", "t@example.com")
        git(path, "config", "user.name", "t")
        self.commit_all("initial")

    @classmethod
    def copy_of(cls, template: Path, path: Path) -> "Scratch":
        """A copy of another scratch repository (its git history, branch and sandbox/)."""
        shutil.copytree(template, path, symlinks=True)
        self = cls.__new__(cls)
        self.path, self.kernel = path, path / "kernels" / "scripted"
        return self

    @classmethod
    def of_shipped(cls, path: Path, *names: str) -> "Scratch":
        """A repository holding shipped kernels (without their results), their judges and the
        playbook, as a user's would; `kernel` is the first one's folder."""
        self = cls.__new__(cls)
        self.path, self.kernel = path, path / "kernels" / names[0]
        for name in names:
            shutil.copytree(ROOT / "kernels" / name, path / "kernels" / name,
                            ignore=shutil.ignore_patterns("RESULTS.md", "perf_results.md",
                                                          "__pycache__", "bench_*.py"))
            judges = judge_of(name).parent   # the judge's folder: its helpers beside it
            shutil.copytree(judges, path / judges.relative_to(ROOT), dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "playbook", path / "playbook")
        git(path, "init", "-q", "-b", "main")
        git(path, "config", "user.email", "t@example.com")
        git(path, "config", "user.name", "t")
        self.commit_all("shipped kernels")
        return self

    def tree(self, judge: Path | str = "tests/judge_scripted.py"):
        """The pinned tree a run would judge with (perfloop.store.pinned), of the working tree
        as it is: a test's judge need not be committed."""
        from perfloop.store import gitops, pinned, snapshot

        repo = gitops.open_repo(self.path)
        judge_rel = (Path(judge).relative_to(self.path) if Path(judge).is_absolute()
                     else Path(judge)).as_posix()
        folder_rel = self.kernel.relative_to(self.path).as_posix()
        files = {pinned.INI: (snapshot.REGULAR, b"[pytest]\n")}
        for folder in (Path(judge_rel).parent.as_posix(), folder_rel):
            files.update({f"{folder}/{p}": v
                          for p, v in snapshot.from_worktree(repo, self.path, folder).items()})
        return pinned.written(files, ini=pinned.INI, judge_rel=judge_rel, folder_rel=folder_rel,
                              under=self.path / "sandbox" / "pins")

    def commit_all(self, message: str) -> None:
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "-m", message)

    def script(self, effects: list, **extra) -> None:
        data = json.loads((self.kernel / "script.json").read_text())
        data.update(effects=effects, **extra)
        (self.kernel / "script.json").write_text(json.dumps(data))

    def rules(self, **changes: str) -> None:
        """Replace `key = value` lines in playbook/rules.toml."""
        path = self.path / "playbook" / "rules.toml"
        lines = path.read_text().splitlines()
        for key, value in changes.items():
            lines = [f"{key} = {value}" if line.split("=")[0].strip() == key else line
                     for line in lines]
        path.write_text("\n".join(lines) + "\n")

    def add_optimization(self, opt_id: str, knob: str, values: list, priority: int = 0) -> None:
        """Append a catalog entry (e.g. one that injects a fault through the 'mode' knob)."""
        with open(self.path / "playbook" / "catalog.toml", "a") as f:
            f.write(f'\n[[optimization]]\nid = "{opt_id}"\ntitle = "{opt_id}"\nfamily = "{opt_id}"\n'
                    f'knob = "{knob}"\nvalues = {json.dumps(values)}\n'
                    f'applies_to = ["memory-bound"]\npriority = {{ memory-bound = {priority} }}\n')

    def cli(self, *args: str, env: dict | None = None, timeout: float = 600):
        """Run `python -m perfloop ... --json` here; returns (exit code, JSON answer, stderr)."""
        proc = subprocess.run([sys.executable, "-m", "perfloop", *args, "--json"],
                              cwd=self.path, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": pythonpath(), **(env or {})})
        lines = proc.stdout.strip().splitlines()
        answer = json.loads(lines[-1]) if lines else None
        return proc.returncode, answer, proc.stderr

    def head(self) -> str:
        return git(self.path, "rev-parse", "HEAD")

    def branch(self) -> str:
        return git(self.path, "rev-parse", "--abbrev-ref", "HEAD")

    def table(self) -> str:
        return (self.path / "sandbox" / "scripted" / "perf_results.md").read_text()

    def all_records(self) -> list[dict]:
        path = self.path / "sandbox" / "scripted" / "experiments.jsonl"
        if not path.exists():  # (no run yet)
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def records(self) -> list[dict]:
        """The experiments (one per table row)."""
        return [r for r in self.all_records() if r["kind"] != "confirmation"]

    def confirmations(self) -> list[dict]:
        return [r for r in self.all_records() if r["kind"] == "confirmation"]

    def snapshot(self) -> dict:
        """Everything a bad command must leave unchanged."""
        return {"status": git(self.path, "status", "--porcelain", "--untracked-files=all"),
                "refs": git(self.path, "for-each-ref", "--format=%(refname) %(objectname)"),
                "head": git(self.path, "symbolic-ref", "-q", "HEAD") if self.branch() != "HEAD"
                else self.head()}


@pytest.fixture
def scratch(tmp_path) -> Scratch:
    return Scratch(tmp_path / "repo")


@pytest.fixture(scope="session")
def initialized(tmp_path_factory) -> Path:
    """A scratch repository right after a plain `perfloop init --kernel scripted`, made once:
    an init runs a judge and a timing child, and many tests start from one."""
    repo = Scratch(tmp_path_factory.mktemp("initialized") / "repo")
    code, _, err = repo.cli("init", "--kernel", "scripted")
    assert code == 0, err
    return repo.path


@pytest.fixture
def started(tmp_path, initialized) -> Scratch:
    """A scratch repository of its own, as `perfloop init --kernel scripted` leaves it."""
    return Scratch.copy_of(initialized, tmp_path / "repo")
