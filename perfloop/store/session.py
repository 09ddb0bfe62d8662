"""One kernel's run: where its files live, its persisted state, what was pinned when it
started, and the checks that guard the user's work and the judge before anything is written."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfloop.contract import kernel, manifest, playbook, settings
from perfloop.core import naming, plainfile
from perfloop.isolation import childlog
from perfloop.core.atomic import write_json
from perfloop.core.errors import CorruptRecord, EnvironmentFailure, NeedsGPU, UserError
from perfloop.core.vocab import Kind, Stop, StopReason
from perfloop.store import gitops, lock, pinned, pins, preflight, records, snapshot, table

if TYPE_CHECKING:
    from perfloop.store.records import Confirmation   # (`records` is a method in Session)

STATE_SCHEMA = 3
# Schema 2 kept a stop as its words alone; it loads unchanged, each stop's reason read from the
# words that rule wrote then (the only place a stop's words are matched).
LEGACY_SCHEMA = 2
LEGACY_STOP_WORDS = (
    (StopReason.MAX_ITERATIONS, "reached the iteration limit ("),
    (StopReason.ROOFLINE, "at the roofline: "),
    (StopReason.NO_IMPROVEMENT, "no improvement in "),
    (StopReason.NOTHING_LEFT, "nothing left to try"),
    (StopReason.BASELINE_FAILED, "the baseline did not pass ("),
)
COPIES = "code"   # in the work folder: the exported code children run, all they may read there
NAME_MAX_BYTES = 100   # the run's branch, cutile-perf-<name>-<date>, and its refs must fit
# what recovery reads of an in-flight marker: key -> (types, required)
FLIGHT_KEYS = {"iteration": ((int,), True), "kind": ((str,), True), "tag": ((str,), False),
               "optimization": ((str,), False), "values": ((list,), False),
               "describe": ((str, type(None)), False), "sampler": ((dict, type(None)), False),
               "commit": ((str, type(None)), False), "message": ((str, type(None)), False),
               "knobs_sha256": ((str, type(None)), False)}


@dataclass
class State:
    kernel: str
    folder: str               # the kernel folder, relative to the repository root
    branch: str               # the run's branch; also its id, never reused in this repository
    base_commit: str          # where the run branched off; the contract is pinned from it
    incumbent: str            # the commit every candidate is compared against
    judge: str = ""           # pinned: the judge's path, relative to the repository root
    judge_sha256: str = ""    # pinned: the judge's content
    manifest: str = ""        # pinned: kernel.toml as committed at base_commit
    perfloop_sha256: str = "" # pinned: perfloop's own source files (pins.perfloop_digest)
    rules: dict = field(default_factory=dict)   # pinned: the rules in force (rules.toml's,
                                                # with kernel.toml's [rules] and the flags)
    overrides: dict = field(default_factory=dict)  # the flags' settings in those rules
    kernel_class: str = ""
    intensity: float | None = None
    class_basis: str = ""     # how the class was read: against the device's ridge, or fixed bounds
    stop: Stop | None = None          # why the run finished (a stop rule), or None
    interrupted: Stop | None = None   # set by Ctrl-C; `run --resume` goes on
    in_flight: dict | None = None
    started_at: float = field(default_factory=time.time)
    workload_seed: int | None = None  # held-out shapes are drawn with it (perfloop.contract.workload)
    worktree: str = ""        # a fleet's lane: the worktree the run lives in (perfloop.fleet)
    schema: int = STATE_SCHEMA

    def to_dict(self) -> dict:
        """state.json's object: a stop as its line (`stopped`, as always) and its reason."""
        out = asdict(self)
        del out["stop"]
        out.update(stopped=self.stop and self.stop.detail,
                   stop_reason=self.stop and self.stop.reason,
                   never_tried=list(self.stop.never_tried) if self.stop else None,
                   interrupted=self.interrupted and self.interrupted.detail,
                   schema=STATE_SCHEMA)
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> State:
        """The state from state.json's object (this schema or the last); raises TypeError or
        ValueError naming what is wrong."""
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        raw = dict(raw)
        schema = raw.pop("schema", None)
        if schema not in (STATE_SCHEMA, LEGACY_SCHEMA):
            raise ValueError(f"schema {schema}, expected {STATE_SCHEMA}")
        stopped, interrupted = raw.pop("stopped", None), raw.pop("interrupted", None)
        untried = raw.pop("never_tried", None) or []
        if not isinstance(untried, list) or not all(isinstance(i, str) for i in untried):
            raise ValueError("'never_tried' is not a list of optimization ids")
        reason = raw.pop("stop_reason", None) if schema == STATE_SCHEMA else None
        for name, text in (("stopped", stopped), ("interrupted", interrupted)):
            if text is not None and not isinstance(text, str):
                raise ValueError(f"'{name}' is not a string")
        if stopped is not None:
            # (a reason of None raises ValueError: a corrupt state, as any other unknown one)
            stop = (Stop(StopReason(reason), stopped, tuple(untried))  # type: ignore[arg-type]
                    if schema == STATE_SCHEMA else legacy_stop(stopped))
            if not stop.reason.final:  # (a paused run is not stopped: resume would not go on)
                raise ValueError(f"'stop_reason' {reason} does not end a run")
        elif reason is not None:
            raise ValueError("'stop_reason' without 'stopped'")
        else:
            stop = None
        if interrupted is not None:
            interrupted = Stop(StopReason.INTERRUPTED, interrupted)
        check_flight(raw.get("in_flight"))
        check_overrides(raw.get("overrides", {}))
        return cls(**raw, stop=stop, interrupted=interrupted)


