"""One kernel's run: where its files live, its persisted state, and the checks that guard
the user's work before anything is written."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from perfloop import gitops, kernel, playbook, records, table
from perfloop.atomic import write_json
from perfloop.errors import NeedsGPU, UserError

STATE_SCHEMA = 1


@dataclass
class State:
    kernel: str
    folder: str               # the kernel folder, relative to the repository root
    branch: str
    base_commit: str          # where the run branched off
    incumbent: str            # the commit every candidate is compared against
    kernel_class: str = ""
    intensity: float | None = None
    stopped: str | None = None
    in_flight: dict | None = None
    started_at: float = field(default_factory=time.time)
    schema: int = STATE_SCHEMA


def require_gpu() -> None:
    if not Path("/dev/nvidiactl").exists() and shutil.which("nvidia-smi") is None:
        raise NeedsGPU("timing needs an NVIDIA GPU and none was found on this machine "
                       "(`perfloop check` compiles every variant without one)")
    import torch

    if not torch.cuda.is_available():
        raise NeedsGPU("timing needs an NVIDIA GPU, and PyTorch sees none "
                       f"(torch {torch.__version__}, CUDA {torch.version.cuda})")


class Session:
    def __init__(self, kernel_arg: str, playbook_dir: str | None = None):
        folder = kernel.find_folder(kernel_arg, gitops.cwd_root())
        self.repo = gitops.open_repo(folder)
        self.root = gitops.root(self.repo)
        self.spec = kernel.load_spec(folder, self.root)
        self.folder_rel = gitops.rel(self.repo, folder)
        self.playbook = playbook.load(playbook.resolve_dir(playbook_dir, self.root))
        self.sandbox = self.root / "sandbox" / self.spec.name
        self.table_path = self.sandbox / "perf_results.md"
        self.records_path = self.sandbox / "experiments.jsonl"
        self.state_path = self.sandbox / "state.json"
        self.work = self.sandbox / "work"
        self.ceilings_cache = self.root / "sandbox" / "device_ceilings.json"
        self._state: State | None = None

    # ---- state and records -------------------------------------------------------------
    @property
    def state(self) -> State:
        """The run's state; a clear error when this kernel has no run yet."""
        if self._state is None:
            self._state = self.load_state()
            if self._state is None:
                raise UserError(f"no run of '{self.spec.name}' yet: start one with "
                                f"`perfloop init --kernel {self.spec.name}` or `perfloop run`")
        return self._state

    def require_run(self) -> State:
        return self.state

    def begin(self, state: State) -> None:
        """A new run: its state becomes this session's and is saved."""
        self._state = state
        self.sandbox.mkdir(parents=True, exist_ok=True)
        self.save_state()

    def load_state(self) -> State | None:
        if not self.state_path.exists():
            return None
        try:
            raw = json.loads(self.state_path.read_text())
            if raw.get("schema") != STATE_SCHEMA:
                raise ValueError(f"schema {raw.get('schema')}")
            return State(**raw)
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"{self.state_path} is corrupted ({exc.__class__.__name__}); "
                            "restore it or move it aside") from None

    def save_state(self) -> None:
        write_json(self.state_path, asdict(self.state))

    def records(self) -> list[dict]:
        return records.load(self.records_path)

    # ---- guards ------------------------------------------------------------------------
    def ensure_sandbox_ignored(self) -> None:
        """Keep sandbox/ out of git without touching a tracked file (.git/info/exclude)."""
        probe = "sandbox/" + self.spec.name + "/perf_results.md"
        if not self.repo.ignored(probe):
            exclude = Path(self.repo.git_dir) / "info" / "exclude"
            exclude.parent.mkdir(parents=True, exist_ok=True)
            with open(exclude, "a", encoding="utf-8") as f:
                f.write("\n/sandbox/\n")

    def changes_outside_folder(self) -> list[str]:
        return [p for p in gitops.status_paths(self.repo)
                if not gitops.inside(p, self.folder_rel)]

    def changes_inside_folder(self) -> list[str]:
        return [p for p in gitops.status_paths(self.repo, untracked=True)
                if gitops.inside(p, self.folder_rel)]

    def require_no_outside_changes(self) -> None:
        outside = self.changes_outside_folder()
        if outside:
            raise UserError(f"refused: uncommitted changes outside the kernel folder "
                            f"{self.folder_rel}/ ({gitops.listing(outside)}); perfloop judges "
                            "only edits inside it and has left everything as it was")

    def require_on_branch(self) -> None:
        branch = gitops.current_branch(self.repo)
        if branch != self.state.branch:
            raise UserError(f"the run of '{self.spec.name}' lives on branch {self.state.branch}, "
                            f"but {branch} is checked out; `git checkout {self.state.branch}`")
        if gitops.head(self.repo) != self.state.incumbent and not self.state.in_flight:
            raise UserError(f"branch {self.state.branch} has moved off the incumbent "
                            f"{self.state.incumbent[:12]}; perfloop will not guess which "
                            "commit to compare against")

    def check_records_match_table(self) -> None:
        recs, rows = self.records(), table.read_rows(self.table_path)
        if len(rows) > len(recs):
            raise UserError(f"{self.table_path} has {len(rows)} rows but the record has "
                            f"{len(recs)} experiments; one of them was edited by hand")

    # ---- derived views -----------------------------------------------------------------
    def export_commit(self, sha: str) -> Path:
        return gitops.export_folder(self.repo, sha, self.folder_rel,
                                    self.sandbox / "trees" / sha[:12])

    def ref_name(self, iteration: int, what: str = "iter") -> str:
        return f"{gitops.REF_PREFIX}/{self.state.branch}/{what}-{iteration:02d}"
