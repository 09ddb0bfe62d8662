"""What an experiment commits is what ran: a kernel folder read once as bytes
(perfloop.store.snapshot), committed from those bytes (perfloop.store.gitops.commit_files) with
no filter, attribute, replace ref or hook in the way, exported from the commit's blobs; and the
run's pinned tree (perfloop.store.pinned) written from the base commit."""

import os
import subprocess
from pathlib import Path

import pytest
from conftest import git

from perfloop.core.errors import UserError
from perfloop.store import gitops, pinned, snapshot


@pytest.fixture
def krepo(tmp_path):
    root = tmp_path / "repo"
    (root / "kernels" / "k").mkdir(parents=True)
    (root / "tests" / "data").mkdir(parents=True)
    (root / "kernels" / "k" / "kernel.py").write_text("X = 1\n")
    (root / "kernels" / "k" / "knobs.json").write_text('{"mode": "ok"}\n')
    (root / "tests" / "judge_k.py").write_text("def test_x():\n    pass\n")
    (root / "tests" / "conftest.py").write_text("")
    (root / "tests" / "data" / "cases.json").write_text("[]\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "README.md").write_text("x\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "t")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return gitops.open_repo(root)


def _blob(krepo, path: str) -> bytes:
    return subprocess.run(["git", "cat-file", "blob", f"HEAD:{path}"], cwd=krepo.working_tree_dir,
                          capture_output=True, check=True).stdout


def test_a_clean_filter_cannot_make_the_commit_differ_from_the_files_read(krepo):
    """A .gitattributes in the kernel folder and a clean filter in .git/config made `git add`
    commit other knobs than the ones that ran; a commit written from the bytes read is
    immune to both."""
    root = Path(krepo.working_tree_dir)
    folder = root / "kernels" / "k"
    (folder / ".gitattributes").write_text("knobs.json filter=swap\n")
    git(root, "config", "filter.swap.clean", "sed s/fast/wrong/")
    (folder / "knobs.json").write_text('{"mode": "fast"}\n')
    files = snapshot.from_worktree(krepo, root, "kernels/k")
    sha = gitops.commit_files(krepo, "kernels/k", files, "the edit")
    assert _blob(krepo, "kernels/k/knobs.json") == b'{"mode": "fast"}\n'
    assert snapshot.from_commit(krepo, sha, "kernels/k") == files
    assert gitops.head(krepo) == sha and git(root, "rev-parse", "HEAD~1") != sha


def test_a_commit_of_the_folder_leaves_everything_else_as_it_was(krepo):
    root = Path(krepo.working_tree_dir)
    (root / "README.md").write_text("a staged edit outside\n")
    git(root, "add", "README.md")
    (root / "tests" / "conftest.py").write_text("# an unstaged edit outside\n")
    folder = root / "kernels" / "k"
    (folder / "kernel.py").write_text("X = 2\n")
    (folder / "new.py").write_text("Y = 1\n")
    (folder / "knobs.json").unlink()   # deleted: gone from the commit too
    sha = gitops.commit_files(krepo, "kernels/k", snapshot.from_worktree(krepo, root, "kernels/k"),
                              "the edit")
    assert set(snapshot.from_commit(krepo, sha, "kernels/k")) == {"kernel.py", "new.py"}
    status = git(root, "status", "--porcelain")
    assert "M  README.md" in status and " M tests/conftest.py" in status
    assert "kernels/k" not in status   # the index and the working tree hold the commit
    assert git(root, "show", "HEAD:README.md") == "x"


def test_an_export_holds_the_commits_blobs_whatever_replace_refs_say(krepo, tmp_path):
    """A replace ref makes an object read as another; perfloop reads each commit's own."""
    root = Path(krepo.working_tree_dir)
    other = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=root, input=b"X = 99\n",
                           capture_output=True, check=True).stdout.decode().strip()
    mine = git(root, "rev-parse", "HEAD:kernels/k/kernel.py")
    git(root, "replace", mine, other)
    assert git(root, "cat-file", "blob", mine) == "X = 99"   # git itself reads the other
    out = snapshot.export_commit(krepo, gitops.head(krepo), "kernels/k", tmp_path / "code")
    assert (out / "kernel.py").read_text() == "X = 1\n"
    assert out.relative_to(tmp_path / "code").parts[1:] == ("kernels", "k")


