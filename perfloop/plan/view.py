"""What the planner reads about a run, as plain values read once from the session: the
record, the incumbent, the kernel's contract and knob space, the pinned rules. The planner
never reads files, git or the session itself, so every plan is a pure function of a view."""

from __future__ import annotations

from dataclasses import dataclass

from perfloop.contract.kernel import KernelSpec
from perfloop.contract.knobspace import Space
from perfloop.contract.playbook import Playbook
from perfloop.store.records import Experiment


@dataclass(frozen=True)
class RunView:
    records: tuple[Experiment, ...]   # the experiments, in order
    knobs: dict              # the incumbent's knobs.json
    incumbent: str           # the incumbent's commit
    kernel_class: str
    spec: KernelSpec         # as pinned when the run started
    playbook: Playbook       # with the run's pinned rules
    space: Space             # the kernel's canonical() and restrict()
    profile: dict | None = None        # a recorded profile of the incumbent (perfloop profile)
    profile_rules: object = None       # playbook/profile_rules.toml (perfloop.plan.profile_rank)

    @property
    def rules(self):
        return self.playbook.rules
