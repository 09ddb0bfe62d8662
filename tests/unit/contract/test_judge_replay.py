"""The judge's cases recorded in its reference pass (perfloop.contract.judge_replay) and read back
by the timer (perfloop.referee.replay): what is replayable, what is not, the size cap, and
where in a timing pass the replays run."""

import io

import pytest
import torch

from perfloop.contract import judge_api, judge_replay, judging
from perfloop.core.atomic import digest
from perfloop.contract.playbook import Measure
from perfloop.referee import replay

EXACT = {"rtol": 0.0, "atol": 0.0, "max_rel_err": 0.0}


@pytest.fixture
def reference_pass(tmp_path, monkeypatch):
    """A reference pass asked to judge variants "a" (tile (1, 2)) and "b" of one folder."""
    folder = tmp_path / "kernel"
    folder.mkdir()
    request = {"variants": [{"label": "a", "folder": str(folder), "knobs": {"tile": [1, 2]}},
                            {"label": "b", "folder": str(folder), "knobs": {"tile": [4, 4]}}]}
    monkeypatch.setattr(judging, "MODE", judging.REFERENCE)
    monkeypatch.setattr(judging, "REQUEST", request)
    monkeypatch.setattr(judging, "EXPECTED", {})
    monkeypatch.setattr(judging, "ORDER", [])
    monkeypatch.setattr(judge_replay, "CASES", {})
    monkeypatch.setattr(judge_replay, "NOT_REPLAYABLE", {})
    return str(folder)


def _values(n: int, seed: int = 0) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float64) + seed


def _judge(folder, label="a", case="n=5", knobs=None, body=None, n=5):
    """One case as judges write it: build, then run() poisons, launches, returns out."""
    knobs = {"tile": (1, 2)} if knobs is None else knobs
    values = _values(n)
    launch = judge_api.module_for(folder).build(knobs)

    def run():
        if body is not None:
            return body(launch, values)
        out = torch.full((n,), float("nan"), dtype=torch.float64)
        launch(("case", values), out)
        return out

    judge_api.check(label, case, run, 2 * values, **EXACT)


def test_a_run_that_launches_once_with_inputs_and_out_is_recorded(reference_pass):
    _judge(reference_pass)
    case = judge_replay.CASES[("a", "n=5")]
    assert case["out"] == {"shape": [5], "stride": [1], "dtype": "float64", "device": "cpu"}
    name, values = case["inputs"]["tuple"]
    assert name == {"value": "case"} and torch.equal(values["tensor"], _values(5))
    assert values["device"] == "cpu" and judge_replay.NOT_REPLAYABLE == {}


def test_a_launcher_built_inside_run_is_recorded_too(reference_pass):
    """(as the shipped softmax judge does: module_for(...).build(...) inside run())"""
    def body(_, values):
        launch = judge_api.module_for(reference_pass).build({"tile": (1, 2)})
        out = torch.full_like(values, float("nan"))
        launch((values,), out)
        return out

    _judge(reference_pass, body=body)
    assert ("a", "n=5") in judge_replay.CASES


def test_inputs_are_copied_as_they_were_at_the_launch(reference_pass):
    def body(launch, values):
        x = values.clone()
        out = torch.full_like(x, float("nan"))
        launch((x,), out)
        x.fill_(7.0)                     # (after the launch: the case keeps what was launched)
        return out

    _judge(reference_pass, body=body)
    assert torch.equal(judge_replay.CASES[("a", "n=5")]["inputs"]["tuple"][0]["tensor"],
                       _values(5))


def _nan(values):
    return torch.full_like(values, float("nan"))


