"""The documentation's shape, checked against the code it describes: README stays a short door
(every command in its table, every link resolving, the test command CI runs); docs/ names
only modules that exist; the knob table says what the shipped catalog tries (a kernel author
builds `build` from it alone, so a catalog edit that the table misses would break their kernels
silently); each kernel's RESULTS.md is a current result, not a journal."""

import json
import re
import shlex
import tomllib

import pytest
from conftest import ROOT

from perfloop.cli import COMMANDS

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RESULTS = sorted((ROOT / "kernels").glob("*/RESULTS.md"))
PAGES = [README, ROOT / "playbook" / "README.md", *DOCS, *RESULTS]
LAYERS = ("core", "contract", "isolation", "store", "plan", "run", "measure", "child", "referee", "report", "commands",
          "fleet")


def _text(path) -> str:
    return path.read_text(encoding="utf-8")


def _knob_table() -> dict[str, str]:
    page = _text(ROOT / "docs" / "writing-a-kernel.md")
    return dict(re.findall(r"^\| `(\w+)` \| (.+?) \|", page, re.M))


def test_every_catalog_knob_is_in_the_knob_table_with_its_values():
    table = _knob_table()
    catalog = tomllib.loads(_text(ROOT / "playbook" / "catalog.toml"))["optimization"]
    page = _text(ROOT / "docs" / "writing-a-kernel.md")
    for entry in catalog:
        if "knobs" in entry:   # an entry moving several knobs: each in the table, it named
            assert all(k in table for k in entry["knobs"]), entry["knobs"]
            assert f"`{entry['id']}`" in page, f"docs/writing-a-kernel.md never names {entry['id']}"
            continue
        knob = entry["knob"]
        assert knob in table, f"docs/writing-a-kernel.md's knob table lacks {knob}"
        if knob == "tile":  # abbreviated there: its ends and the multi-row tiles
            for value in (entry["values"][0], entry["values"][-1]):
                assert f"`{json.dumps(value)}`" in table[knob], value
            continue
        listed = [json.loads(v) for v in re.findall(r"`([^`]+)`", table[knob])]
        assert listed == entry["values"], (knob, listed, entry["values"])


def test_readme_is_a_short_door():
    assert len(_text(README)) <= 12_000


def test_every_command_is_in_readmes_commands_table():
    rows = re.findall(r"^\| `(\w+)[ `]", _text(README), re.M)
    missing = [name for name in COMMANDS if name not in rows]
    assert not missing, f"README's commands table lacks {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(path) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", _text(path))
            if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_a_heading(page):
    assert DOCS, "docs/ holds no page"
    for link in _links(page):
        file, _, anchor = link.partition("#")
        target = (page.parent / file).resolve() if file else page
        assert target.exists(), f"{page.name}: {link} names no file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", _text(target), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{page.name}: {link}: no heading"


def test_readme_links_every_page_of_docs():
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in _links(README)}
    assert set(DOCS) <= linked, sorted(str(d) for d in set(DOCS) - linked)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_path_named_exists(page):
    """perfloop's files as the docs name them (perfloop/contract/outputs.py, or contract/outputs.py
    where the package is understood), so a module that moves cannot leave the docs behind."""
    layer = "|".join(LAYERS)
    named = set(re.findall(rf"(?<![\w/])((?:perfloop/)?(?:{layer})/\w+\.py)", _text(page)))
    named |= set(re.findall(r"(?<![\w/])(perfloop/\w+\.py|(?:tests|kernels)/[\w/]+\.\w+)",
                            _text(page)))
    for path in sorted(named):
        where = ROOT / path if path.split("/")[0] in ("perfloop", "tests", "kernels") \
            else ROOT / "perfloop" / path
        assert where.exists(), f"{page.relative_to(ROOT)} names {path}, which does not exist"


def test_readmes_test_command_is_the_one_ci_runs():
    block = _text(README).split("<!-- THE TEST COMMAND", 1)[1].split("-->", 1)[1]
    code = re.match(r"\s*\n((?:    .+\n)+)", block)[1]
    ci = _text(ROOT / ".ci" / "run")
    commands = [c.strip() for line in code.splitlines() for c in line.split("&&")]
    assert len(commands) >= 2
    for command in commands:
        words = shlex.split(command)
        if words[:2] == ["pip", "install"]:  # CI installs quietly, into its venv
            for spec in words[2:]:
                assert re.search(rf"pip install .*{re.escape(spec)}", ci), spec
        else:
            assert re.search(rf"^{re.escape(command)}\b", ci, re.M), command


@pytest.mark.parametrize("kernel", RESULTS, ids=lambda p: p.parent.name)
def test_a_kernels_results_is_its_current_result(kernel):
    text = _text(kernel)
    assert len(text) <= 6_000
    for section in ("**Machine:**", "## The run", "## Confirmation (one process)"):
        assert section in text, section


def test_every_shipped_kernel_declares_plain_knobs_its_restrict_allows():
    """`perfloop run --all --from plain` starts every shipped kernel where it started."""
    pytest.importorskip("cuda.tile")
    from perfloop.contract import knobspace, manifest

    for folder in sorted((ROOT / "kernels").glob("*/kernel.toml")):
        spec = manifest.load_spec(folder.parent, ROOT)
        assert spec.plain, f"{folder} declares no [plain] knobs"
        assert knobspace.space_for(folder.parent).why_not(spec.plain) is None, folder
