"""What to try next: the playbook's ranking for this kernel's class, derived from the record."""

from __future__ import annotations

from perfloop import decide
from perfloop.session import Session


def penalties(s: Session, recs: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for record in recs:
        if record.get("decision", {}).get("lower_family") and record.get("family"):
            out[record["family"]] = out.get(record["family"], 0) + \
                s.playbook.rules.decision.family_penalty
    return out


def suggestions(s: Session) -> list[decide.Suggestion]:
    recs = s.records()
    tried = {r["optimization"] for r in recs if r["kind"] == "playbook"}
    knobs = s.incumbent_knobs()
    return decide.rank(s.playbook.optimizations, s.state.kernel_class, knobs,
                       s.spec.candidates, tried, penalties(s, recs), s.spec.tags)