@pytest.mark.parametrize("why,body", [
    ("no launch", lambda launch, v: _nan(v)),
    ("two launches", lambda launch, v: [launch((v,), o) or launch((v,), o)
                                        for o in [_nan(v)]][0] or None),
    ("extra arguments", lambda launch, v: [launch((v,), o, o) for o in [_nan(v)]] and None),
    ("keyword arguments", lambda launch, v: [launch(inputs=(v,), out=o) for o in [_nan(v)]]
     and None),
    ("another output returned", lambda launch, v: [launch((v,), _nan(v))] and _nan(v)),
    ("an input view with gaps", lambda launch, v: [launch((torch.arange(10.0)[::2],), o)
                                                   for o in [_nan(v)]] and None),
    ("an input that is not data", lambda launch, v: [launch((object(),), o)
                                                     for o in [_nan(v)]] and None),
    ("run() raised", lambda launch, v: 1 / 0),
    ("the public function", lambda launch, v: judge_api.module_for("x").softmax(v)),
])
def test_any_other_run_is_not_replayable_and_fails_nothing(reference_pass, why, body):
    _judge(reference_pass, body=body)   # (no exception: the reference pass goes on)
    assert judge_replay.CASES == {}, why
    assert judge_replay.NOT_REPLAYABLE["a"]["count"] == 1
    assert ("a", "n=5") in judging.EXPECTED          # the expected value stands as before


def test_a_launcher_built_with_other_knobs_than_the_variant_is_not_replayed(reference_pass):
    """The timer replays a case in the launcher of its label, built with the label's knobs:
    a judge that built other knobs for that case checked something else."""
    _judge(reference_pass, knobs={"tile": (8, 8)})
    _judge(reference_pass, label="not-asked")
    assert judge_replay.CASES == {}
    assert "other knobs" in judge_replay.NOT_REPLAYABLE["a"]["why"]


def test_a_launch_outside_a_recorded_run_is_ignored(reference_pass):
    launch = judge_api.module_for(reference_pass).build({"tile": (1, 2)})
    launch((_values(3),), torch.empty(3))           # a judge's own warm-up, say
    _judge(reference_pass)
    assert list(judge_replay.CASES) == [("a", "n=5")]


def _load_file(data: bytes) -> dict:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def test_the_case_file_is_plain_data_with_each_variant_s_knobs(reference_pass):
    _judge(reference_pass, case="n=5")
    _judge(reference_pass, label="b", knobs={"tile": (4, 4)}, case="n=7", n=7)
    data, summary = judge_replay.case_file(judging.EXPECTED, judging.ORDER)
    body = _load_file(data)
    assert [(c["label"], c["case"]) for c in body["cases"]] == [("a", "n=5"), ("b", "n=7")]
    assert torch.equal(body["cases"][1]["expected"], 2 * _values(7))
    assert body["cases"][0]["tolerance"] == EXACT
    assert body["variants"]["a"]["knobs"] == judge_replay.knobs_key({"tile": [1, 2]})
    assert summary["cases"] == 2 and summary["skipped"] == {}


def test_cases_past_a_variant_s_share_of_the_cap_are_left_out_and_counted(reference_pass):
    for n in (10, 20, 30):
        _judge(reference_pass, case=f"n={n}", n=n)
    _judge(reference_pass, label="b", knobs={"tile": (4, 4)}, case="n=10", n=10)
    # one case of 10 values: 80 bytes of inputs and 80 of expected values; a 700-byte cap
    # gives each of the two variants 350 bytes: a's n=10 (160) and n=20 (320) do not both fit
    data, summary = judge_replay.case_file(judging.EXPECTED, judging.ORDER, cap=700)
    kept = [(c["label"], c["case"]) for c in _load_file(data)["cases"]]
    assert kept == [("a", "n=10"), ("b", "n=10")]
    assert summary["skipped"] == {"a": 2}


# ---- the timer's side -------------------------------------------------------------------------
def _written(reference_pass, tmp_path, *, judged=True):
    if judged:
        _judge(reference_pass)
        _judge(reference_pass, label="b", knobs={"tile": (4, 4)}, case="n=7", n=7)
    data, _ = judge_replay.case_file(judging.EXPECTED, judging.ORDER)
    path = tmp_path / "cases.pt"
    path.write_bytes(data)
    variants = [{"label": v["label"], "folder": v["folder"], "knobs": v["knobs"]}
                for v in judging.REQUEST["variants"]]
    return {"path": str(path), "digest": digest(data)}, variants


