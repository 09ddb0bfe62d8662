"""What one experiment's measurement is given and gives back, as data: where its children run
(Place), what they measure (Plan), what they found (Measured). perfloop.measure.measurement
measures; a fleet's driver and workers pass these along (perfloop.fleet)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from perfloop.core.vocab import Kind

if TYPE_CHECKING:   # (for the annotations only: this module stays plain data)
    from perfloop.contract.playbook import Rules
    from perfloop.isolation.sandbox import Confinement
    from perfloop.measure.phases import Timing
    from perfloop.store.pinned import Pinned


@dataclass(frozen=True)
class Place:
    """Where an experiment's children run, and what they may read."""

    root: Path                  # the folder whose sources children compile as the bootstrap does
    work: Path                  # this experiment's own folder: the children's files
    pinned: Pinned              # the run's pinned tree (perfloop.store.pinned.Pinned)
    env: dict                   # the children's environment (perfloop.measure.phases.child_env)
    confinement: Confinement    # how children that run kernel code are confined (core.sandbox)
    cache: Path                 # the compile caches, one per code
    ceilings_cache: Path        # the device's measured ceilings
    # of the files a child imported, those no experiment pins (a verdict reached beside them
    # counts for nothing)
    foreign: Callable[[set], list[str]] = lambda imported: []


@dataclass
class Plan:
    """What an experiment measures: the incumbent (from its commit), its A/A control, and the
    candidates (none for a baseline, which judges the incumbent itself)."""

    kind: Kind
    iteration: int
    incumbent: dict             # {label, folder, knobs}
    control: dict
    candidates: list            # to judge and time
    finalists: dict             # candidate label -> its declared finalists' variants, judged too
    shapes: list                # the timed shapes (perfloop.contract.workload.timer_shapes)
    choosing: str               # where the fastest candidate is chosen
    tolerance: dict
    rules: Rules                # the run's rules (perfloop.contract.playbook.Rules)
    requires_gpu: bool
    deadline: float             # monotonic
    only_buckets: list | None = None
    always: list = field(default_factory=list)
    # False: its candidates passed the judge already (a fleet's fresh selection pass on
    # another GPU, perfloop.fleet.task.selection): timed only
    judge: bool = True

    @property
    def judged(self) -> list:
        """The variants the judge runs: the candidates (a baseline's: the incumbent)."""
        return self.candidates

    def timed(self, control: bool = True) -> list:
        """The incumbent, its A/A control, then the candidates (none for a baseline)."""
        head = [self.incumbent] + ([self.control] if control else [])
        return head + (self.candidates if self.kind != Kind.BASELINE else [])


@dataclass
class Measured:
    """What a measurement found, as data."""

    outcome: dict = field(default_factory=dict)     # label -> (Outcome, why), judged ones
    judged: Any = None                              # perfloop.measure.judge.JudgeResult
    timing: Timing | None = None                    # perfloop.measure.phases.Timing
    passes: list = field(default_factory=list)      # summaries of the timing's passes
    best: str | None = None                         # the label the decision is about
    judge_passed: bool = False                      # some candidate passed the judge
    phase_s: dict = field(default_factory=dict)
    compile_ahead: dict = field(default_factory=dict)
    where: dict = field(default_factory=dict)       # which machine and device measured it
