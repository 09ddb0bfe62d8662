"""Typed records (perfloop.store.records) for unit tests, from the few keys a test is about:
every key the types require and the test leaves out is filled with a neutral value, and the
result is read by the one reader the commands use (from_dict), so it is what a line holding
those keys would load as."""

import statistics

from perfloop.store import records

EXPERIMENT = {"schema": 1, "iteration": 0, "kind": "playbook", "optimization": "o",
              "status": "revert", "correctness": "PASS", "commit": "c", "ref": "r",
              "decision": {"reason": "why"}, "knobs": {}, "phases_s": {}, "latency_ms": None,
              "started_at": 0.0, "finished_at": 1.0}


def variant(stats: dict) -> dict:
    """A variant's statistics: its median and interval from its round medians when it has
    them (a test of paired comparisons sets only those)."""
    rounds = stats.get("round_medians_ms") or [stats.get("median_ms", 1.0)]
    median = stats.get("median_ms", statistics.median(rounds))
    return {"median_ms": median, "ci_low_ms": min(rounds), "ci_high_ms": max(rounds),
            "n": len(rounds), "round_medians_ms": rounds, **stats}


def versus(comparison: dict) -> dict:
    """A comparison with the incumbent: its interval the ratio itself unless set."""
    ratio = comparison["ratio"]
    return {"ci_low": ratio, "ci_high": ratio, "noise": 0.0, **comparison}


def shape_dict(shape: dict) -> dict:
    return {"bucket": None, "held_back": False, "floor_ms": None, "noise": 0.0, **shape,
            "variants": {k: variant(v) for k, v in shape.get("variants", {}).items()},
            "vs_incumbent": {k: versus(v) for k, v in shape.get("vs_incumbent", {}).items()}}


def summary(shapes: dict) -> dict[str, records.ShapeSummary]:
    """A timing pass, typed: {shape name: its (partial) summary}."""
    return records.summary({name: shape_dict(sh) for name, sh in shapes.items()})


def experiment(raw: dict) -> records.Experiment:
    """An experiment from the keys a test sets; its timing's shapes filled as summary's."""
    line = {**EXPERIMENT, **raw}
    timing = raw.get("timing")
    if timing is not None:
        line["timing"] = {"chosen": None, "labels": {}, **timing,
                          "shapes": {n: shape_dict(sh) for n, sh in timing["shapes"].items()},
                          **({"selection": {n: shape_dict(sh)
                                            for n, sh in timing["selection"].items()}}
                             if timing.get("selection") else {})}
    return records.Experiment.from_dict(line)


def experiments(raws: list[dict]) -> list[records.Experiment]:
    return [experiment(raw) for raw in raws]
