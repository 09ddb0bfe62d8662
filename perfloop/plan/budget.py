"""How long the next experiments will take, from the ones the run has done: what the time
budget ([stop] time_budget_s) decides with. Pure functions over the record.

An experiment's time is a screening part (when it has more candidates than [search]
screen_above: each compiled and timed at one shape) and the rest (judge, timing, commit),
which grows with the variants timed (its candidates past screening, the incumbent and its
control). The rest is estimated from the slowest experiment of the same kind so far, scaled by
its variants, so a tile step of 7 candidates is not taken for a 4-candidate step's 61 s (on an
H100 it took 88-110 s), nor a one-candidate step for a three-candidate step's 199 s (softmax on
an H200: a run stopped there with 145 s left; RMSNorm's next such step took 85 s after 173).
Only playbook experiments that timed their candidates to the end serve as references: a
baseline may hold a cold measurement of the device's ceilings, an agent edit is a person's,
and one that failed, crashed or fell off a cliff early says little of how long a full one
takes. A kind without such a reference is estimated from the slowest
reference of any kind (else from the slowest experiment).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfloop.core.naming import BUCKET_JOINT
from perfloop.core.naming import DISPATCH as DISPATCH_ID
from perfloop.core.naming import JOINT as JOINT_ID
from perfloop.core.vocab import Kind
from perfloop.store.records import Experiment

STEP, DISPATCH, JOINT = "step", "dispatch", "joint"


@dataclass(frozen=True)
class Spent:
    """One experiment's wall time, as the estimates need it."""

    kind: str           # STEP (the baseline, a catalog step, an agent edit), DISPATCH or JOINT
    seconds: float
    timed: int = 1      # candidates judged and timed (past screening)
    screened: int = 0   # candidates screened, when screening measured them (else 0)
    screen_s: float = 0.0
    reference: bool = True  # a playbook experiment that timed its candidates to the end

    @property
    def rest_s(self) -> float:
        return max(0.0, self.seconds - self.screen_s)


def spent(rec: Experiment) -> Spent:
    """A record's wall time, split as the estimates need it."""
    outcomes = [o.get("outcome") for o in (rec.outcomes or {}).values()]
    screen_s = rec.phases_s.get("screen", 0.0)  # (screen_compile is a part of it)
    screening = bool(rec.screening)
    screened = len(outcomes) if screening else 0
    # a screened search drops its cliffs while screening (in screen_s) and times its finalists
    # to the end: a reference for the next (estimated from a step instead, a search did not
    # fit: kernels/rmsnorm/NOTES.md)
    early = ("screened", "slow") if screening else ("screened",)
    spoils = ("crash",) if screening else ("crash", "slow")
    timed = sum(o not in early for o in outcomes) or 1
    reference = (rec.kind == Kind.PLAYBOOK and rec.timing is not None
                 and not any(o in spoils for o in outcomes))
    return Spent(kind_of(rec.optimization), rec.finished_at - rec.started_at, timed, screened,
                 screen_s if screened else 0.0, reference)


def kind_of(optimization: str | None) -> str:
    """The estimate's kind of an experiment by its optimization id."""
    if optimization == DISPATCH_ID:
        return DISPATCH
    return JOINT if optimization in (JOINT_ID, BUCKET_JOINT) else STEP


def estimate_s(kind: str, candidates: int, spent: list[Spent], *, screen_above: int,
               screen_keep: int, screen_s_per_config: float) -> float:
    """Seconds the next experiment of `kind` with `candidates` candidates is expected to take
    (0 with nothing spent yet)."""
    if not spent:
        return 0.0
    screening = candidates > screen_above
    timed = min(candidates, screen_keep) if screening else candidates
    references = [x for x in spent if x.reference]
    alike = [x for x in references if x.kind == kind] or references or spent
    rest = max(x.rest_s * (timed + 2) / (x.timed + 2) for x in alike)
    if not screening:
        return rest
    rates = [x.screen_s / x.screened for x in spent if x.screened]
    return rest + candidates * (max(rates) if rates else screen_s_per_config)


def over(spent: list[Spent], planned_s: list[float], budget: float | None) -> bool:
    """Whether the experiments planned (their estimates, in order) would end past the
    budget."""
    return bool(budget and spent
                and sum(x.seconds for x in spent) + sum(planned_s) > budget)

