"""Bad input: one clear line, a non-zero exit, no traceback, and the repository unchanged."""

import pytest
from conftest import git
from support.cli import assert_one_line, human

from perfloop.store import table


def test_unknown_kernel(scratch):
    before = scratch.snapshot()
    code, _, err = human(scratch.path, "init", "--kernel", "nosuch")
    assert code == 2 and scratch.snapshot() == before
    assert_one_line(err, "unknown kernel 'nosuch'",
                    "shipped kernels: attention, matmul, rmsnorm, softmax, swiglu")


def test_unknown_optimization(started):
    before = started.snapshot()
    code, _, err = human(started.path, "step", "--kernel", "scripted", "--opt", "warp_magic")
    assert code == 2 and started.snapshot() == before
    assert_one_line(err, "unknown optimization 'warp_magic'", "fast_math")


@pytest.mark.parametrize("value", ["3", "[1, 3]", "fast"])
def test_value_outside_the_candidates(started, value):
    before = started.snapshot()
    opt = "tile_shape" if value.startswith("[") else "occupancy"
    code, _, err = human(started.path, "step", "--kernel", "scripted", "--opt", opt, "--value", value)
    assert code == 2 and started.snapshot() == before
    assert_one_line(err, f"value {value} is not a candidate of '{opt}'")


@pytest.mark.parametrize("value", ["[1, 1024]", "1x1024"])   # JSON, or as the table writes it
def test_value_equal_to_the_incumbents(started, value):
    code, _, err = human(started.path, "step", "--kernel", "scripted", "--opt", "tile_shape",
                         "--value", value)
    assert code == 2
    assert_one_line(err, f"already has tile={value}")


def test_detached_head(scratch):
    git(scratch.path, "checkout", "-q", "--detach")
    before = scratch.snapshot()
    code, _, err = human(scratch.path, "init", "--kernel", "scripted")
    assert code == 2 and scratch.snapshot() == before
    assert_one_line(err, "HEAD is detached")


def test_corrupted_record(started):
    records = started.path / "sandbox/scripted/experiments.jsonl"
    records.write_text(records.read_text() + '{"iteration": 1, "status": "ke\n')
    data, before = records.read_bytes(), started.snapshot()
    for args in (["status"], ["step", "--opt", "fast_math"], ["report"]):
        code, _, err = human(started.path, *args[:1], "--kernel", "scripted", *args[1:])
        assert code == 2
        assert_one_line(err, "experiments.jsonl: line 2 is not valid JSON")
    assert records.read_bytes() == data and started.snapshot() == before


def test_record_that_is_not_an_experiment(started):
    records = started.path / "sandbox/scripted/experiments.jsonl"
    records.write_text(records.read_text() + '{"hello": 1}\n')
    code, _, err = human(started.path, "next", "--kernel", "scripted")
    assert code == 2
    assert_one_line(err, "line 2 is not an experiment record")


def test_corrupted_state(started):
    (started.path / "sandbox/scripted/state.json").write_text("{")
    code, _, err = human(started.path, "status", "--kernel", "scripted")
    assert code == 2
    assert_one_line(err, "state.json is corrupted")


def test_folder_that_is_not_a_kernel(scratch):
    code, _, err = human(scratch.path, "init", "--kernel", "./playbook")
    assert code == 2
    assert_one_line(err, "is not a kernel folder")


def test_broken_playbook(scratch):
    (scratch.path / "playbook" / "rules.toml").write_text("[decision\n")
    scratch.commit_all("break the rules")
    before = scratch.snapshot()
    code, _, err = human(scratch.path, "init", "--kernel", "scripted")
    assert code == 2 and scratch.snapshot() == before
    assert_one_line(err, "rules.toml is not valid TOML")


