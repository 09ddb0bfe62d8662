"""The settings a kernel (kernel.toml's [rules]) or a command's flags set over rules.toml's:
the A/A limit, the cliff ratio and the time budget (issue 53: a busy machine is a normal
machine, and copying the playbook was the only way out)."""

import json
import shutil

import pytest
from conftest import SCRIPTED, git
from support.cli import assert_one_line, human

from perfloop.contract import playbook, settings
from perfloop.core.errors import UserError
from perfloop.contract.manifest import load_spec

RULES = playbook.load(playbook.SHIPPED).rules


def test_overrides_replace_only_their_own_values():
    rules = settings.apply(RULES, {"max_control_gap": 0.1, "cliff_ratio": 8.0,
                                   "time_budget_s": None})
    assert settings.in_force(rules) == {"max_control_gap": 0.1, "cliff_ratio": 8.0,
                                        "time_budget_s": None}
    assert rules.verify.max_control_gap == 0.1 and rules.measure.cliff_ratio == 8.0
    assert rules.stop.time_budget_s is None
    assert rules.decision == RULES.decision and rules.search == RULES.search
    assert rules.stop.max_iterations == RULES.stop.max_iterations
    assert settings.apply(RULES, {}) == RULES


@pytest.mark.parametrize("raw,expected", [
    ({"max_control_gap": 0.1}, {"max_control_gap": 0.1}),
    ({"cliff_ratio": 6, "time_budget_s": 900}, {"cliff_ratio": 6.0, "time_budget_s": 900.0}),
    ({"cliff_ratio": 0, "time_budget_s": 0}, {"cliff_ratio": None, "time_budget_s": None}),
])
def test_a_kernels_rules_table(raw, expected):
    assert settings.from_table(raw, "k.toml") == expected


@pytest.mark.parametrize("raw,words", [
    ({"keep_gain": 0.1}, "[rules] sets only max_control_gap, cliff_ratio, time_budget_s"),
    ({"max_control_gap": 5}, "max_control_gap takes a share between 0 and 1"),
    ({"max_control_gap": 0}, "max_control_gap takes a share between 0 and 1"),
    ({"cliff_ratio": 1}, "cliff_ratio takes a ratio above 1"),
    ({"cliff_ratio": "4"}, "cliff_ratio takes a ratio above 1"),
    ({"time_budget_s": -1}, "time_budget_s takes seconds of experiments"),
    ({"time_budget_s": True}, "time_budget_s takes seconds of experiments"),
    ({"time_budget_s": float("nan")}, "time_budget_s takes seconds of experiments"),
    (900, "[rules] must be a table"),
])
def test_a_kernels_rules_table_that_is_wrong(raw, words):
    with pytest.raises(UserError) as caught:
        settings.from_table(raw, "kernels/k/kernel.toml")
    assert str(caught.value).startswith("kernels/k/kernel.toml: ") and words in str(caught.value)


def _folder(tmp_path, rules: str):
    repo = tmp_path / "repo"
    shutil.copytree(SCRIPTED / "kernel", repo / "kernels" / "scripted")
    (repo / "tests").mkdir()
    shutil.copy(SCRIPTED / "judge_scripted.py", repo / "tests" / "judge_scripted.py")
    manifest = repo / "kernels" / "scripted" / "kernel.toml"
    manifest.write_text(manifest.read_text() + "\n[rules]\n" + rules)
    git(tmp_path, "init", "-q", str(repo))
    return repo


def test_kernel_toml_carries_its_rules(tmp_path):
    repo = _folder(tmp_path, "max_control_gap = 0.12\ntime_budget_s = 0\n")
    spec = load_spec(repo / "kernels" / "scripted", repo)
    assert spec.rules == {"max_control_gap": 0.12, "time_budget_s": None}


def test_a_mistake_in_kernel_tomls_rules_is_one_line(tmp_path):
    repo = _folder(tmp_path, "cliff_ratio = 0.5\n")
    code, out, err = human(repo, "check", "--kernel", "scripted")
    assert code == 2 and out == ""
    assert_one_line(err, "kernel.toml: [rules] cliff_ratio takes a ratio above 1", "not 0.5")


@pytest.mark.parametrize("args,words", [
    (["init", "--max-control-gap", "2"], ["--max-control-gap takes a share", "not 2.0"]),
    (["run", "--cliff-ratio", "0.5"], ["--cliff-ratio takes a ratio above 1", "not 0.5"]),
    (["run", "--time-budget", "soon"], ["--time-budget", "'soon' is not a number"]),
    (["step", "--opt", "fast_math", "--time-budget", "-5"], ["--time-budget takes seconds"]),
    (["step", "--opt", "fast_math", "--cliff-ratio", "8"], ["unrecognized arguments: --cliff"]),
])
def test_a_flag_out_of_range_is_one_line(tmp_path, args, words):
    repo = _folder(tmp_path, "")
    code, out, err = human(repo, args[0], "--kernel", "scripted", *args[1:])
    assert code == 2 and out == ""
    assert_one_line(err, *words)
    assert not (repo / "sandbox").exists()


def test_the_busy_machine_remedies_are_in_the_help(capsys):
    from perfloop.cli import parser

    def help_of(command):
        with pytest.raises(SystemExit):
            parser().parse_args([command, "--help"])
        return capsys.readouterr().out

    for command in ("init", "run"):
        assert all(flag in help_of(command) for flag in ("--max-control-gap", "--cliff-ratio",
                                                         "--time-budget")), command
    step = help_of("step")
    assert "--time-budget" in step and "--cliff-ratio" not in step


# ---- a time budget's stop, and the state that keeps the flags ------------------------------
def test_a_time_budget_stop_names_the_catalog_entries_it_never_tried():
    from perfloop.core.vocab import Stop, StopReason
    from perfloop.plan import decide
    from perfloop.plan.planner import with_untried

    ranked = [decide.Suggestion(opt, opt.values, 0, "why")
              for opt in playbook.load(playbook.SHIPPED).optimizations[:2]]
    budget = Stop(StopReason.TIME_BUDGET, "time budget: 480 s of experiments spent")
    stop = with_untried(budget, ranked)
    ids = tuple(sg.optimization.id for sg in ranked)
    assert stop.never_tried == ids and stop.reason is StopReason.TIME_BUDGET
    assert stop.detail.startswith(f"{budget.detail}; never tried: {', '.join(ids)} (")
    # another rule, or nothing left untried: as it was
    streak = Stop(StopReason.NO_IMPROVEMENT, "no improvement in 2 iterations")
    assert with_untried(streak, ranked) == streak and with_untried(budget, []) == budget
    assert with_untried(None, ranked) is None


def test_state_keeps_the_flags_and_what_a_budget_left_untried():
    from perfloop.core.vocab import Stop, StopReason
    from perfloop.store.session import State

    state = State(kernel="k", folder="kernels/k", branch="b", base_commit="a" * 40,
                  incumbent="a" * 40, overrides={"time_budget_s": 900.0, "cliff_ratio": None},
                  stop=Stop(StopReason.TIME_BUDGET, "time budget: ...", ("occupancy",)))
    again = State.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again == state and again.stop.never_tried == ("occupancy",)
    for bad in ({"keep_gain": 0.5}, {"time_budget_s": "900"}, ["time_budget_s"]):
        with pytest.raises(ValueError, match="'overrides' must map"):
            State.from_dict({**state.to_dict(), "overrides": bad})
    with pytest.raises(ValueError, match="'never_tried' is not a list"):
        State.from_dict({**state.to_dict(), "never_tried": "occupancy"})
