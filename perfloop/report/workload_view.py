"""The kernel at its workload: per timed shape (the benchmark's and held-out ones drawn from
kernel.toml's [workload]), cuTile against the best of its peers (torch.compile, PyTorch eager,
which is cuBLAS for a matmul, and the kernel's own competitors, e.g. Triton), its share of the
physical floor, and over the workload the geometric mean and the shapes below a bar. A pure
function of a bench's summarized pass (perfloop.measure.phases.summarize_pass), read as the
record types it (perfloop.store.records.ShapeSummary)."""

from __future__ import annotations

import math

from perfloop.core.vocab import CONTROL, INCUMBENT
from perfloop.store import records

BAR = 0.90   # issue 26: every held-out shape at least 0.90 of the best peer


def view(summary: dict, labels: dict, held_out: dict, seed: int | None, bar: float = BAR) -> dict:
    """`labels`: {label: shown name} of the variants timed; `held_out`: {shape name: its
    workload bucket} for the held-out shapes (a row names the bucket it ran as where the timer
    reported one: the kernel's own bucket() hook's). A shape's
    `vs_best_peer` is the best peer's time over cuTile's: 1.2 means cuTile is 1.2x faster,
    0.8 that it takes 1.25x the peer's time."""
    peers = [label for label in labels if label not in (INCUMBENT, CONTROL)]
    rows: list[dict] = []
    for name, shape in records.summary(summary).items():
        mine = shape.variants[INCUMBENT]
        timed = {p: shape.variants[p].median_ms for p in peers if p in shape.variants}
        best = min(timed, key=timed.__getitem__) if timed else None
        rows.append({
            "shape": name, "held_out": name in held_out,
            "bucket": shape.bucket or held_out.get(name),
            "own_bucket": shape.routed_from,   # where it ran as another (routed)
            **({"tuned": True} if shape.tuned else {}),   # ... any measured one's knobs
            "cutile_ms": round(mine.median_ms, 5),
            "best_peer": labels.get(best, best),
            "best_peer_ms": round(timed[best], 5) if best else None,
            "vs_best_peer": round(timed[best] / mine.median_ms, 3) if best else None,
            "share_of_floor": None if mine.share_of_floor is None
            else round(mine.share_of_floor, 3)})
    ratios = [r["vs_best_peer"] for r in rows if r["vs_best_peer"]]
    held = [r["vs_best_peer"] for r in rows if r["held_out"] and r["vs_best_peer"]]
    return {"seed": seed, "bar": bar, "shapes": rows,
            "geomean_vs_best_peer": _geomean(ratios),
            "geomean_held_out": _geomean(held),
            "below_bar": [r["shape"] for r in rows
                          if r["vs_best_peer"] is not None and r["vs_best_peer"] < bar]}


def _geomean(values: list[float]) -> float | None:
    return round(math.exp(sum(map(math.log, values)) / len(values)), 3) if values else None


def render(v: dict) -> list[str]:
    """The view as Markdown lines: one row per shape, then the means and the shapes below."""
    lines = [f"Workload (held-out shapes drawn with seed {v['seed']}): time of the best peer "
             "over cuTile's (above 1: cuTile faster)", "",
             "| shape | held out | bucket | cuTile ms | best peer | peer ms | peer / cuTile "
             "| share of floor |", "|:--|:--|:--|--:|:--|--:|--:|--:|"]
    for r in v["shapes"]:
        bucket = (f"{r['bucket']} (its own: {r['own_bucket']})" if r.get("own_bucket")
                  else r["bucket"])
        if r.get("tuned"):
            bucket = f"tuned once, nearest {bucket}"
        lines.append(f"| {r['shape']} | {'yes' if r['held_out'] else ''} | {bucket} | "
                     f"{r['cutile_ms']:.4f} | {r['best_peer'] or '-'} | "
                     f"{_num(r['best_peer_ms'], '.4f')} | {_num(r['vs_best_peer'], '.3f')} | "
                     f"{_num(r['share_of_floor'], '.3f')} |")
    below = ", ".join(v["below_bar"]) or "none"
    lines += ["", f"geometric mean, every shape: {_num(v['geomean_vs_best_peer'], '.3f')}; "
                  f"held-out shapes: {_num(v['geomean_held_out'], '.3f')}; below "
                  f"{v['bar']:.2f} of the best peer: {below}"]
    return lines


def _num(value, fmt: str) -> str:
    return format(value, fmt) if value is not None else "-"