@pytest.mark.parametrize("returned,words", [
    ("12 * shape.dims[0]", "returned int"),
    ('{"bytes": 12 * shape.dims[0], "flops": {"tensor.int4": 1}}',
     "unknown execution unit 'tensor.int4'"),
])
def test_a_wrong_traffic_is_refused_in_one_line_before_anything_is_written(scratch, returned,
                                                                           words):
    path = scratch.kernel / "kernel.py"
    path.write_text(path.read_text().replace(
        "return 12 * shape.dims[0], 2 * shape.dims[0]", f"return {returned}"))
    scratch.commit_all("a traffic() that is neither form")
    before = scratch.snapshot()
    code, _, err = human(scratch.path, "init", "--kernel", "scripted")
    assert code == 2 and scratch.snapshot() == before
    assert_one_line(err, "kernel 'scripted': traffic(shape", words)


def test_no_run_yet(scratch):
    code, _, err = human(scratch.path, "next", "--kernel", "scripted")
    assert code == 2
    assert_one_line(err, "no run of 'scripted' yet")


def test_json_errors_are_one_json_line(scratch):
    code, out, err = scratch.cli("step", "--kernel", "nosuch", "--opt", "x")
    assert code == 2 and out == {"schema": 1, "command": "step", "ok": False,
                                 "error": out["error"], "exit_code": 2}


MANIFEST_MISTAKES = {
    "no headline": ("headline = true\n", "", "exactly one shape must have headline = true"),
    "judge inside the folder": ('judge = "tests/judge_scripted.py"',
                                'judge = "kernels/scripted/kernel.py"', "must live outside"),
    "judge missing": ('judge = "tests/judge_scripted.py"', 'judge = "tests/nope.py"',
                      "judge tests/nope.py does not exist"),
    "no shapes": ("[[shapes]]", "[[nothing]]", "needs a judge and [[shapes]]"),
    "duplicate shape names": ('name = "tail"', 'name = "guard"', "guard is used twice"),
    "requires_gpu as a string": ("requires_gpu = false", 'requires_gpu = "false"',
                                 "requires_gpu must be true or false"),
    "a syntax error": ('name = "scripted"', 'name = "scripted', "kernel manifest"),  # not "playbook"
    "tags as a string": ("requires_gpu = false", 'requires_gpu = false\ntags = "reduction"',
                         "tags must be a list of names"),
}


@pytest.mark.parametrize("mistake", MANIFEST_MISTAKES)
def test_kernel_manifest_mistakes(scratch, mistake):
    old, new, message = MANIFEST_MISTAKES[mistake]
    manifest = scratch.kernel / "kernel.toml"
    assert old in manifest.read_text()
    manifest.write_text(manifest.read_text().replace(old, new))
    scratch.commit_all(mistake)
    before = scratch.snapshot()
    code, _, err = human(scratch.path, "init", "--kernel", "scripted")
    assert code == 2 and scratch.snapshot() == before
    assert_one_line(err, message)


def test_knobs_that_are_not_a_json_object(scratch):
    (scratch.kernel / "knobs.json").write_text("[1, 2]\n")
    scratch.commit_all("bad knobs")
    code, _, err = human(scratch.path, "init", "--kernel", "scripted")
    assert code == 2
    assert_one_line(err, "must hold a JSON object")


@pytest.mark.parametrize("entry,message", [
    ('[[optimization]]\nid = "fast_math"\ntitle = "t"\nfamily = "f"\nknob = "k"\nvalues = [1]\n'
     'applies_to = ["memory-bound"]\npriority = { memory-bound = 1 }\n', "ids must be unique"),
    ('[[optimization]]\nid = "x"\ntitle = "t"\nfamily = "f"\nknob = "k"\nvalues = [1]\n'
     'applies_to = ["memory-bound"]\npriority = { balanced = 1 }\n', "needs a priority"),
    ('[[optimization]]\nid = "x"\ntitle = "t"\n', "lacks 'family'"),
])
def test_catalog_mistakes(scratch, entry, message):
    with open(scratch.path / "playbook" / "catalog.toml", "a") as f:
        f.write("\n" + entry)
    scratch.commit_all("bad catalog")
    code, _, err = human(scratch.path, "init", "--kernel", "scripted")
    assert code == 2
    assert_one_line(err, message)


