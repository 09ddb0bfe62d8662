"""The report's figures, drawn with matplotlib's Agg canvas (no pyplot, no window, no display):
latency per iteration per shape, and each shape's share of the physical floor."""

from __future__ import annotations

import io

from perfloop.core.errors import UserError
from perfloop.core.vocab import Correctness, Outcome, Status

FAILED = "fail"   # an experiment reverted for correctness: drawn apart from other reverts
# experiment outcome -> (marker, colour, filled, legend label)
EXPERIMENT_STYLE = {
    Status.KEEP: ("o", "#2a9d45", True, "kept"),
    Status.REVERT: ("o", "#e07b00", False, "reverted"),
    FAILED: ("X", "#b5179e", True, "correctness FAIL (reverted)"),
    Status.CRASH: ("X", "#c1121f", True, "crashed"),
}
# a candidate that lost inside an experiment: timed (ok), or why it was not
CANDIDATE_STYLE = {
    Outcome.OK: (".", "#9a9a9a", "other candidate, timed"),
    Outcome.FAIL: ("x", "#b5179e", "candidate failed"),
    Outcome.CRASH: ("x", "#c1121f", "candidate crashed"),
    Outcome.SLOW: ("^", "#8d5524", "candidate dropped: cliff (slow)"),
    Outcome.SCREENED: ("v", "#6c757d", "candidate screened out"),
}


def _figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("report --html and --png draw with matplotlib, which is not installed "
                        "here: pip install 'matplotlib>=3.7' (the text report needs nothing)")

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _kind(point: dict) -> str:
    if point["status"] == Status.CRASH:
        return Status.CRASH
    if point["correctness"] == Correctness.FAIL:
        return FAILED
    return point["status"]


def latency(panels: dict[str, list[dict]], floors: dict, compiled: dict, headline: str):
    """One panel per shape (the headline first): each experiment's median at that shape by its
    outcome, the incumbent as a step line, other candidates, and the floor and torch.compile
    (from the last bench) as horizontal lines."""
    names = [headline] + [n for n in panels if n != headline] if headline in panels else list(panels)
    fig = _figure(9, 2.8 * len(names) + 0.8)
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    handles = {}
    for ax, name in zip(axes, names):
        points = panels[name]
        level, steps = None, []
        for p in points:
            if p["status"] == Status.KEEP and p["ms"] is not None:
                level = p["ms"]
            steps.append((p["iteration"], level))
        xs = [x for x, y in steps if y is not None]
        ys = [y for _, y in steps if y is not None]
        if xs:
            handles["incumbent"] = ax.plot(xs, ys, drawstyle="steps-post", color="#2a9d45",
                                           alpha=0.45, linewidth=1.5, label="incumbent")[0]
        for p, (_, at) in zip(points, steps):
            kind = _kind(p)
            marker, colour, filled, label = EXPERIMENT_STYLE[kind]
            y = p["ms"] if p["ms"] is not None else (p["incumbent_ms"] or at)
            if y is None:
                continue
            handles[label] = ax.scatter([p["iteration"]], [y], marker=marker, s=60, zorder=3,
                                        color=colour if filled else "none", edgecolors=colour,
                                        linewidths=1.5, label=label)
            for c in p["candidates"]:
                cm, cc, clabel = CANDIDATE_STYLE.get(c["outcome"], CANDIDATE_STYLE[Outcome.CRASH])
                if c["ms"] is not None and c["outcome"] == Outcome.OK:
                    handles[clabel] = ax.scatter([p["iteration"]], [c["ms"]], marker=cm, s=30,
                                                 color=cc, zorder=2, label=clabel)
                else:  # not timed: a mark along the top of the panel
                    handles[clabel] = ax.scatter([p["iteration"]], [0.96], marker=cm, s=28,
                                                 color=cc, zorder=2, label=clabel,
                                                 transform=ax.get_xaxis_transform())
        if floors.get(name):
            handles["physical floor"] = ax.axhline(floors[name], color="black", linestyle="--",
                                                   linewidth=1, label="physical floor")
        if compiled.get(name):
            handles["torch.compile (last bench)"] = ax.axhline(
                compiled[name], color="#1d4ed8", linestyle=":", linewidth=1.5,
                label="torch.compile (last bench)")
        if floors.get(name):
            ax.set_ylim(bottom=0)
        ax.set_title(f"{name}{' (headline)' if name == headline else ''}", fontsize=10)
        ax.set_ylabel("median latency (ms)")
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("iteration")
    axes[-1].xaxis.get_major_locator().set_params(integer=True)
    lo, hi = axes[-1].get_xlim()
    if hi - lo < 2:  # a run of one or two iterations: whole-number ticks, not -0.04 .. 0.04
        axes[-1].set_xlim((lo + hi) / 2 - 1, (lo + hi) / 2 + 1)
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncols=3, fontsize=8)
    return fig