def test_the_timer_reads_the_cases_of_the_variants_it_builds(reference_pass, tmp_path):
    where, variants = _written(reference_pass, tmp_path)
    variants[1] = {**variants[1], "knobs": {"tile": [2, 2]}}   # not what the judge judged
    cases = replay.load(where, variants)
    assert list(cases) == ["a"] and [c.name for c in cases["a"]] == ["n=5"]
    inputs, out, extra = cases["a"][0].buffers(gpu=False)
    assert inputs[0] == "case" and torch.equal(inputs[1], _values(5)) and extra == ()
    assert out.shape == (5,) and out.isnan().all()          # poisoned
    assert cases["a"][0].compare(2 * _values(5))["passed"]
    assert not cases["a"][0].compare(3 * _values(5))["passed"]


def test_a_case_file_changed_after_the_reference_pass_is_refused(reference_pass, tmp_path):
    where, variants = _written(reference_pass, tmp_path)
    data, _ = judge_replay.case_file({}, [])                 # no cases at all
    (tmp_path / "cases.pt").write_bytes(data)
    with pytest.raises(replay.Unreadable, match="differs"):
        replay.load(where, variants)
    (tmp_path / "cases.pt").write_bytes(b"not a torch file")
    with pytest.raises(replay.Unreadable):
        replay.load({**where, "digest": digest(b"not a torch file")}, variants)
    (tmp_path / "cases.pt").unlink()
    with pytest.raises(replay.Unreadable):
        replay.load(where, variants)


def test_each_verified_variant_replays_once_between_shapes_of_the_first_pass(monkeypatch,
                                                                              tmp_path):
    """Never inside a timed batch (a shape's timing runs whole between two replays), never in
    the selection pass, and the control and torch variants (outputs unchecked) not at all."""
    import json
    import random
    from types import SimpleNamespace

    from perfloop.referee import launchers, selection
    from perfloop.referee import timer as worker

    labels = ["incumbent", "incumbent-again", "a", "b"]
    (tmp_path / "go.json").write_text(json.dumps({"labels": labels, "replay": {"path": "x"}}))
    w = worker.Timer.__new__(worker.Timer)
    w.spec = {"shapes": [{"name": f"s{i}", "dims": [8], "dtype": "float32"} for i in range(3)],
              "variants": [{"label": x} for x in labels], "go": str(tmp_path / "go.json")}
    w.settings = Measure(rounds=3, round_ms=5, warmup_ms=20, min_reps=3, max_reps=5)
    w.roster = launchers.Roster.__new__(launchers.Roster)
    w.roster.spec, w.roster.failed = w.spec, {}
    w.roster.launchers = {label: object() for label in labels}
    seen = []

    def time_shape(shape, labels, seed, index, settings):
        seen.append(("shape", shape.name))
        return {"rounds": {label: [[1.0]] for label in labels}}

    w.shapes = SimpleNamespace(unverified={"incumbent", "incumbent-again"},
                               time_shape=time_shape)
    w.replays = replay.Replays(w.roster, launchers.WallClock(), random.Random(1),
                               lambda *a, **k: None)
    cases = {label: [object()] for label in labels}
    monkeypatch.setattr(replay, "load", lambda where, variants: dict(cases))
    w.wait_for_go()
    assert set(w.replays.pending) == {"a", "b"}
    monkeypatch.setattr(w.replays, "replay", lambda label, c: seen.append(("replay", label)))
    passes = selection.Selection(w.spec, w.settings, w.release, w.roster, w.shapes, w.replays)
    passes.time_pass(labels, 0)
    first = list(seen)
    passes.time_pass(labels, 1)
    assert sorted(x for x in first if x[0] == "replay") == [("replay", "a"), ("replay", "b")]
    assert all(x[0] == "shape" for x in seen[len(first):])   # none in the second pass
    for label in ("a", "b"):                  # before shape number `spot`, or after the last
        at = first.index(("replay", label))
        assert sum(x[0] == "shape" for x in first[:at]) == w.replays.spots[label]
