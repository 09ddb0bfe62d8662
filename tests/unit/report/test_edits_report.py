"""The change each --describe experiment made, in the report (--json, text, --html) and in
RESULTS.md (--results): its diff against the incumbent it was compared with, cut when long."""

from perfloop.report import htmlpage, results, review
from perfloop.store import records

DIFF = "".join(f"+# line {i}\n" for i in range(300))


def _record(iteration: int, kind: str) -> records.Experiment:
    return records.Experiment.from_dict(
        {"schema": 1, "iteration": iteration, "kind": kind, "optimization": "o",
         "describe": "my edit" if kind == "agent" else None, "status": "revert",
         "correctness": "PASS", "commit": "c" * 40, "ref": f"refs/perfloop/b/iter-{iteration:02d}",
         "incumbent_before": "a" * 40, "decision": {"reason": "no gain"}, "knobs": {},
         "phases_s": {}, "latency_ms": None, "started_at": 0.0, "finished_at": 1.0})


def test_a_long_diff_is_cut_to_whole_lines_and_says_how_much_is_left_out():
    assert review.clip("a\nb\n", 10, 100) == ("a\nb\n", 0)
    shown, left = review.clip(DIFF, 120, 100000)
    assert shown.count("\n") == 120 and left == 180 and shown.endswith("line 119\n")
    shown, left = review.clip(DIFF, 120, 50)
    assert len(shown) <= 50 and shown.endswith("\n") and left == 300 - shown.count("\n")
    assert review.clip("", 10, 10) == ("", 0)


def test_each_describe_experiment_carries_its_diff_and_how_to_see_the_rest():
    recs = [_record(0, "baseline"), _record(1, "agent"), _record(2, "playbook"),
            _record(3, "agent")]
    edits = review.agent_edits(recs, {1: DIFF, 3: None})
    assert [e["iteration"] for e in edits] == [1, 3]
    first, gone = edits
    assert first["describe"] == "my edit" and first["incumbent_before"] == "a" * 40
    assert first["commit"] == "c" * 40 and first["show"] == "git show refs/perfloop/b/iter-01"
    assert first["diff"].count("\n") == review.DIFF_LINES
    assert first["diff_lines_left_out"] == 300 - review.DIFF_LINES
    assert "git show refs/perfloop/b/iter-01" in first["note"]
    assert gone["diff"] is None and "not in this repository" in gone["note"]


def test_the_html_shows_each_diff_escaped():
    edit = review.agent_edits([_record(1, "agent")], {1: "+<script>alert(1)</script>\n"})
    page = htmlpage.page({"kernel": "k", "branch": "b"}, [], [("Your edits", edit)])
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>" not in page
    assert '<pre class="diff">' in page and "git show refs/perfloop/b/iter-01" in page


def test_results_md_holds_the_diffs_within_its_own_limit():
    edits = review.agent_edits([_record(1, "agent"), _record(2, "agent")],
                               {1: "+```\n" + DIFF, 2: "+x = 1\n"})
    facts = results.RunFacts(kernel="k", branch="b", started_at=0.0, stopped=None,
                             environment=None, table="", shapes=["head"], headline="head",
                             confirmation=None, edits=tuple(edits))
    page = results.page(facts)
    assert "## Edits judged (--describe)" in page and "````diff" in page   # a fence that holds ```
    section = page[page.index("## Edits judged"):]
    assert len(section) < results.EDITS_LIMIT + 800 and len(page) <= results.LIMIT
    assert "more lines of the diff left out" in section
    assert "- iteration 2, revert: my edit (`git show refs/perfloop/b/iter-02`)" in section