def check_flight(flight) -> None:
    """An in-flight marker recovery can read, or ValueError saying what is wrong with it."""
    if flight is None:
        return
    if not isinstance(flight, dict):
        raise ValueError("'in_flight' is not an object")
    for key, (types, required) in FLIGHT_KEYS.items():
        if key not in flight:
            if required:
                raise ValueError(f"'in_flight' has no '{key}'")
        elif not isinstance(flight[key], types) or isinstance(flight[key], bool):
            raise ValueError(f"'in_flight.{key}' has the wrong type")
    if flight["kind"] not in (Kind.BASELINE, Kind.PLAYBOOK, Kind.AGENT):
        raise ValueError(f"'in_flight.kind' {flight['kind']!r} is not an experiment's kind")
    if flight["kind"] == Kind.PLAYBOOK and not all(k in flight for k in ("optimization",
                                                                         "values")):
        raise ValueError("'in_flight' of a playbook step needs 'optimization' and 'values'")


def check_overrides(overrides) -> None:
    """The flags' settings as settings.apply reads them, or ValueError."""
    if not isinstance(overrides, dict) or not all(
            key in settings.BY_KEY and (value is None or isinstance(value, (int, float))
                                        and not isinstance(value, bool))
            for key, value in overrides.items()):
        raise ValueError(f"'overrides' must map {settings.KEYS} to numbers")


def legacy_stop(words: str) -> Stop:
    """A schema-2 stop: the reason whose words it begins with; a minor gain's stop was the
    verdict's reason, which ends ": stop"."""
    reason = next((r for r, start in LEGACY_STOP_WORDS if words.startswith(start)), None)
    if reason is None:
        reason = StopReason.MINOR_GAIN if words.endswith(": stop") else StopReason.UNRECOGNISED
    return Stop(reason, words)


def latest_archived(archive: Path) -> Path | None:
    """The archived run folder that started last: each is named <branch>-<start time>, in
    whole seconds (perfloop.run.loop._archive); one without a state.json is not a run."""
    def started(folder: Path) -> int:
        tail = folder.name.rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else -1
    runs = [f for f in archive.iterdir() if (f / "state.json").is_file()] \
        if archive.is_dir() else []
    return max(runs, key=lambda f: (started(f), f.name), default=None)


def require_gpu() -> None:
    if not Path("/dev/nvidiactl").exists() and shutil.which("nvidia-smi") is None:
        raise NeedsGPU("timing needs an NVIDIA GPU and none was found on this machine "
                       "(`perfloop check` compiles every variant without one)")
    import torch

    if not torch.cuda.is_available():
        raise NeedsGPU("timing needs an NVIDIA GPU, and PyTorch sees none "
                       f"(torch {torch.__version__}, CUDA {torch.version.cuda})")


def sha256_file(path: Path) -> str:
    return hashlib.sha256(plainfile.read_bytes(path)).hexdigest()


