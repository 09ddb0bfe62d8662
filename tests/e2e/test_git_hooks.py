"""perfloop's own git commands never run a repository hook. Kernel code runs with the
repository as its working directory and can write .git/hooks/ in one experiment; the next
commit must not run what it planted (`--no-verify` skips only pre-commit and commit-msg)."""

import stat

import pytest
from conftest import git

HOOKS = ["pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "post-checkout",
         "reference-transaction", "post-index-change", "pre-auto-gc"]


def plant(repo, marker) -> None:
    hooks = repo / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    for name in HOOKS:
        path = hooks / name
        path.write_text(f"#!/bin/sh\necho {name} >> {marker}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.mark.parametrize("where", ["hooks", "hooksPath"])
def test_planted_hooks_never_run(scratch, tmp_path, where):
    marker = tmp_path / "ran.txt"
    if where == "hooks":
        plant(scratch.path, marker)
    else:  # a hooks folder named in the repository's config
        folder = tmp_path / "elsewhere"
        folder.mkdir()
        (folder / "post-commit").write_text(f"#!/bin/sh\necho post-commit >> {marker}\n")
        (folder / "post-commit").chmod(0o755)
        git(scratch.path, "config", "core.hooksPath", str(folder))
    git(scratch.path, "commit", "-q", "--allow-empty", "-m", "the user's own commit")
    ran_for_the_user = marker.read_text() if marker.exists() else ""
    assert "post-commit" in ran_for_the_user  # (the hooks work: git runs them for the user)
    marker.unlink()
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    assert scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math")[0] == 0
    knobs = scratch.kernel / "knobs.json"
    knobs.write_text(knobs.read_text().replace('"persistent": false', '"persistent": true'))
    code, out, err = scratch.cli("step", "--kernel", "scripted", "--describe", "by hand")
    assert code == 0, err
    assert out["experiment"]["iteration"] == 2
    assert not marker.exists(), marker.read_text()
