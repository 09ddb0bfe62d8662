"""A command that fails after an experiment's record line says that the iteration was
recorded (exit 1), as docs/agent-protocol.md promises, never 'nothing changed' or 'nothing
was recorded'."""

import argparse
import errno

import pytest

from perfloop import cli
from perfloop.core.errors import AfterRecord, EnvironmentFailure, UserError
from perfloop.core import errors
from perfloop.run import recorded
from perfloop.store.records import Experiment

RECORD = Experiment.from_dict({
    "schema": 1, "iteration": 3, "kind": "playbook", "optimization": "fast_math",
    "status": "keep", "correctness": "PASS", "commit": "c" * 40, "ref": "refs/perfloop/b/iter-03",
    "decision": {"reason": "r"}, "knobs": {}, "phases_s": {"total": 1.0}, "latency_ms": 1.0,
    "started_at": 0.0, "finished_at": 1.0})


@pytest.mark.parametrize("raised,words", [
    (UserError("kernel.py restrict() failed: KeyError: 'x'"), "restrict() failed"),
    (EnvironmentFailure("git failed (lock): fix that, then `perfloop run --resume` runs the "
                        "unrecorded experiment again", during=True,
                        cause="git failed (lock): fix that"), "git failed (lock): fix that"),
    (OSError(errno.ENOSPC, "No space left on device", "/x/state.json"),
     "No space left on device (/x/state.json, on the filesystem mounted at"),
])
def test_a_failure_past_the_record_says_the_iteration_was_recorded(raised, words):
    with pytest.raises(AfterRecord) as caught:
        with recorded.past(RECORD, "finishing it", recorded.FINISH):
            raise raised
    said = str(caught.value)
    assert said.startswith("iteration 3 was recorded (keep), but finishing it failed: ")
    assert words in said and said.endswith(recorded.FINISH)
    assert "unrecorded" not in said and "nothing was recorded" not in said
    assert caught.value.exit_code == 1


def test_a_bug_past_the_record_keeps_its_traceback_and_says_it_was_recorded(tmp_path,
                                                                           monkeypatch, capsys):
    monkeypatch.setattr(errors.tempfile, "gettempdir", lambda: str(tmp_path))
    args = argparse.Namespace(json=False, command="step")
    try:
        with recorded.past(RECORD, "answering", "`perfloop status` shows it"):
            raise KeyError("boom")
    except KeyError as exc:
        assert cli._internal(args, exc) == 1
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1
    assert line.startswith("perfloop: error: iteration 3 was recorded (keep), but an internal "
                           "error followed: KeyError: 'boom' (traceback in ")
    assert line.endswith("`perfloop status` shows it")
    assert "Traceback" in next(tmp_path.glob("perfloop-crash-*.log")).read_text()


def test_interruptions_and_answers_already_after_the_record_pass_through():
    for raised in (KeyboardInterrupt(), AfterRecord("iteration 3 was recorded (keep), but")):
        with pytest.raises(type(raised)) as caught:
            with recorded.past(RECORD, "finishing it", recorded.FINISH):
                raise raised
        assert caught.value is raised