def floor_shares(rows: list[dict]):
    """Per shape, the share of the physical floor the baseline and the final incumbent reach
    (1.0 is the floor), and torch.compile's from the last bench where there is one; None when
    no shape has a floor (a CPU clock)."""
    rows = [r for r in rows if r.get("baseline_share_of_floor") or r.get("incumbent_share_of_floor")]
    if not rows:
        return None
    compiled = [next((c["share_of_floor"] for c in r["competitors"]
                      if c["variant"] == "torch-compile"), None) for r in rows]
    series = [("baseline", [r["baseline_share_of_floor"] for r in rows], "#9a9a9a"),
              ("final", [r["incumbent_share_of_floor"] for r in rows], "#2a9d45")]
    if any(v is not None for v in compiled):
        series.append(("torch.compile (last bench)", compiled, "#1d4ed8"))
    fig = _figure(max(5, 1.6 * len(rows) + 2), 3.6)
    ax = fig.subplots()
    width = 0.8 / len(series)
    for i, (label, values, colour) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
        ax.bar(xs, [v or 0 for v in values], width, label=label, color=colour)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="physical floor")
    ax.set_xticks(range(len(rows)), [r["shape"] for r in rows])
    ax.set_ylabel("share of the physical floor")
    ax.set_ylim(0, 1.3)
    ax.legend(fontsize=8, loc="upper center", ncols=len(series) + 1)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def workload(view: dict | None):
    """The workload view of the last bench (perfloop.report.workload_view): per shape the best
    peer's time over cuTile's, held-out shapes apart, with the bar; None without one."""
    rows = (view or {}).get("shapes") or []
    rows = [r for r in rows if r.get("vs_best_peer") is not None]
    if not rows:
        return None
    fig = _figure(max(5, 0.9 * len(rows) + 2), 3.6)
    ax = fig.subplots()
    colours = ["#e07b00" if r["held_out"] else "#2a9d45" for r in rows]
    ax.bar(range(len(rows)), [r["vs_best_peer"] for r in rows], 0.7, color=colours)
    ax.axhline(1.0, color="black", linewidth=1)
    bar = ax.axhline(view["bar"], color="#c1121f", linestyle="--", linewidth=1,
                     label=f"bar ({view['bar']:.2f} of the best peer)")
    from matplotlib.patches import Patch

    kinds = [Patch(color=c, label=label) for label, c in (("benchmark shape", "#2a9d45"),
                                                          ("held-out shape", "#e07b00"))]
    ax.set_xticks(range(len(rows)), [r["shape"] for r in rows], rotation=30, ha="right",
                  fontsize=8)
    ax.set_ylabel("best peer's time / cuTile's")
    ax.set_ylim(0, 1.3 * max(1.0, *(r["vs_best_peer"] for r in rows)))
    ax.legend(handles=[*kinds, bar], fontsize=8, loc="upper center", ncols=3)
    ax.grid(True, axis="y", alpha=0.3)
    return fig
