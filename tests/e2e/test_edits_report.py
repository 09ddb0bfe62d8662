"""The change a --describe step made, as `perfloop report` shows it after a real step
(--json, text, --html, --results); the pieces alone: tests/unit/report/test_edits_report.py."""

import json
import os
import re
import subprocess
import sys

from conftest import pythonpath

from perfloop.report import results

DIFF = "".join(f"+# line {i}\n" for i in range(300))


def test_report_shows_what_a_describe_step_changed(started, tmp_path):
    kernel = started.kernel / "kernel.py"
    kernel.write_text(kernel.read_text() + "\n# <an edit> of mine\n" + DIFF.replace("+", ""))
    code, out, err = started.cli("step", "--kernel", "scripted", "--describe", "a long comment")
    assert code == 0, err
    ref = out["experiment"]["ref"]
    code, rep, err = started.cli("report", "--kernel", "scripted", "--html",
                                 str(tmp_path / "r.html"), "--results", str(tmp_path / "R.md"))
    assert code == 0, err
    (edit,) = rep["edits"]
    assert edit["iteration"] == 1 and edit["describe"] == "a long comment"
    assert edit["incumbent_before"] == started.records()[1]["incumbent_before"]
    assert edit["diff"].startswith("diff --git a/kernels/scripted/kernel.py")
    assert "+# <an edit> of mine" in edit["diff"] and edit["diff_lines_left_out"] > 0
    assert edit["show"] == f"git show {ref}" and ref in edit["note"]
    html = (tmp_path / "r.html").read_text()
    assert "+# &lt;an edit&gt; of mine" in html and f"git show {ref}" in html
    markdown = (tmp_path / "R.md").read_text()
    assert re.search(r"```diff\n.*\+# <an edit> of mine", markdown, re.S)
    assert len(markdown) <= results.LIMIT
    proc = subprocess.run([sys.executable, "-m", "perfloop", "report", "--kernel", "scripted"],
                          cwd=started.path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": pythonpath()})
    assert proc.returncode == 0, proc.stderr
    assert f"iteration 1 {edit['status']}" in proc.stdout and f"`git show {ref}`" in proc.stdout
    assert json.dumps(rep)   # (strict JSON, as every answer)
