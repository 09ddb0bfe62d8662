"""Reviewing a run: `perfloop report` (text, --json, --html, --png) on real records of the
scripted kernel (the pure functions it is made of: tests/unit/report/test_review.py)."""

import base64
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser

import pytest
from conftest import Scratch, pythonpath

from perfloop.core.naming import show_value
from perfloop.report import review
from perfloop.store import records

# fast math: 20% everywhere; tile 1x2048 wins on the "big" bucket only (a dispatch keeps it
# there); occupancy 2 falls off a cliff, 8 gains 10%; mode=wrong fails the judge; mode
# crash-after-10 passes the judge and crashes when timed
SCRIPT = [{"when": {"fast_math": True}, "factor": {"*": 0.8}},
          {"when": {"tile": [1, 2048]}, "factor": {"head": 0.8, "tail": 0.8, "held:head": 0.8,
                                                  "held:tail": 0.8, "guard": 1.3,
                                                  "held:guard": 1.3}},
          {"when": {"occupancy": 2}, "factor": {"*": 15}},
          {"when": {"occupancy": 8}, "factor": {"*": 0.9}}]
FLOORS = {"head": 0.5, "guard": 0.25, "tail": 0.4}
# every key README lists for report's JSON, before issue 11
OLD_KEYS = {"kernel", "branch", "experiments", "counts", "correctness_failures", "headline",
            "shapes", "speedup", "best_iteration", "seconds_total", "wall_seconds",
            "seconds_per_phase", "stopped", "environment", "rows"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One whole run, stopped and confirmed: kept, reverted, failed and crashed experiments."""
    scratch = Scratch(tmp_path_factory.mktemp("report") / "repo")
    scratch.script(SCRIPT)
    scratch.add_optimization("inject_wrong", "mode", ["wrong"], priority=2)
    scratch.add_optimization("inject_crash", "mode", ["crash-after-10"], priority=5)
    scratch.commit_all("script")
    code, out, err = scratch.cli("run", "--kernel", "scripted")
    assert code == 0, err
    return scratch


def copy_of(scratch: Scratch, tmp_path) -> Scratch:
    """The finished run's repository, to change without touching the shared one."""
    other = object.__new__(Scratch)
    other.path = tmp_path / "copy"
    shutil.copytree(scratch.path, other.path, symlinks=True)
    other.kernel = other.path / "kernels" / "scripted"
    return other


def human(scratch, *args):
    proc = subprocess.run([sys.executable, "-m", "perfloop", *args], cwd=scratch.path, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": pythonpath()})
    return proc.returncode, proc.stdout, proc.stderr


def add_floors_and_bench(scratch: Scratch) -> None:
    """What a GPU run records and the scripted kernel's CPU clock cannot: a physical floor per
    shape and each variant's share of it; and a bench result in the format bench writes."""
    path = scratch.path / "sandbox/scripted/experiments.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    for record in recs:
        for part in ("shapes", "selection"):
            for name, shape in (((record.get("timing") or {}).get(part)) or {}).items():
                shape["floor_ms"] = FLOORS.get(name.removeprefix("held:"), 0.4)
                for v in shape["variants"].values():
                    v["share_of_floor"] = shape["floor_ms"] / v["median_ms"]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    final = [r for r in recs if r["kind"] != "confirmation" and r["status"] == "keep"][-1]
    rows = []
    for name, ours in (("head", 0.58), ("guard", 0.36), ("tail", 0.46)):
        for variant, ms in (("cutile", ours), ("cutile-again", ours),
                            ("torch-compile", ours * 0.9), ("torch-eager", ours * 2)):
            rows.append({"shape": name, "variant": variant, "median_ms": ms,
                         "ci_low_ms": ms * 0.99, "ci_high_ms": ms * 1.01, "host_us_per_call": 4.0,
                         "gbps": None, "share_of_floor": FLOORS[name] / ms,
                         "vs_cutile": ms / ours, "ratio_ci": [ms / ours, ms / ours]})
    (scratch.path / "sandbox/scripted/bench.json").write_text(json.dumps(
        {"kernel": "scripted", "knobs": final["knobs"], "rows": rows, "headline": "head"}))


# ---- the report of a finished run -----------------------------------------------------------
def test_report_tells_the_journey_the_final_knobs_and_the_confirmed_speedup(finished):
    recs = finished.records()
    code, r, err = finished.cli("report", "--kernel", "scripted")
    assert code == 0, err
    assert OLD_KEYS <= set(r)
    kept = [x for x in recs[1:] if x["status"] == "keep"]
    statuses = [x["status"] for x in recs]
    # the old counts (README: by status, the baseline included) stay as they were
    assert r["counts"] == {s: statuses.count(s) for s in set(statuses)}
    assert r["changes"]["kept"] == len(kept) == r["counts"]["keep"] - 1
    assert r["changes"]["crashed"] == 1 and r["changes"]["correctness_failures"] == 1
    journey = {j["iteration"]: j for j in r["journey"]}
    assert list(journey) == [x["iteration"] for x in kept]
    fast = next(j for j in r["journey"] if j["optimization"] == "fast_math")
    assert fast["changes"] == [{"knob": "fast_math", "bucket": None, "old": False, "new": True}]
    assert fast["gain"] == pytest.approx(0.2, abs=0.01)
    split = next(j for j in r["journey"] if j["optimization"] == "dispatch")
    assert split["changes"] == [{"knob": "tile", "bucket": "big", "old": [1, 1024],
                                 "new": [1, 2048]}]
    assert r["final"] == {"commit": finished.head(), "iteration": kept[-1]["iteration"],
                          "knobs": kept[-1]["knobs"]}
    [confirmation] = finished.confirmations()
    assert r["speedup"]["confirmed"] and r["speedup"]["method"] == "one-process confirmation"
    assert r["speedup"]["speedup"] == confirmation["shapes"]["head"]["speedup"]
    assert r["speedup"]["speedup"] == pytest.approx(1 / (0.8 * 0.8 * 0.9), rel=2e-3)
    head = next(sh for sh in r["shapes"] if sh["headline"])
    assert head["speedup_method"] == "one-process confirmation"
    assert head["incumbent_ms"] == pytest.approx(0.8 * 0.8 * 0.9, rel=2e-3)
    assert [sh["shape"] for sh in r["shapes"]] == ["head", "guard", "tail"]   # kernel.toml's order
    assert head["floor_ms"] is None and head["competitors"] == []   # a CPU clock, no bench
    assert r["stop_reason"] == r["stopped"] and r["stopped"]
    assert r["seconds_per_phase"]["confirmation"] == confirmation["wall_s"]
    assert r["seconds_per_phase"]["correctness"] > 0

    code, text, err = human(finished, "report", "--kernel", "scripted")
    assert code == 0 and err == ""
    first = text.splitlines()[0]
    assert (f"the baseline and {len(recs) - 1} changes ({len(kept)} kept, "
            f"{statuses.count('revert')} reverted, 1 crashed; 1 correctness failure)") in first
    assert "fast_math: false -> true" in text and "[big] tile: 1x1024 -> 1x2048" in text
    assert "occupancy: None -> 8" in text
    assert f"{r['speedup']['speedup']:.3f}x" in text and "timed in one process" in text
    assert f"final: commit {finished.head()[:12]}" in text
    assert f"stopped: {r['stopped']}" in text


def test_report_before_the_run_stops_says_the_speedup_is_not_confirmed(scratch):
    scratch.script(SCRIPT[:1])
    scratch.commit_all("script")
    assert scratch.cli("init", "--kernel", "scripted")[0] == 0
    assert scratch.cli("step", "--kernel", "scripted", "--opt", "fast_math")[0] == 0
    code, r, _ = scratch.cli("report", "--kernel", "scripted")
    assert code == 0 and not r["speedup"]["confirmed"] and r["speedup"]["ci"] is None
    assert "not confirmed" in r["speedup"]["method"]
    assert all(sh["speedup"] is None and sh["speedup_method"] is None for sh in r["shapes"])
    code, text, _ = human(scratch, "report", "--kernel", "scripted")
    assert "not confirmed in one process" in text and "multiply to 1.250x" in text
    assert "the baseline and 1 changes (1 kept, 0 reverted" in text
    # RESULTS.md says so, and may not go into the folder the next experiment commits
    code, r, _ = scratch.cli("report", "--kernel", "scripted", "--results", "sandbox/R.md")
    assert code == 0 and "Not confirmed: the run has not stopped" in (
        scratch.path / "sandbox/R.md").read_text()
    before = scratch.snapshot()
    code, r, _ = scratch.cli("report", "--kernel", "scripted", "--results",
                             "kernels/scripted/RESULTS.md")
    assert code == 2 and "the run has not stopped" in r["error"]
    assert scratch.snapshot() == before


def test_a_run_that_kept_nothing_reports_no_timed_speedup(scratch):
    """The confirmation of a run that kept nothing times nothing: its 1.000x is a ratio by
    definition, never shown as a measurement with a 95% interval."""
    scratch.script([])                     # no knob changes the time: every step is reverted
    scratch.commit_all("script")
    code, _, err = scratch.cli("run", "--kernel", "scripted")
    assert code == 0, err
    code, r, _ = scratch.cli("report", "--kernel", "scripted")
    assert code == 0 and r["changes"]["kept"] == 0
    assert r["speedup"]["method"] == review.NOTHING_KEPT and r["speedup"]["ci"] is None
    assert r["speedup"]["speedup"] == 1.0 and r["speedup"]["confirmed"]
    assert all(sh["speedup_ci"] is None and sh["speedup_method"] == review.NOTHING_KEPT
               for sh in r["shapes"])
    code, text, _ = human(scratch, "report", "--kernel", "scripted")
    assert "1.000x, nothing kept" in text and "1.000x (nothing kept)" in text
    assert "timed in one process" not in text and "(1.000-1.000)" not in text
    code, _, _ = scratch.cli("report", "--kernel", "scripted", "--results", "sandbox/R.md")
    page = (scratch.path / "sandbox/R.md").read_text()
    assert code == 0 and "Nothing was kept" in page and "(1.000-1.000)" not in page


def test_report_reads_floors_and_the_last_bench(finished, tmp_path):
    repo = copy_of(finished, tmp_path)
    add_floors_and_bench(repo)
    code, r, err = repo.cli("report", "--kernel", "scripted")
    assert code == 0, err
    head = next(sh for sh in r["shapes"] if sh["shape"] == "head")
    assert head["floor_ms"] == 0.5
    assert head["baseline_share_of_floor"] == pytest.approx(0.5, rel=1e-3)
    assert head["incumbent_share_of_floor"] == pytest.approx(0.5 / (0.8 * 0.8 * 0.9), rel=2e-3)
    compiled = {c["variant"]: c for c in head["competitors"]}
    assert set(compiled) == {"torch-compile", "torch-eager"}       # the kernel's own rows left out
    assert compiled["torch-compile"]["median_ms"] == pytest.approx(0.58 * 0.9)
    assert r["bench"]["same_knobs_as_final"] is True
    code, text, _ = human(repo, "report", "--kernel", "scripted")
    assert "torch-compile ms (bench)" in text and "0.500 -> 0.868" in text
    assert "which timed the final knobs" in text


# ---- RESULTS.md ------------------------------------------------------------------------------
WORKLOAD = [{"shape": "held:head", "bucket": "big", "cutile_ms": 0.61, "best_peer": "torch-compile",
             "best_peer_ms": 0.55, "vs_best_peer": [0.89, 0.91]}]


def test_results_page_is_the_current_result_from_the_record(finished, tmp_path):
    repo = copy_of(finished, tmp_path)
    add_floors_and_bench(repo)
    bench_path = repo.path / "sandbox/scripted/bench.json"
    bench = json.loads(bench_path.read_text())
    bench_path.write_text(json.dumps({**bench, "workload": WORKLOAD}))
    before = repo.snapshot()
    out = tmp_path / "RESULTS.md"
    code, r, err = repo.cli("report", "--kernel", "scripted", "--results", str(out))
    assert code == 0 and r["results"] == str(out), err
    assert repo.snapshot() == before                       # only the file it was asked for
    text = out.read_text(encoding="utf-8")
    assert len(text) <= 6000
    assert repo.table() in text                            # the table as written
    baseline = repo.records()[0]
    assert f"Python {baseline['environment']['python']}" in text
    [confirmation] = repo.confirmations()
    for name, c in confirmation["shapes"].items():
        lo, hi = c["speedup_ci"]
        assert re.search(rf"^\| {name}( \(headline\))? \| .* \| {c['speedup']:.3f}x "
                         rf"\({lo:.3f}-{hi:.3f}\) \|$", text, re.M), name
    assert "| head (headline) | torch-compile | 0.5220 | 0.958 | 0.900 (0.900-0.900) |" in text
    assert "timed the final knobs" in text
    assert "| held:head | big | 0.61 | torch-compile | 0.55 | 0.89-0.91 |" in text
    code, shown, _ = human(repo, "report", "--kernel", "scripted", "--results", str(out))
    assert code == 0 and f"RESULTS written to {out}" in shown


def test_results_may_replace_the_kernels_own_results_once_the_run_stopped(finished, tmp_path):
    repo = copy_of(finished, tmp_path)
    code, r, err = repo.cli("report", "--kernel", "scripted", "--results",
                            "kernels/scripted/RESULTS.md")
    assert code == 0, err
    assert (repo.kernel / "RESULTS.md").read_text().startswith("# scripted: the current result")
    assert r["results"] == str(repo.kernel / "RESULTS.md")
    code, r, _ = repo.cli("report", "--kernel", "scripted", "--results", "kernels/scripted/x.md")
    assert code == 2 and "is inside the kernel folder" in r["error"]
    assert not (repo.kernel / "x.md").exists()


# ---- files: HTML and PNG --------------------------------------------------------------------
class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.text, self.external = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        for name in ("src", "href"):
            if name in attrs and not attrs[name].startswith("data:"):
                self.external.append((tag, attrs[name]))
        if tag in ("script", "link", "iframe", "object"):
            self.external.append((tag, attrs))

    def handle_data(self, data):
        self.text.append(data)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


class Tables(HTMLParser):
    """Every table's rows, as lists of cell texts."""

    def __init__(self):
        super().__init__()
        self.tables, self.cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def parse_rows(path, first: str) -> dict:
    """{first cell: second cell} of the HTML table whose header starts with `first`."""
    tables = Tables()
    tables.feed(path.read_text(encoding="utf-8"))
    rows = next(t for t in tables.tables if t and t[0][0] == first)[1:]
    return {row[0]: json.loads(row[1]) if row[1].startswith("{") else row[1] for row in rows}


def parse(path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def test_html_is_self_contained_and_holds_the_report(finished, tmp_path):
    repo = copy_of(finished, tmp_path)
    add_floors_and_bench(repo)
    bench_path = repo.path / "sandbox/scripted/bench.json"
    shapes = [{"shape": name, "held_out": held, "bucket": "big", "cutile_ms": 0.5,
               "best_peer": "torch-compile", "best_peer_ms": 0.5 * ratio,
               "vs_best_peer": ratio, "share_of_floor": 0.5}
              for name, held, ratio in (("head", False, 1.1), ("held:x", True, 0.8))]
    bench_path.write_text(json.dumps({**json.loads(bench_path.read_text()), "workload": {
        "seed": 5, "bar": 0.9, "shapes": shapes, "geomean_vs_best_peer": 0.94,
        "geomean_held_out": 0.8, "below_bar": ["held:x"]}}))
    before = repo.snapshot()
    out = tmp_path / "report.html"
    code, r, err = repo.cli("report", "--kernel", "scripted", "--html", str(out))
    assert code == 0 and r["html"] == str(out), err
    assert repo.snapshot() == before                       # only the file it was asked for
    page = parse(out)
    assert page.external == []
    assert len(page.images) == 3                # latency, share of the floor, the workload
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        width, height = png_size(base64.b64decode(src.split(",", 1)[1], validate=True))
        assert width > 100 and height > 100
    text = " ".join(" ".join(page.text).split())
    for j in r["journey"]:
        assert j["diff"] in text and j["what"] in text
    final = parse_rows(out, "knob")
    assert final == {k: v if isinstance(v, dict) else show_value(v)
                     for k, v in r["final"]["knobs"].items()}
    table = json.dumps(r["final"]["knobs"]["dispatch"])    # the final dispatch table, with
    assert table in text and '"big": {"tile": [1, 2048]' in table  # the bucket's kept tile
    assert f"{r['speedup']['speedup']:.3f}x" in text and "timed in one process" in text
    assert "torch-compile ms (bench)" in text and r["stopped"] in text
    assert "The workload (last bench)" in text


def test_html_without_floors_says_so_and_draws_the_latency(finished, tmp_path):
    out, picture = tmp_path / "r.html", tmp_path / "latency.png"
    code, r, err = finished.cli("report", "--kernel", "scripted", "--html", str(out),
                                "--png", str(picture))
    assert code == 0, err
    page = parse(out)
    assert len(page.images) == 1 and "No physical floor was recorded" in " ".join(page.text)
    assert "No bench result recorded" in " ".join(page.text)
    assert png_size(picture.read_bytes())[0] > 100
    # the PNG alone is the HTML's latency figure
    assert base64.b64decode(page.images[0].split(",", 1)[1]) == picture.read_bytes()


@pytest.mark.parametrize("where,message", [
    ("kernels/scripted/report.html", "is inside the kernel folder"),
    ("kernels", "is a folder"),
    ("nowhere/report.html", "does not exist"),
])
def test_report_files_only_where_they_can_do_no_harm(finished, where, message):
    before = finished.snapshot()
    code, _, err = human(finished, "report", "--kernel", "scripted", "--html", where)
    assert code == 2 and err.startswith("perfloop: error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and finished.snapshot() == before
    code, out, _ = finished.cli("report", "--kernel", "scripted", "--png", where)
    assert code == 2 and message in out["error"]
    assert not (finished.kernel / "report.html").exists()


def test_without_matplotlib_the_html_report_says_how_to_get_it(finished, tmp_path):
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = {"PYTHONPATH": f"{shadow.parent}{os.pathsep}{pythonpath()}"}
    out = tmp_path / "r.html"
    code, r, _ = finished.cli("report", "--kernel", "scripted", "--html", str(out), env=env)
    assert code == 2 and "pip install 'matplotlib" in r["error"] and not out.exists()
    code, r, _ = finished.cli("report", "--kernel", "scripted", env=env)
    assert code == 0 and r["final"]


def test_latency_points_mark_each_outcome(finished):
    recs = finished.records()
    points = review.latency_points([records.from_dict(r) for r in recs], "head")
    assert [p["iteration"] for p in points] == [r["iteration"] for r in recs]
    by = {r["optimization"]: p for r, p in zip(recs, points)}
    assert by["inject_wrong"]["correctness"] == "FAIL" and by["inject_wrong"]["ms"] is None
    assert by["inject_crash"]["status"] == "crash" and by["inject_crash"]["ms"] is None
    assert by["fast_math"]["ms"] == pytest.approx(0.8, rel=2e-3)
    outcomes = {c["outcome"] for c in by["occupancy"]["candidates"]}
    assert "slow" in outcomes and "ok" in outcomes           # the cliff, and the timed others
    assert all(c["ms"] is not None for c in by["occupancy"]["candidates"]
               if c["outcome"] == "ok")


# ---- in a browser -----------------------------------------------------------------------------
def _browser():
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome",
                                           "google-chrome-stable") if shutil.which(n)), None)


@pytest.mark.browser
def test_html_renders_in_headless_chromium(finished, tmp_path):
    browser = _browser()
    if browser is None:
        pytest.skip("no chromium, chromium-browser or google-chrome on PATH")
    repo = copy_of(finished, tmp_path)
    add_floors_and_bench(repo)
    out = tmp_path / "report.html"
    assert repo.cli("report", "--kernel", "scripted", "--html", str(out))[0] == 0
    # a copy with a script that writes each image's decoded width into the page (the report
    # itself has no script)
    probe = tmp_path / "probe.html"
    probe.write_text(out.read_text().replace("</body>", (
        "<script>window.addEventListener('load', () => { const p = document.createElement('p');"
        " p.id = 'widths'; p.textContent = Array.from(document.images)"
        ".map(i => i.complete ? i.naturalWidth : -1).join(','); document.body.appendChild(p);"
        " });</script></body>")))
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert '<p id="widths">' in dom, dom[-2000:]
    widths = dom.split('<p id="widths">', 1)[1].split("<", 1)[0].split(",")
    assert len(widths) == 2 and all(int(w) > 100 for w in widths), widths
    assert "perfloop report: scripted" in dom and "Kept changes" in dom
    assert "fast_math: false -&gt; true" in dom or "fast_math: false -> true" in dom
