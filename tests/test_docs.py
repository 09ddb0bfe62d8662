"""README's table of knobs says what the shipped catalog tries: a kernel author builds `build`
from it alone, so a catalog edit that the table misses would break their kernels silently."""

import json
import re
import tomllib

from conftest import ROOT


def _table() -> dict[str, str]:
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \|", (ROOT / "README.md").read_text(), re.M)
    return dict(rows)


def test_every_catalog_knob_is_in_the_readme_with_its_values():
    table = _table()
    catalog = tomllib.loads((ROOT / "playbook" / "catalog.toml").read_text())["optimization"]
    for entry in catalog:
        knob = entry["knob"]
        assert knob in table, f"README's knob table lacks {knob}"
        if knob == "tile":  # abbreviated there: its ends and the multi-row tiles
            for value in (entry["values"][0], entry["values"][-1]):
                assert f"`{json.dumps(value)}`" in table[knob], value
            continue
        listed = [json.loads(v) for v in re.findall(r"`([^`]+)`", table[knob])]
        assert listed == entry["values"], (knob, listed, entry["values"])
