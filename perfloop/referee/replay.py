"""The judge's cases, replayed by the trusted timer in each variant's launcher.

The judge's kernel pass runs pytest beside kernel code, which can see it: a kernel right only
while judged passed its judge and, where every timed shape was one it was right at, its
timing too. The reference pass writes the cases it could record (perfloop.contract.judge_replay);
the timer reads them here as data (torch.load with weights_only, through plainfile), makes
each case's inputs and poisoned output, and has the variant's own launcher run them, in a
batch like any other, where no pytest runs. The comparison with the judge's expected value
happens in the timer, at the case's tolerance.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from perfloop.contract import judge_replay, outputs
from perfloop.core import plainfile
from perfloop.core.atomic import digest

LIMIT = 2 * judge_replay.CAP_BYTES + (16 << 20)   # the cases and torch.save's framing


class Unreadable(Exception):
    """The case file is missing, changed since the reference pass wrote it, or not the data
    it should be."""


@dataclass
class Case:
    label: str
    name: str
    inputs: object      # judge_replay's plain-data form
    out: dict           # shape, stride, dtype, device
    expected: object
    tolerance: dict

    def buffers(self, gpu: bool) -> tuple:
        """(inputs, poisoned output, no extra): what a launcher's slot holds."""
        import torch

        dtype = getattr(torch, self.out["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise Unreadable(f"case {self.name}: no dtype {self.out['dtype']!r}")
        out = torch.empty_strided(tuple(self.out["shape"]), tuple(self.out["stride"]),
                                  dtype=dtype, device=_device(self.out["device"], gpu))
        outputs.poison(out)
        return _build(self.inputs, gpu), out, ()

    def compare(self, got) -> dict:
        return outputs.compare(got, self.expected, {}, "", fixed=self.tolerance)


def _device(kind: str | None, gpu: bool) -> str:
    if kind == "cuda" and gpu:
        return "cuda"
    if kind == "cpu":
        return "cpu"
    raise Unreadable(f"a case on {kind!r}, which this timer has no device for")


def _build(x, gpu: bool):
    """judge_replay's plain-data form back to the launch's inputs (tensors on their device)."""
    if not isinstance(x, dict) or len(x) not in (1, 2):
        raise Unreadable("an input that is not plain data")
    if "tensor" in x:
        t = x["tensor"]
        return t.to(_device(x.get("device"), gpu), copy=True)  # (keeps a dense tensor's strides)
    if "value" in x:
        if not isinstance(x["value"], judge_replay.SCALARS):
            raise Unreadable("an input that is not plain data")
        return x["value"]
    for kind, make in (("tuple", tuple), ("list", list)):
        if kind in x and isinstance(x[kind], list):
            return make(_build(v, gpu) for v in x[kind])
    raise Unreadable("an input that is not plain data")


def load(where: dict, variants: list[dict]) -> dict[str, list[Case]]:
    """{label: its cases} for the variants whose knobs and folder in the judge's request are
    those the timer builds (the loop asks the judge for exactly the candidates it times)."""
    import torch

    try:
        raw = plainfile.read_bytes(Path(where["path"]), LIMIT)
    except (OSError, KeyError, TypeError) as exc:
        raise Unreadable(f"{type(exc).__name__}: {exc}") from None
    if digest(raw) != where.get("digest"):
        raise Unreadable("it differs from what the judge's reference pass wrote")
    try:
        body = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        judged = body["variants"]
        mine = {v["label"]: v for v in variants}
        same = {label for label, v in judged.items() if label in mine
                and v["knobs"] == judge_replay.knobs_key(mine[label].get("knobs", {}))
                and Path(v["folder"]).resolve() == Path(mine[label].get("folder") or "").resolve()}
        out: dict = {}
        for c in body["cases"]:
            if c["label"] in same:
                out.setdefault(c["label"], []).append(Case(
                    c["label"], str(c["case"]), c["inputs"], dict(c["out"]), c["expected"],
                    dict(c["tolerance"])))
        return out
    except Unreadable:
        raise
    except Exception as exc:  # (plain data of another shape than the reference pass writes)
        raise Unreadable(f"not the reference pass's cases ({type(exc).__name__})") from None
