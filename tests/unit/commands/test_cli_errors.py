"""Bad input without a run: one clear line, a non-zero exit, no traceback (values as the
table writes them, a folder outside git, no GPU, an interruption, a kernel module that cannot
be imported). tests/e2e/test_cli_errors.py holds the mistakes made in a scratch repository."""

import json
import shutil

import pytest
from conftest import ROOT, SCRIPTED, _has_gpu, git
from hypothesis import given
from hypothesis import strategies as st
from support.cli import assert_one_line, human

from perfloop.core import naming


@pytest.mark.parametrize("text, value", [
    ("8", 8), ("true", True), ("[1, 2048]", (1, 2048)), ("gather_scatter", "gather_scatter"),
    ("1x2048", (1, 2048)), ("128x0", (128, 0)), ("2xnull", (2, None)), ("2xNone", (2, None)),
    ("128x256x64", (128, 256, 64)), ("max", "max"), ("2x", "2x"), ("truexfalse", "truexfalse")])
def test_a_value_is_json_a_list_as_the_table_writes_it_or_a_word(text, value):
    assert naming.read_value(text) == value and type(naming.read_value(text)) is type(value)


@given(st.lists(st.one_of(st.integers(0, 1 << 20), st.none()), min_size=2, max_size=4))
def test_a_list_value_reads_back_as_the_table_writes_it(columns):
    assert naming.read_value(naming.show_value(columns)) == tuple(columns)


def test_not_a_git_repository(tmp_path):
    folder = tmp_path / "loose" / "scripted"
    shutil.copytree(SCRIPTED / "kernel", folder)
    code, _, err = human(tmp_path, "init", "--kernel", str(folder))
    assert code == 2 and not (tmp_path / "loose" / "sandbox").exists()
    assert_one_line(err, "is not inside a git repository")


@pytest.mark.skipif(_has_gpu(), reason="checks the message on machines without a GPU")
def test_run_without_a_gpu_says_so_in_one_line(tmp_path):
    before = (git(ROOT, "status", "--porcelain"), git(ROOT, "branch", "--list"))
    code, out, err = human(tmp_path, "run", "--kernel", "swiglu")
    assert code == 3 and out == ""
    assert_one_line(err, "needs an NVIDIA GPU")
    assert (git(ROOT, "status", "--porcelain"), git(ROOT, "branch", "--list")) == before


@pytest.mark.parametrize("command, hint", [("check", False), ("bench", False), ("run", True),
                                           ("step", True)])
def test_an_interruption_points_to_resume_only_where_there_is_a_run(monkeypatch, capsys,
                                                                    command, hint):
    from perfloop import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.COMMANDS[command], "execute", interrupted)
    # (this process is pytest's: no subreaper, no SIGTERM handler, no sweep of its children)
    monkeypatch.setattr(cli.spawn, "become_subreaper", lambda: None)
    monkeypatch.setattr(cli.signal, "signal", lambda *a: None)
    monkeypatch.setattr(cli.process, "kill_strays", lambda: 0)
    argv = [command, "--kernel", "swiglu"] + (["--opt", "fast_math"] if command == "step" else [])
    assert cli._main(argv) == 130
    said = capsys.readouterr()
    line = (said.err + said.out).strip().splitlines()[-1]
    assert "interrupted" in line and ("--resume" in line) == hint, line


def _plain_repo(tmp_path):
    """A git repository holding the scripted kernel and its judge, uncommitted: all `check`
    needs (it reads the working tree)."""
    repo = tmp_path / "repo"
    shutil.copytree(SCRIPTED / "kernel", repo / "kernels" / "scripted")
    (repo / "tests").mkdir()
    shutil.copy(SCRIPTED / "judge_scripted.py", repo / "tests" / "judge_scripted.py")
    git(tmp_path, "init", "-q", str(repo))
    return repo


@pytest.mark.parametrize("tail,words", [
    ("\ndef broken(:\n", ["kernels/scripted/kernel.py does not compile", "SyntaxError", "line"]),
    ("\nraise RuntimeError('no device here')\n",
     ["kernels/scripted/kernel.py failed while imported", "RuntimeError: no device here"]),
])
def test_check_on_a_kernel_module_that_cannot_be_imported(tmp_path, tail, words):
    # before: "internal error SyntaxError", where run and init refuse in one line
    repo = _plain_repo(tmp_path)
    kernel = repo / "kernels" / "scripted" / "kernel.py"
    kernel.write_text(kernel.read_text() + tail)
    code, out, err = human(repo, "check", "--kernel", "scripted")
    assert code == 2 and out == ""
    assert_one_line(err, *words)
    assert "internal error" not in err
    code, out, _ = human(repo, "check", "--kernel", "scripted", "--json")
    answer = json.loads(out)
    assert code == 2 and answer["exit_code"] == 2 and words[0] in answer["error"]
