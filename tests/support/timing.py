"""Time the scripted kernel's incumbent, its control and one candidate through phases, as
an iteration does (a worker started ahead, or None for one started then)."""

import time

from perfloop.core.vocab import CONTROL, INCUMBENT
from perfloop.measure import phases
from perfloop.store.session import Session


def time_scripted(scratch, tmp_path, ahead):
    """(the running child that timed them, phases.Timing)"""
    s = Session("scripted")
    knobs = s.spec.read_knobs()
    variants = [{"label": INCUMBENT, "folder": scratch.kernel, "knobs": knobs},
                {"label": CONTROL, "folder": scratch.kernel, "knobs": knobs},
                {"label": "c0", "folder": scratch.kernel, "knobs": {**knobs, "mode": "ok"}}]
    pending = phases.start_timing(
        variants, [sh.as_dict() for sh in s.spec.shapes], s.playbook.rules,
        contract=scratch.kernel, tolerance=s.spec.tolerance, headline=s.spec.headline.name,
        ceilings_cache=tmp_path / "ceilings.json", work=tmp_path / "work", cwd=scratch.path,
        env=phases.child_env(scratch.path / "playbook"), ahead=ahead)
    used = pending.attempt[1]
    return used, phases.finish_timing(pending, ["c0"], deadline=time.monotonic() + 300)
