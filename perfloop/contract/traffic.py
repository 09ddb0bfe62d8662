"""A kernel's traffic at one shape: the bytes it must move and the operations it must do, per
execution unit, read from its traffic(shape) (perfloop.contract.kernel's contract).

traffic(shape) returns either the old pair (bytes, flops), whose FLOPs count at the bf16
tensor-core rate (what the pair has always meant), or a mapping
    {"bytes": B, "flops": {"tensor.bf16": x, "fp32": y, "sfu": z}}
naming the unit each part runs on, so that the floor and the class are right for a matmul
and a softmax alike (perfloop.referee.ceilings holds each unit's peak per architecture).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real

from perfloop.core.errors import UserError

# tensor-core FLOPs by input dtype (an FMA counts 2); fp32: FLOPs on the CUDA cores (an FMA
# counts 2); sfu: results of the special-function units (exp2, log2, rsqrt, rcp, sin, cos: one
# per value). bf16 and fp16 run at one rate, tf32 at half of it, fp8 at twice.
UNITS = ("tensor.bf16", "tensor.fp16", "tensor.tf32", "tensor.fp8", "fp32", "sfu")
# torch's dtype names, so a matmul can write f"tensor.{shape.dtype}"
ALIASES = {"tensor.bfloat16": "tensor.bf16", "tensor.float16": "tensor.fp16",
           "tensor.float8_e4m3fn": "tensor.fp8", "tensor.float8_e5m2": "tensor.fp8"}
LEGACY_UNIT = "tensor.bf16"   # what the FLOPs of a (bytes, flops) pair mean


@dataclass(frozen=True)
class Work:
    bytes: float
    flops: dict   # unit -> operations, units from UNITS, no zero entries

    @property
    def total_flops(self) -> float:
        return float(sum(self.flops.values()))


def _count(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and value >= 0 \
        and value == value and value != float("inf")


def parse(raw, where: str) -> Work:
    """traffic()'s return value as Work; a UserError of one line, naming `where`, if it is
    neither form."""
    expected = ("expected (bytes, flops) or {\"bytes\": B, \"flops\": {unit: count}} with "
                f"units {', '.join(UNITS)}")
    if isinstance(raw, Mapping):
        unknown = sorted(set(raw) - {"bytes", "flops"})
        flops = raw.get("flops", {})
        if unknown or "bytes" not in raw or not isinstance(flops, Mapping):
            raise UserError(f"{where} returned a mapping with keys {sorted(raw)}: {expected}")
        nbytes = raw["bytes"]
        by_unit: dict = {}
        for unit, count in flops.items():
            name = ALIASES.get(unit, unit)
            if name not in UNITS:
                raise UserError(f"{where}: unknown execution unit {unit!r}: {expected}")
            if not _count(count):
                raise UserError(f"{where}: flops[{unit!r}] must be a non-negative number, "
                                f"not {count!r}")
            by_unit[name] = by_unit.get(name, 0) + count
    elif isinstance(raw, (tuple, list)) and len(raw) == 2:
        nbytes, legacy = raw
        if not _count(legacy):
            raise UserError(f"{where} returned flops {legacy!r}, not a non-negative number: "
                            f"{expected}")
        by_unit = {LEGACY_UNIT: legacy}
    else:
        raise UserError(f"{where} returned {type(raw).__name__} {str(raw)[:60]}: {expected}")
    if not _count(nbytes):
        raise UserError(f"{where} returned bytes {nbytes!r}, not a non-negative number")
    return Work(float(nbytes), {u: float(n) for u, n in by_unit.items() if n})


def of(module, shape, kernel: str) -> Work:
    """The kernel's work at `shape`, from its module's traffic()."""
    where = f"kernel '{kernel}': traffic(shape {shape.name!r})"
    if not callable(getattr(module, "traffic", None)):
        raise UserError(f"kernel '{kernel}': kernel.py has no traffic(shape)")
    try:
        raw = module.traffic(shape)
    except Exception as exc:
        text = str(exc).strip().splitlines()
        raise UserError(f"{where} raised {type(exc).__name__}: {text[0] if text else ''}") \
            from None
    return parse(raw, where)


def check(module, spec, held_out: tuple = ()) -> None:
    """Every benchmark, held-back and held-out shape's work can be read: before a run or a
    bench writes anything, not as a traceback in a timing process."""
    for shape in spec.shapes + spec.held_back + tuple(held_out):
        of(module, shape, spec.name)


def from_record(shape: dict) -> Work:
    """A timing record's shape entry as Work: `flops_by_unit` where the record has it, else
    its `flops`, which records written before units existed count at the bf16 tensor rate."""
    by_unit = shape.get("flops_by_unit")
    if by_unit is None:
        by_unit = {LEGACY_UNIT: shape.get("flops") or 0}
    return Work(float(shape.get("bytes") or 0), {u: float(n) for u, n in by_unit.items() if n})
