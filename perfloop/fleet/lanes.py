"""Several kernels' runs at once in one repository. Each kernel's run lives in a git worktree of
its own (sandbox/worktrees/<kernel>, on its own branch as a run always is), its record in the
main tree's sandbox/<kernel>/ as any run's; in the driver one thread per kernel (a lane) runs
the loop as `perfloop run` does, measuring on the fleet. Keep and revert stay serial within a
kernel; the kernels go side by side. One fleet per repository at a time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from perfloop.contract import kernel
from perfloop.core.errors import UserError, first_line, keep_traceback
from perfloop.store import gitops, lock
from perfloop.store.session import Session

WORKTREES = "worktrees"
STOP_WAIT_S = 10.0   # for the lanes to record their interruption after Ctrl-C


def every_kernel(root: Path) -> list[str]:
    """--all: every kernel folder under the repository's kernels/."""
    folder = root / "kernels"
    names = sorted(p.name for p in folder.iterdir() if (p / kernel.MANIFEST).is_file()) \
        if folder.is_dir() else []
    if not names:
        raise UserError(f"--all: no kernel folder (kernels/<name>/{kernel.MANIFEST}) in {root}")
    return names


def worktree(repo, root: Path, name: str, folder_rel: str, fresh: bool = False) -> Path:
    """The kernel's worktree: made at HEAD on a branch of its own the first time (the run makes
    its branch there), found afterwards; made again at HEAD with `fresh` (its old branches
    and refs stay). The kernel folder must be committed: a worktree holds what HEAD holds."""
    path = root / "sandbox" / WORKTREES / name
    if (path / ".git").exists() and fresh:
        if repo.git.execute(["git", "-C", str(path), "status", "--porcelain"]).strip():
            raise UserError(f"{path} has uncommitted changes: perfloop will not remove that "
                            "worktree to start afresh; commit or discard them")
        repo.git.worktree("remove", "--force", str(path))
    if (path / ".git").exists():
        return path
    edited = [p for p in gitops.status_paths(repo, untracked=True)
              if gitops.inside(p, folder_rel)]
    if edited:
        raise UserError(f"{folder_rel}/ has uncommitted changes ({gitops.listing(edited)}): a "
                        "fleet runs each kernel in a worktree of its own, made from HEAD; "
                        "commit them first")
    branch = gitops.unique_branch(repo, f"perfloop-lane-{name}")
    repo.git.worktree("add", "-q", "-b", branch, str(path), "HEAD")
    return path


def sessions(names: list[str], root: Path, repo, playbook: str | None, flags: dict,
             plain: bool = False, new: bool = False) -> list[Session]:
    """Each named kernel's Session in its worktree, its files in the main tree's sandbox/.
    With `plain`, each starts from its kernel.toml's [plain] knobs: a worktree made afresh at
    HEAD, and a commit there that sets them (refused where a run exists, unless `new`)."""
    if plain:
        _require_plain_start(names, root, repo, new)
    out, seen = [], set()
    for name in names:
        folder = kernel.find_folder(name, root)
        rel = gitops.rel(repo, folder)
        s = Session(str(worktree(repo, root, folder.name, rel, fresh=plain) / rel), playbook,
                    flags)
        if plain:
            _commit_plain(s)
        if s.spec.name in seen:
            raise UserError(f"kernel '{s.spec.name}' is named twice")
        seen.add(s.spec.name)
        out.append(s)
    return out


def _require_plain_start(names: list[str], root: Path, repo, new: bool) -> None:
    """Before any worktree is made again: every kernel declares [plain] knobs, and none has a
    run that --new would not set aside."""
    from perfloop.contract import manifest

    for name in names:
        folder = kernel.find_folder(name, root)
        spec = manifest.load_spec(folder, root)
        if spec.plain is None:
            raise UserError(f"--from plain: {gitops.rel(repo, folder)}/{kernel.MANIFEST} "
                            "declares no [plain] knobs (where the kernel started); add them")
        if (root / "sandbox" / spec.name / "state.json").exists() and not new:
            raise UserError(f"--from plain: kernel '{spec.name}' has a run already; pass --new "
                            "to set it aside and start from its plain knobs")


def _commit_plain(s: Session) -> None:
    """The plain knobs, committed on the lane's branch: the run's base."""
    from perfloop.store import snapshot

    text = kernel.knobs_text(s.spec.plain)
    (s.spec.folder / kernel.KNOBS).write_text(text, encoding="utf-8")
    files = snapshot.with_file(snapshot.from_commit(s.repo, gitops.head(s.repo), s.folder_rel),
                               kernel.KNOBS, text)
    gitops.commit_files(s.repo, s.folder_rel, files,
                        f"perfloop: {s.spec.name} from its plain knobs (kernel.toml [plain])")


def run(lanes: list[Session], remote, body) -> dict:
    """Run `body(session)` for every lane side by side; {kernel: its answer}. Ctrl-C (or
    SIGTERM) stops every worker's children and lets each lane record its interruption, within
    STOP_WAIT_S, then goes on up."""
    answers: dict = {}

    def lane(s: Session) -> None:
        try:
            answers[s.spec.name] = body(s)
        except UserError as exc:
            answers[s.spec.name] = {"error": str(exc), "exit_code": exc.exit_code}
        except KeyboardInterrupt:
            answers[s.spec.name] = {"error": "interrupted; `perfloop run --resume` (with the "
                                             "same kernels and fleet) goes on", "exit_code": 130}
        except Exception as exc:   # one lane's bug is its own line; the others go on
            first = first_line(exc)
            log = keep_traceback(s.spec.name)
            answers[s.spec.name] = {"error": f"internal error {type(exc).__name__}: {first} "
                                             f"(traceback in {log})", "exit_code": 1}

    threads = [threading.Thread(target=lane, args=(s,), name=f"lane-{s.spec.name}",
                                daemon=True) for s in lanes]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except BaseException:   # Ctrl-C, SIGTERM: every lane stops and records it
        remote.stop()
        until = time.monotonic() + STOP_WAIT_S
        for t in threads:
            t.join(max(0.0, until - time.monotonic()))
        raise
    return answers


def hold(repo):
    """The one fleet of this repository (a second is refused in one line)."""
    return lock.hold(gitops.git_path(repo, "perfloop-fleet.lock"), "this repository's fleet")
