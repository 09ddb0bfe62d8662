"""What the planner hands the loop: one experiment to run (a Proposal), or why to stop."""

from __future__ import annotations

from dataclasses import dataclass

from perfloop.contract.playbook import Optimization, thaw
from perfloop.core.vocab import Kind


@dataclass(frozen=True)
class Proposal:
    kind: Kind
    optimization: Optimization | None = None
    values: tuple = ()
    describe: str = ""
    sampler: dict | None = None   # what chose a joint search's configs (search.JointPlan)

    @property
    def name(self) -> str:
        if self.kind == Kind.BASELINE:
            return "baseline"
        if self.kind == Kind.AGENT:
            return "agent-edit"
        return self.optimization.id

    def to_json(self) -> dict:
        out = {"kind": self.kind, "optimization": self.name, "values": thaw(self.values),
               "describe": self.describe}
        return {**out, "sampler": self.sampler} if self.sampler else out