class Session:
    def __init__(self, kernel_arg: str, playbook_dir: str | None = None,
                 overrides: dict | None = None, sandboxes: Path | None = None):
        """`overrides`: the command's flags' settings (perfloop.contract.settings), over
        kernel.toml's [rules] and rules.toml; a run in progress keeps its own (retune).
        `sandboxes`: where the runs' files live (default: the repository's sandbox/; a
        fleet's lane, in a worktree of its own, keeps them in the main tree's)."""
        folder = kernel.find_folder(kernel_arg, gitops.cwd_root())
        self.repo = gitops.open_repo(folder)
        self.root = gitops.root(self.repo)
        # a fleet's lane lives in a worktree under the main tree's sandbox/worktrees/, and
        # keeps its files beside every other run's, in the main tree's sandbox/
        main = Path(self.repo.common_dir).resolve().parent
        lane = self.root != main and main / "sandbox" / "worktrees" in self.root.parents
        self.sandboxes = Path(sandboxes) if sandboxes else \
            main / "sandbox" if lane else self.root / "sandbox"
        self.folder_rel = gitops.rel(self.repo, folder)
        # the committed manifest: an uncommitted edit to it never changes what a run measures
        committed = gitops.file_at(self.repo, "HEAD", f"{self.folder_rel}/{kernel.MANIFEST}")
        self.spec = manifest.load_spec(folder, self.root, committed)
        self._require_usable_name(self.spec.name)
        self.playbook_dir = playbook.resolve_dir(playbook_dir, self.root)
        self.playbook = playbook.load(self.playbook_dir)
        self.book_rules = self.playbook.rules   # rules.toml's alone
        self.overrides = dict(overrides or {})
        self.playbook = dataclasses.replace(self.playbook, rules=settings.apply(
            self.book_rules, {**self.spec.rules, **self.overrides}))
        childlog.configure(self.playbook.rules.log_cap_mb)   # the children this command starts
        self._files_in(self.sandboxes / self.spec.name)
        self.archived: Path | None = None   # the archived run a reader reads (read_run)
        # each code's compile cache, shared by the processes that run that code (the judge's
        # kernel passes, the warmers, the timer's launchers): perfloop.isolation.sandbox.linked_cache
        self.compile_cache = self.sandbox / "cache"
        self.ceilings_cache = self.sandboxes / "device_ceilings.json"
        self._state: State | None = None
        self._pinned: dict = {}      # base commit -> its pinned tree, written by this process
        self.judges: Any = None     # judge processes started ahead (judge.JudgePool)
        self.timer: tuple | None = None        # a timing worker started ahead (phases.start_timer_ahead)
        self.ahead = False          # set by a caller that runs experiments one after another
        self.locked = False         # this process holds the kernel's lock (Session.lock)
        self.fleet = None           # where experiments are measured, if not here (fleet.driver)

    def _files_in(self, sandbox: Path) -> None:
        """The run's files: those in `sandbox` (the kernel's, or an archived run's folder)."""
        self.sandbox = sandbox
        self.table_path = self.sandbox / "perf_results.md"
        self.records_path = self.sandbox / "experiments.jsonl"
        self.state_path = self.sandbox / "state.json"
        self.work = self.sandbox / "work"

    @property
    def archive(self) -> Path:
        """Where runs set aside (`--new`, a baseline that did not pass) are kept."""
        return self.sandboxes / "_archive" / self.spec.name

    def _require_usable_name(self, name: str) -> None:
        """The kernel's name names its sandbox folder, its lock and its run's branch."""
        if len(name.encode()) > NAME_MAX_BYTES or not gitops.valid_branch_name(
                self.repo, f"cutile-perf-{name}-20000101") or name.startswith("."):
            shown = name if len(name) <= 60 else name[:57] + "..."
            raise UserError(f"the kernel name '{shown}' cannot name a git branch and a folder "
                            f"(the run's branch is cutile-perf-<name>-<date>): use at most "
                            f"{NAME_MAX_BYTES} letters, digits, '-', '_' or '.', without ~^:?*[ "
                            "or spaces, in kernel.toml's name (or the folder's name)")

    # ---- one writer at a time ------------------------------------------------------------
    @contextmanager
    def lock(self, git: bool = True):
        """This kernel's lock (its sandbox files), and with `git` the working tree's (its
        branch, index and refs), for a command that writes; Busy names the holder."""
        kernel_lock = self.sandboxes / ".locks" / f"{self.spec.name}.lock"
        tree_lock = gitops.git_path(self.repo, "perfloop.lock") if git else None
        with lock.hold(kernel_lock, f"kernel '{self.spec.name}'"), \
                (lock.hold(tree_lock, f"the working tree {self.root} (its branch and index)")
                 if tree_lock is not None else nullcontext()):   # (git)
            self.ensure_sandbox_ignored()  # (the lock's file is in sandbox/ too)
            self.locked = True
            try:
                yield
            finally:
                self.locked = False

    def preflight(self, commit: str) -> None:
        """Before an experiment: the environment can hold it, and the kernel module committed
        at `commit` compiles (see perfloop.store.preflight)."""
        preflight.require_no_index_lock(gitops.git_path(self.repo, "index.lock"))
        git_dir, objects = Path(self.repo.git_dir), gitops.git_path(self.repo, "objects")
        knobs = self.spec.folder / kernel.KNOBS
        preflight.require_writable({
            self.sandboxes: "the run's record and each experiment's files",
            self.sandbox: "the run's record and each experiment's files",
            self.spec.folder: "the knobs of each experiment",
            knobs if knobs.exists() else self.spec.folder: "the knobs of each experiment",
            git_dir: "the index and the refs of each experiment's commit",
            objects: "each experiment's commit"})
        preflight.require_room([self.sandboxes, self.spec.folder, objects])
        rel = f"{self.folder_rel}/{kernel.MODULE}"
        preflight.require_compiles(gitops.file_at(self.repo, commit, rel),
                                   f"{rel} at {commit[:12]}")

    # ---- children ------------------------------------------------------------------------
    def confinement(self, *reads):
        """How this run's children that run kernel code are confined (perfloop.isolation.sandbox):
        they may read `reads`, by default the run's pinned tree and the exported code."""
        from perfloop.isolation.sandbox import confinement_for

        return confinement_for(self.playbook.rules.confine,
                               *(reads or (self.pinned().root, self.work / COPIES)))

    # ---- state and records -------------------------------------------------------------
    @property
    def state(self) -> State:
        """The run's state; a clear error when this kernel has no run yet."""
        if self._state is None:
            loaded = self.load_state()
            if loaded is None:
                raise UserError(f"no run of '{self.spec.name}' yet: start one with "
                                f"`perfloop init --kernel {self.spec.name}` or `perfloop run`")
            self._adopt(loaded)
        assert self._state is not None   # (_adopt sets it)
        return self._state

    def _adopt(self, state: State) -> None:
        """Use what the run pinned: its manifest and its rules, whatever the tree says now."""
        self._state = state
        self.spec = manifest.load_spec(self.spec.folder, self.root, state.manifest)
        # what rules.toml, the pinned kernel.toml and the run's own flags give now
        self.current_rules = settings.apply(self.book_rules,
                                            {**self.spec.rules, **state.overrides})
        self.playbook = playbook.with_rules(self.playbook, state.rules)
        childlog.configure(self.playbook.rules.log_cap_mb)

    def require_run(self) -> State:
        return self.state

    def retune(self) -> dict:
        """The command's flags (those a run in progress takes: the time budget) into the run's
        pinned rules, kept in its state; returns {key: (before, after)} of what changed.
        Called once every check of the command has passed."""
        st = self.state
        rules = settings.apply(self.playbook.rules, self.overrides)
        changed = {k: (before, settings.in_force(rules)[k])
                   for k, before in settings.in_force(self.playbook.rules).items()
                   if before != settings.in_force(rules)[k]}
        if not changed:
            return {}
        st.overrides = {**st.overrides, **self.overrides}
        st.rules = dataclasses.asdict(rules)
        self.playbook = dataclasses.replace(self.playbook, rules=rules)
        self.current_rules = settings.apply(self.book_rules, {**self.spec.rules, **st.overrides})
        self.save_state()
        return changed

    def read_run(self) -> State:
        """For a command that only reads: the current run, or where there is none the latest
        archived one (self.archived names its folder), so that setting a run aside never
        hides it; "no run yet" only when neither exists."""
        if not self.state_path.exists():
            latest = latest_archived(self.archive)
            if latest is not None:
                self._files_in(latest)
                self.archived = latest
        return self.state

    def has_state(self) -> bool:
        """A run's state is loaded in this session (it may be ahead of state.json)."""
        return self._state is not None

    def forget_state(self) -> None:
        self._state = None

    def begin(self, state: State) -> None:
        """A new run: its state becomes this session's and is saved."""
        self.sandbox.mkdir(parents=True, exist_ok=True)
        self._adopt(state)
        self.save_state()

    def load_state(self, strict: bool = True) -> State | None:
        """The saved state, checked against the repository and the record (not the record's
        iterations without `strict`: --new sets such a run aside whole)."""
        if not self.state_path.exists():
            return None
        try:
            state = State.from_dict(json.loads(self.state_path.read_text()))
            for name in ("kernel", "folder", "branch", "base_commit", "incumbent", "manifest",
                         "judge", "judge_sha256"):
                if not isinstance(getattr(state, name), str) or not getattr(state, name):
                    raise ValueError(f"'{name}' is missing")
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"{self.state_path} is corrupted ({exc.__class__.__name__}: {exc}); "
                            "restore it, or move it aside and start a new run") from None
        for name in ("base_commit", "incumbent"):
            sha = getattr(state, name)
            if not gitops.commit_exists(self.repo, sha):
                raise UserError(f"{self.state_path} names {name} {sha[:12]}, which is not a "
                                "commit in this repository; restore the file or move it aside")
        if strict:  # (--new sets a run aside whole, whatever its record says)
            # the refs before the record: a ref is set after its record line, so a writer
            # that adds both meanwhile cannot make a reader see a ref beyond the record
            refs = self._iteration_refs(state.branch)
            recs, rows = self._check_record(), table.read_rows(self.table_path)
            self._check_refs(recs, rows, state.branch, refs)
            self._check_flight(state, len(recs))
            self._repair_table(recs, rows)
        return state

    def _check_record(self) -> list[records.Experiment]:
        """The record holds iterations 0, 1, ... once each; returns it."""
        recs = self.records()
        numbers = [r.iteration for r in recs]
        if numbers != list(range(len(recs))):
            raise CorruptRecord(f"{self.records_path} does not hold iterations 0 to "
                                f"{len(recs) - 1} once each, in order ({numbers[:8]}); "
                                "restore it, or set the run aside with --new")
        return recs

    def _check_flight(self, state: State, recorded: int) -> None:
        """The in-flight experiment is the next one, or the last recorded one being finished
        (its record line is written before the marker is cleared): recovery would otherwise
        finish an older experiment over the incumbent, or redo one under a number that
        skips the record's."""
        if state.in_flight is None:
            return
        it = state.in_flight["iteration"]
        if it != recorded and not (it == recorded - 1 >= 0):
            allowed = f"{recorded - 1} or {recorded}" if recorded else "0"
            raise UserError(f"{self.state_path} is corrupted (ValueError: 'in_flight.iteration' "
                            f"is {it}, but the record has {recorded} experiments, so it can be "
                            f"only {allowed}); restore it, or set the run aside with --new")

    def _check_refs(self, recs: list[records.Experiment], rows: list, branch: str,
                    refs: dict[int, str]) -> None:
        """The record may have lost experiments when an iteration ref past its last one
        exists: the next experiment, numbered after the record, would move that ref off its
        commit. Refused, whatever the table says; --new sets such a run aside."""
        beyond = [name for number, name in sorted(refs.items()) if number >= len(recs)]
        if beyond:
            said = (f"{self.table_path} has {len(rows)} rows but " if len(rows) > len(recs)
                    else "")
            raise UserError(f"{said}{self.records_path} has {len(recs)} experiments, and "
                            f"{beyond[0]} holds one it lacks: the record was edited or "
                            "truncated by hand. Restore it, or set the run aside with "
                            f"`perfloop run --new` (every commit stays under "
                            f"{gitops.REF_PREFIX}/{branch}/)")

    def _repair_table(self, recs: list[records.Experiment], rows: list) -> None:
        """The table (derived from the record) has the record's rows; a row may lag its
        record by one after a kill, which recovery completes. A table that lost, garbled or
        gained rows is rewritten from the record by a writer (readers answer from the
        record): _check_refs has made sure the record lost nothing."""
        if len(recs) - len(rows) in (0, 1) and all(
                row[:1] == [str(r.iteration)] and row[-1:] == [r.status.value]
                for row, r in zip(rows, recs)):
            return
        if self.locked:
            self._rewrite_table(recs, len(rows))

    def _iteration_refs(self, branch: str) -> dict[int, str]:
        """{NN: name} of the run's refs iter-NN (not its abandoned-* ones)."""
        prefix = f"{gitops.REF_PREFIX}/{branch}/iter-"
        return {int(name[len(prefix):]): name
                for name in gitops.refs_under(self.repo, f"{gitops.REF_PREFIX}/{branch}/")
                if name.startswith(prefix) and name[len(prefix):].isdigit()}

    def _rewrite_table(self, recs: list[records.Experiment], had: int) -> None:
        """The table from the record; the old one is kept beside it."""
        kept = None
        if self.table_path.exists():
            kept = self.table_path.with_name(f"perf_results.replaced-{int(time.time())}.md")
            self.table_path.rename(kept)
        table.rewrite(self.table_path, [
            table.format_row(r.iteration, naming.experiment(r), r.latency_ms, r.correctness,
                             r.status) for r in recs])
        print(f"perfloop: {self.table_path} had {had} rows for {len(recs)} experiments; "
              "rewritten from the record" + (f" (the old table is {kept.name})" if kept else ""),
              file=sys.stderr)

    def save_state(self) -> None:
        write_json(self.state_path, self.state.to_dict())

    def all_records(self) -> list[records.Record]:
        return records.load(self.records_path)

    def records(self) -> list[records.Experiment]:
        """The experiments (one per table row), without confirmations."""
        return [r for r in self.all_records() if isinstance(r, records.Experiment)]

    # ---- guards ------------------------------------------------------------------------
    def ensure_sandbox_ignored(self) -> None:
        """Keep sandbox/ out of git without touching a tracked file (.git/info/exclude)."""
        probe = "sandbox/" + self.spec.name + "/perf_results.md"
        if not self.repo.ignored(probe):
            exclude = gitops.git_path(self.repo, "info/exclude")  # (a linked worktree's too)
            try:
                exclude.parent.mkdir(parents=True, exist_ok=True)
                with open(exclude, "a", encoding="utf-8") as f:
                    f.write("\n/sandbox/\n")
            except OSError as exc:
                raise EnvironmentFailure(f"cannot write {exclude} ({exc.strerror}), where "
                                         "perfloop keeps sandbox/ out of git: make it "
                                         "writable, then run the command again") from None

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
        branch = self.state.branch
        home = self.state.worktree
        if home and Path(home).resolve() != self.root:
            raise UserError(f"the run of '{self.spec.name}' lives in the worktree {home} (a "
                            f"fleet's lane), on branch {branch}: run perfloop there (`cd "
                            f"{home}`), or go on with the fleet (`perfloop run --kernel "
                            f"{self.spec.name} ... --resume` with its --gpus or --workers)")
        if not gitops.branch_exists(self.repo, branch):
            raise UserError(f"the run's branch {branch} no longer exists (its experiments are "
                            f"under {gitops.REF_PREFIX}/{branch}/); start a new run with --new")
        current = gitops.current_branch(self.repo)
        if current != branch:
            raise UserError(f"the run of '{self.spec.name}' lives on branch {branch}, "
                            f"but {current} is checked out; `git checkout {branch}`")

    def require_at_incumbent(self) -> None:
        if gitops.head(self.repo) != self.state.incumbent:
            raise UserError(f"branch {self.state.branch} has moved off the incumbent "
                            f"{self.state.incumbent[:12]}; perfloop will not guess which "
                            "commit to compare against")

    def foreign_imports(self, allowed: list[Path]):
        """What a Place's `foreign` asks (perfloop.measure.measurement): of the files a child
        imported, those inside the repository neither in `allowed` (the exports, the pinned
        tree, the work folder) nor identical to the run's base commit."""
        def foreign(imported: set) -> list[str]:
            return pins.unpinned_imports(self.repo, self.root, sorted(imported),
                                         self.state.base_commit, allowed)
        return foreign

    def perfloop_changed(self) -> bool:
        """Whether perfloop's own source files differ from those pinned when the run started."""
        pinned = self.state.perfloop_sha256
        return bool(pinned) and pins.perfloop_digest() != pinned

    def require_pinned(self) -> None:
        """The judge, the manifest, the rules, what the judge imports and perfloop itself are
        as pinned when the run started; otherwise nothing is run, and the line names the file."""
        st = self.state
        if self.perfloop_changed():
            raise UserError("refused: perfloop's own source files changed since the run started "
                            f"({Path(pins.__file__).resolve().parents[1]}); reinstall perfloop, "
                            "then start a new run with --new: results since the change are not "
                            "to be trusted")
        manifest = f"{self.folder_rel}/{kernel.MANIFEST}"
        if (self.spec.folder / kernel.MANIFEST).read_text(encoding="utf-8") != st.manifest:
            raise UserError(f"refused: {manifest} is pinned for this run (judge, shapes, "
                            "tolerances); undo the edit, or start a new run with --new")
        judge = self.root / st.judge
        if not judge.is_file() or not gitops.tracked(self.repo, [st.judge]) \
                or sha256_file(judge) != st.judge_sha256:
            raise UserError(f"refused: the judge {st.judge} is not the file pinned when the run "
                            "started (changed, untracked or deleted); restore it")
        if self.current_rules != self.playbook.rules:
            raise UserError(f"refused: {self.playbook_dir / 'rules.toml'} differs from the "
                            "rules pinned when the run started; restore it, or start a new run "
                            "with --new")
        shadows = pins.unpinned_modules(self.repo, self.root, judge, st.base_commit,
                                         [self.spec.folder, self.root / "sandbox"])
        if shadows:
            raise UserError(f"refused: {gitops.listing(shadows)} could be imported by the "
                            "judge and differs from the run's base commit (new, ignored or "
                            "changed); remove or commit it outside a run")

    # ---- derived views -----------------------------------------------------------------
    def export_commit(self, sha: str, parent: Path) -> Path:
        """The kernel folder as commit `sha` holds it, written from its blobs at
        `parent`/<random name>/<the folder's path> (perfloop.store.snapshot.export)."""
        return snapshot.export_commit(self.repo, sha, self.folder_rel, parent)

    def pinned(self, base: str | None = None, fresh: bool = False) -> pinned.Pinned:
        """The run's pinned tree (perfloop.store.pinned): the judge and the contract at the
        run's base commit (or at `base`, for a run about to start). Written once per process;
        with `fresh` (before each experiment) checked against git and written again where it
        changed."""
        base = base or self.state.base_commit
        judge = self.state.judge if self.has_state() and base == self.state.base_commit \
            else self.spec.judge_rel
        known = self._pinned.get(base)
        if fresh or known is None or not known.root.is_dir():
            known = self._pinned[base] = pinned.ensure(self.repo, base, self.folder_rel, judge,
                                                       self.sandbox / "pins")
        return known

    def copies(self, tag: str) -> Path:
        """Where an experiment (or a bench, a confirmation, a profile) named `tag` exports the
        code its children run: the one place in the work folder they may read."""
        return self.work / COPIES / tag

    def incumbent_knobs(self) -> dict:
        text = gitops.file_at(self.repo, self.state.incumbent, f"{self.folder_rel}/{kernel.KNOBS}")
        if text is None:
            raise UserError(f"the incumbent {self.state.incumbent[:12]} has no "
                            f"{self.folder_rel}/{kernel.KNOBS}")
        return kernel.parse_knobs(text, f"{self.folder_rel}/{kernel.KNOBS} at "
                                        f"{self.state.incumbent[:12]}")

    def profile(self, of_incumbent: bool = True) -> dict | None:
        """The recorded profile (`perfloop profile`), if a readable one is there; with
        `of_incumbent`, only if it profiled the current incumbent (an older one is stale)."""
        try:
            data = json.loads((self.sandbox / "profile.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
            return None
        return data if not of_incumbent or data.get("commit") == self.state.incumbent else None

    def confirmation(self) -> Confirmation | None:
        """The confirmation of the current incumbent against the baseline, if there is one."""
        for record in reversed(self.all_records()):
            if isinstance(record, records.Confirmation):
                if (record.incumbent == self.state.incumbent
                        and record.baseline == self.state.base_commit):
                    return record
                return None
        return None

    def ref_name(self, iteration: int, what: str = "iter", branch: str | None = None) -> str:
        """The ref of an experiment of this run (or of the run on `branch`)."""
        return f"{gitops.REF_PREFIX}/{branch or self.state.branch}/{what}-{iteration:02d}"