def test_exports_of_one_commit_differ_only_by_a_random_name(krepo, tmp_path):
    files = snapshot.from_commit(krepo, gitops.head(krepo), "kernels/k")
    a, b = (snapshot.export(files, tmp_path / "code", "kernels/k") for _ in range(2))
    assert a != b and len(a.parts) == len(b.parts) and a.parts[-2:] == b.parts[-2:]
    assert snapshot.read_back(a) == snapshot.read_back(b) == files
    assert not os.access(a / "kernel.py", os.W_OK) or os.geteuid() == 0   # read-only files


def test_a_symbolic_link_in_the_kernel_folder_is_refused(krepo):
    root = Path(krepo.working_tree_dir)
    (root / "kernels" / "k" / "link.py").symlink_to("/etc/hostname")
    with pytest.raises(UserError, match="symbolic link"):
        snapshot.from_worktree(krepo, root, "kernels/k")


def test_bytecode_python_left_beside_the_kernel_is_not_the_kernel(krepo):
    root = Path(krepo.working_tree_dir)
    (root / "kernels" / "k" / "__pycache__").mkdir()
    (root / "kernels" / "k" / "__pycache__" / "kernel.cpython-311.pyc").write_bytes(b"\0")
    assert set(snapshot.from_worktree(krepo, root, "kernels/k")) == {"kernel.py", "knobs.json"}


def test_the_pinned_tree_holds_the_judge_its_folder_and_the_contract(krepo, tmp_path):
    root = Path(krepo.working_tree_dir)
    base = gitops.head(krepo)
    (root / "tests" / "judge_k.py").write_text("# swapped after the run started\n")
    (root / "tests" / "untracked.txt").write_text("no commit holds me\n")
    tree = pinned.ensure(krepo, base, "kernels/k", "tests/judge_k.py", tmp_path / "pins")
    assert tree.judge.read_text() == "def test_x():\n    pass\n"
    assert (tree.root / "tests" / "data" / "cases.json").exists()
    assert not (tree.root / "tests" / "untracked.txt").exists()
    assert (tree.contract / "kernel.py").read_text() == "X = 1\n"
    assert not (tree.root / "README.md").exists()   # the root's files only as pytest reads them
    assert tree.ini == tree.root / pinned.INI   # no pytest configuration: an empty one
    os.chmod(tree.contract / "kernel.py", 0o644)
    (tree.contract / "kernel.py").write_text("X = 3\n")   # tampered between experiments
    again = pinned.ensure(krepo, base, "kernels/k", "tests/judge_k.py", tmp_path / "pins")
    assert again == tree and (tree.contract / "kernel.py").read_text() == "X = 1\n"


def test_the_pinned_tree_takes_the_pytest_configuration_pytest_would(krepo, tmp_path):
    root = Path(krepo.working_tree_dir)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-q'\n")
    git(root, "commit", "-qam", "pytest options")
    tree = pinned.ensure(krepo, gitops.head(krepo), "kernels/k", "tests/judge_k.py",
                         tmp_path / "pins")
    assert tree.ini == tree.root / "pyproject.toml"


def test_bytecode_a_commit_holds_is_left_out_of_its_export_too(krepo, tmp_path):
    """A repository without a .gitignore commits __pycache__/; what is compared, exported and
    committed leaves it out on both sides (a run once refused its own baseline so)."""
    root = Path(krepo.working_tree_dir)
    (root / "kernels" / "k" / "__pycache__").mkdir()
    (root / "kernels" / "k" / "__pycache__" / "kernel.cpython-312.pyc").write_bytes(b"\0")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "bytecode committed")
    head = gitops.head(krepo)
    assert set(snapshot.from_commit(krepo, head, "kernels/k")) == {"kernel.py", "knobs.json"}
    assert snapshot.matches(krepo, head, "kernels/k")
    out = snapshot.export_commit(krepo, head, "kernels/k", tmp_path / "code")
    assert not (out / "__pycache__").exists()