def test_rules_with_an_unknown_setting(scratch):
    scratch.rules(keep_gain="0.05\nkeep_gains = 0.1")
    scratch.commit_all("typo in rules")
    code, _, err = human(scratch.path, "init", "--kernel", "scripted")
    assert code == 2
    assert_one_line(err, "section [decision]", "keep_gains")


def test_step_on_another_branch(started):
    git(started.path, "checkout", "-q", "main")
    before = started.snapshot()
    code, _, err = human(started.path, "step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 2 and started.snapshot() == before
    assert_one_line(err, "lives on branch cutile-perf-scripted-", "git checkout")


def test_step_when_the_branch_moved_off_the_incumbent(started):
    (started.path / "README.md").write_text("a commit by hand\n")
    started.commit_all("by hand")
    before = started.snapshot()
    code, _, err = human(started.path, "step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 2 and started.snapshot() == before
    assert_one_line(err, "has moved off the incumbent")


def test_table_edited_by_hand(started):
    """A row the record lacks, whose iteration no ref holds: the record lost nothing, so a
    writer rewrites the table from it (the old one kept beside it); a reader answers."""
    path = started.path / "sandbox/scripted/perf_results.md"
    path.write_text(path.read_text() + "| 7 | invented | 0.1 | PASS | keep |\n")
    code, _, err = human(started.path, "status", "--kernel", "scripted")
    assert code == 0 and "invented" in path.read_text(), err
    code, _, err = human(started.path, "step", "--kernel", "scripted", "--opt", "fast_math")
    assert code == 0 and "had 2 rows for 1 experiments; rewritten from the record" in err
    assert [row[0] for row in table.read_rows(path)] == ["0", "1"]
    assert "invented" in next(path.parent.glob("perf_results.replaced-*.md")).read_text()


def test_a_truncated_record_is_noticed_by_every_command(started):
    """Before, only `step` noticed; `next` re-suggested what had been tried."""
    assert started.cli("step", "--kernel", "scripted", "--opt", "fast_math")[0] == 0
    assert started.cli("step", "--kernel", "scripted", "--opt", "tile_shape")[0] == 0
    path = started.path / "sandbox/scripted/experiments.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:1]))
    before = started.snapshot()
    for command in ("next", "status", "report", "step"):
        extra = ["--opt", "occupancy"] if command == "step" else []
        code, _, err = human(started.path, command, "--kernel", "scripted", *extra)
        assert code == 2, command
        assert_one_line(err, "has 3 rows but", "has 1 experiments", "truncated")
    assert started.snapshot() == before


@pytest.mark.parametrize("args,message", [
    (["--describe", "   "], "--describe needs a short text"),
    (["--describe", "x", "--value", "3"], "--value goes with --opt"),
    (["--describe", "nothing changed"], "nothing to judge"),
])
def test_step_argument_mistakes(started, args, message):
    code, _, err = human(started.path, "step", "--kernel", "scripted", *args)
    assert code == 2
    assert_one_line(err, message)


def test_an_edit_staged_then_undone_is_nothing_to_judge(started):
    # `git status` still lists it (staged, then changed back in the working tree); judged,
    # it would time the incumbent against itself (before: git's empty commit, a traceback)
    kernel = started.kernel / "kernel.py"
    text = kernel.read_text()
    kernel.write_text(text + "# a comment\n")
    git(started.path, "add", str(kernel))
    kernel.write_text(text)
    code, _, err = human(started.path, "step", "--kernel", "scripted", "--describe", "undone")
    assert code == 2
    assert_one_line(err, "nothing to judge")
    assert len(started.records()) == 1


def test_check_argument_mistakes(scratch):
    code, _, err = human(scratch.path, "check", "--kernel", "scripted", "--arch", "hopper")
    assert code == 2
    assert_one_line(err, "--arch takes targets like sm_90")
    code, _, err = human(scratch.path, "check", "--kernel", "scripted")
    assert code == 2
    assert_one_line(err, "has no compile_ahead")
