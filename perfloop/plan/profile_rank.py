"""Profiler evidence re-ranks the playbook's suggestions: the rules of
playbook/profile_rules.toml applied, as a pure function, to the metrics of a recorded profile.
Which metrics `perfloop profile` asks ncu for is in the same file."""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from pathlib import Path

from perfloop.core.errors import UserError
from perfloop.contract.playbook import SHIPPED, read_toml
from perfloop.plan.decide import Suggestion

FILE = "profile_rules.toml"
OPS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
       "<": operator.lt, ">": operator.gt}


@dataclass(frozen=True)
class Condition:
    key: str          # a key of [metrics]
    op: str
    threshold: float

    def holds(self, value: float) -> bool:
        return OPS[self.op](value, self.threshold)


@dataclass(frozen=True)
class Rule:
    name: str
    when: tuple[Condition, ...]
    move: dict        # catalog id or family -> rank shift (negative: earlier)
    why: str = ""
    kernels: tuple = ()   # classes or tags it is limited to; () for every kernel


@dataclass(frozen=True)
class ProfileRules:
    metrics: dict     # key -> candidate metric names, first reported wins
    rules: tuple[Rule, ...]

    def requested(self) -> list[str]:
        return list(dict.fromkeys(n for names in self.metrics.values() for n in names))


def _condition(key: str, text, where: str) -> Condition:
    if isinstance(text, str):
        for op in sorted(OPS, key=len, reverse=True):
            if text.strip().startswith(op):
                try:
                    return Condition(key, op, float(text.strip()[len(op):]))
                except ValueError:
                    break
    raise UserError(f"{where}: condition {key} = {text!r} must be '<op> <number>' with op one "
                    f"of {' '.join(OPS)}")


def load(directory: Path) -> ProfileRules:
    """The playbook's profile rules, or perfloop's own where the playbook has none."""
    path = directory / FILE
    if not path.exists():
        path = SHIPPED / FILE
    raw = read_toml(path)
    metrics = raw.get("metrics", {})
    if not isinstance(metrics, dict) or not all(
            isinstance(v, list) and v and all(isinstance(n, str) for n in v) for v in metrics.values()):
        raise UserError(f"{path}: [metrics] maps keys to lists of metric names")
    rules = []
    for i, r in enumerate(raw.get("rule", [])):
        where = f"{path}: rule {r.get('name', i + 1)}"
        when, move = r.get("when"), r.get("move")
        if not isinstance(when, dict) or not when or not isinstance(move, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in move.values()):
            raise UserError(f"{where} needs `when` (conditions) and `move` (integer shifts)")
        unknown = [k for k in when if k not in metrics]
        if unknown:
            raise UserError(f"{where}: {', '.join(unknown)} is not a key of [metrics]")
        rules.append(Rule(str(r.get("name", f"rule {i + 1}")),
                          tuple(_condition(k, v, where) for k, v in when.items()), dict(move),
                          str(r.get("why", "")), tuple(r.get("kernels", ()))))
    return ProfileRules(dict(metrics), tuple(rules))


def _show(key: str, metrics: dict, cond: Condition) -> str:
    m = metrics[key]
    unit = m.get("unit") or ""
    unit = unit if unit in ("%", "") else f" {unit}"
    return f"{m['metric']} = {m['value']:g}{unit} ({cond.op} {cond.threshold:g})"


def firing(rules: ProfileRules, metrics: dict, kernel_class: str, tags: tuple = ()) -> list[tuple]:
    """[(rule, its conditions shown with the measured values)] for each rule whose every
    condition holds on the profile (a metric the profile lacks holds no condition)."""
    out = []
    for rule in rules.rules:
        if rule.kernels and not ({kernel_class, *tags} & set(rule.kernels)):
            continue
        if all(c.key in metrics and metrics[c.key].get("value") is not None
               and c.holds(metrics[c.key]["value"]) for c in rule.when):
            out.append((rule, "; ".join(_show(c.key, metrics, c) for c in rule.when)))
    return out


def adjust(ranked: list[Suggestion], metrics: dict, rules: ProfileRules, kernel_class: str,
           tags: tuple = (), source: str = "the profile") -> list[Suggestion]:
    """The suggestions re-ranked by the rules that fire on `metrics` ({key: {metric, value,
    unit}}), best first; each moved suggestion's reason starts with the metric that moved it."""
    fired = firing(rules, metrics, kernel_class, tags)
    out = []
    for order, sg in enumerate(ranked):
        opt = sg.optimization
        moves = [(rule.move.get(opt.id, rule.move.get(opt.family)), rule, shown)
                 for rule, shown in fired]
        moves = [m for m in moves if m[0]]
        if not moves:
            out.append((sg.rank, order, sg))
            continue
        shift, rule, shown = max(moves, key=lambda m: abs(m[0]))
        way = f"up {-shift}" if shift < 0 else f"down {shift}"
        because = f"{source}: {shown}, {rule.name}, moved it {way}"
        if rule.why:
            because += f" ({rule.why})"
        out.append((sg.rank + shift, order,
                    dataclasses.replace(sg, rank=sg.rank + shift, reason=f"{because}. {sg.reason}")))
    out.sort(key=lambda item: item[:2])
    return [sg for _, _, sg in out]
