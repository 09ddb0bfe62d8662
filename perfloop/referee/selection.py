"""The timer's run: a pass of every variant over the shapes, and with `select` the candidate to
carry into the decision (perfloop.plan.decide), timed again against the incumbent in a fresh
pass; the method the record states.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from perfloop.contract.kernel import Shape
from perfloop.contract.playbook import Measure
from perfloop.core import envinfo, stats
from perfloop.core.vocab import CONTROL, INCUMBENT, Outcome
from perfloop.referee import ceilings
from perfloop.referee.launchers import Release, Roster
from perfloop.referee.replay import Replays
from perfloop.referee.shape_timing import CHECKS_PER_BATCH, ShapeTimer


class Selection:
    held_back_skipped = False   # a pass found no gain at the benchmark's shapes

    def __init__(self, spec: dict, settings: Measure, release: Release, roster: Roster,
                 shapes: ShapeTimer, replays: Replays):
        self.spec, self.settings, self.roster = spec, settings, roster
        self.shapes, self.replays = shapes, replays
        self.labels, self.select = release.labels, release.select

    def run(self) -> dict:
        env = envinfo.capture(self.shapes.gpu)
        self.shapes.ceilings = (ceilings.get(Path(self.spec["ceilings_cache"]), env,
                                             ceilings_clock()) if self.shapes.gpu else None)
        labels, seed = self.labels, self.spec.get("seed", 0)
        # with a selection pass to follow, the first chooses at the benchmark's shapes only:
        # the held-back ones, each a compile per variant, are timed for the chosen one
        selecting = self.select and len(self._candidates(labels)) > 1
        passes = [self.time_pass(labels, seed, held_back=not selecting)]
        for (label, name), ratio in self.shapes.cliffed.items():  # timed at every other shape
            self.roster.fail(label, f"at {name} its warm-up ran {ratio:.1f}x slower than the "
                                    "incumbent's: dropped as a cliff there", Outcome.SLOW)
        best = None
        candidates = self._candidates(labels)
        if self.select and len(candidates) > 1 and passes[0]["shapes"]:
            best = _fastest(passes[0], candidates, self.spec["headline"],
                            self.spec.get("regression_tolerance", 0.0))
        elif len(candidates) == 1:
            best = candidates[0]
        if best is not None and selecting:  # (re-timed at every shape, held-back ones too)
            passes.append(self.time_pass([INCUMBENT, CONTROL, best], seed + 1, cliffs=False))
        first_shape: dict = next(iter(passes[-1]["shapes"].values()), {})
        reps = first_shape.get("reps", 0)
        return {"environment": env, "ceilings": self.shapes.ceilings,
                "failed": {k: v for k, v in self.roster.failed.items() if k in labels},
                "passes": passes, "best": best, "method": self._method(reps, len(passes))}

    def time_pass(self, labels: list[str], seed: int, cliffs: bool = True,
                  held_back: bool = True) -> dict:
        """Every variant of `labels` at every shape (`held_back` False: the benchmark's only;
        with spec "held_back" "if-gain", the held-back ones only where may_gain)."""
        settings = self.settings if cliffs else Measure(**{**vars(self.settings),
                                                           "cliff_ratio": None})
        shapes: dict[str, dict] = {}
        gainless = None
        for index, raw in enumerate(self.spec["shapes"]):
            self.replays.due(index, labels)  # (the first pass's: no timed batch holds one)
            shape = Shape.from_dict(raw)
            if shape.held_back and not held_back:
                continue
            if shape.held_back and self.spec.get("held_back") == "if-gain":
                if gainless is None:  # (the benchmark's shapes come first)
                    gainless = not may_gain(shapes, self._candidates(labels),
                                            self.spec.get("min_gain", 0.0))
                if gainless:
                    self.held_back_skipped = True
                    continue
            if INCUMBENT not in self.roster.active(labels):
                break
            timed = self.shapes.time_shape(shape, labels, seed, index, settings)
            if timed is not None:
                shapes[shape.name] = timed
        self.replays.due(None, labels)
        return {"labels": labels, "shapes": shapes}

    def _candidates(self, labels: list[str]) -> list[str]:
        """The candidates of `labels` (after the incumbent and its control) not failed yet."""
        return [label for label in labels[2:] if label not in self.roster.failed]

    def _method(self, reps: int, passes: int) -> dict:
        clock = ({"clock": "simulated: kernel.py's simulated_ms (perfloop's test kernels only; "
                           "nothing was timed)"} if self.shapes.simulated is not None
                 else self.shapes.clock.describe())
        return {**clock, **vars(self.settings), "reps_per_round": reps,
                "batch": "each variant in a launcher process of its own; per round one batch "
                         "of N launches on N slots of inputs drawn afresh for the batch",
                "order": "a random order per shape, reversed every round",
                "verified": f"{CHECKS_PER_BATCH} launches per batch of every variant, chosen at "
                            "random, against the float64 reference computed by the trusted "
                            "timer",
                "bracket": "the least of a few empty batches of a launcher that runs no "
                           "variant's code, taken off every variant's batches alike where each "
                           "ran at least twice as long (the shape's bracket_subtracted), else "
                           "off none",
                "selection": "best candidate re-timed in fresh rounds" if passes > 1
                else "single pass",
                "replayed": dict(self.replays.replayed),
                **({"held_back": "not timed: no candidate was faster than the incumbent at "
                                 "any benchmark shape by a gain the rules count (min_gain), so "
                                 "none could be kept"}
                   if self.held_back_skipped else {})}


def may_gain(shapes: dict, candidates: list[str], min_gain: float = 0.0) -> bool:
    """Whether some candidate passes the keep rule (perfloop.core.stats real_gain, without the
    A/A control's noise, so never stricter than the decision) against the incumbent at some
    shape timed so far: a keep needs that at a benchmark shape, so without it the held-back
    shapes, which only guard a keep, are not timed."""
    for shape in shapes.values():
        rounds = shape["rounds"]
        if INCUMBENT not in rounds:
            continue
        base = [statistics.median(r) for r in rounds[INCUMBENT]]
        for label in candidates:
            if label not in rounds or len(rounds[label]) != len(base):
                continue
            ratio = stats.compare(base, [statistics.median(r) for r in rounds[label]])
            if stats.real_gain(ratio, min_gain):   # (NaN: a lost batch proves nothing)
                return True
    return False


def _fastest(first_pass: dict, candidates: list[str], headline: str, tolerance: float) -> str:
    """The candidate to carry into the decision: the fastest at the headline among those no
    slower than the incumbent (beyond `tolerance`) at any shape; the fastest at the headline
    when every candidate loses somewhere (the decision then reverts, saying where)."""
    ratios: dict[str, dict] = {label: {} for label in candidates}
    for name, shape in first_pass["shapes"].items():
        inc = [statistics.median(r) for r in shape["rounds"][INCUMBENT]]
        for label in candidates:
            if label in shape["rounds"]:
                mine = [statistics.median(r) for r in shape["rounds"][label]]
                ratios[label][name] = stats.compare(inc, mine).ratio
            elif label in shape.get("cliffs", {}):
                ratios[label][name] = shape["cliffs"][label]
    alive = [c for c in candidates if ratios[c]]
    safe = [c for c in alive if max(ratios[c].values()) <= 1 + tolerance]
    return min(safe or alive or candidates,
               key=lambda label: ratios[label].get(headline, float("inf")))


def ceilings_clock():
    from perfloop.referee.clock import CudaClock

    return CudaClock()
