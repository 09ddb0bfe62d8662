"""The playbook's settings a kernel (kernel.toml's [rules]) or a command's flags may set for one
run over rules.toml's: the ones a busy machine or a slow kernel needs changed, and none that
decides a verdict. Flags win over kernel.toml, kernel.toml over rules.toml; what results is
pinned with the run (State.rules), and the flags are kept beside it (State.overrides).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from perfloop.core.errors import UserError


@dataclass(frozen=True)
class Setting:
    key: str          # its name in kernel.toml's [rules], in rules.toml and in state.json
    section: str      # its table in rules.toml, which is its field of Rules
    flag: str         # the command-line flag
    wants: str        # the values it takes, in words
    pinned_at_start: bool   # only a new run takes the flag; else a run in progress may too

    def check(self, value, name: str):
        """The value as Rules holds it (0 where it means off: None), or UserError saying
        what `name` (the flag, or where the key was read) takes."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or not _ALLOWED[self.key](value):
            raise UserError(f"{name} takes {self.wants}, not {value!r}")
        return None if value == 0 and _OFF.get(self.key) else float(value)


# a gap of 100% or more could not refuse any baseline; a ratio of 1 would drop candidates
# that tie with the incumbent
_ALLOWED = {"max_control_gap": lambda v: 0 < v < 1,
            "cliff_ratio": lambda v: v == 0 or v > 1,
            "time_budget_s": lambda v: v >= 0}
_OFF = {"cliff_ratio": True, "time_budget_s": True}

SETTINGS = (
    Setting("max_control_gap", "verify", "--max-control-gap",
            "a share between 0 and 1 (0.1: the A/A control may differ by 10%)", True),
    Setting("cliff_ratio", "measure", "--cliff-ratio",
            "a ratio above 1 (a candidate that many times slower in its warm-up is dropped), "
            "or 0 to drop none", True),
    Setting("time_budget_s", "stop", "--time-budget",
            "seconds of experiments, or 0 for no budget", False),
)
BY_KEY = {s.key: s for s in SETTINGS}
KEYS = ", ".join(BY_KEY)


def from_table(raw, where: str) -> dict:
    """kernel.toml's [rules] table, checked: {key: value as Rules holds it}."""
    if not isinstance(raw, dict):
        raise UserError(f"{where}: [rules] must be a table, e.g. [rules] time_budget_s = 900")
    unknown = [k for k in raw if k not in BY_KEY]
    if unknown:
        raise UserError(f"{where}: [rules] sets only {KEYS} (the others are the "
                        f"playbook's, in rules.toml), not '{unknown[0]}'")
    return {key: BY_KEY[key].check(value, f"{where}: [rules] {key}")
            for key, value in raw.items()}


def apply(rules, overrides: dict):
    """`rules` (perfloop.contract.playbook.Rules) with `overrides` ({key: value}) in force."""
    for key, value in overrides.items():
        section = BY_KEY[key].section
        rules = dataclasses.replace(rules, **{section: dataclasses.replace(
            getattr(rules, section), **{key: value})})
    return rules


def in_force(rules) -> dict:
    """{key: value} of these settings in `rules`."""
    return {s.key: getattr(getattr(rules, s.section), s.key) for s in SETTINGS}
