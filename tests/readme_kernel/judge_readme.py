"""Correctness tests (the judge) for the CPU-timed RMSNorm kernel, written from perfloop's README.

In a repository laid out as the README says, this file is tests/test_rmsnorm.py and the kernel is
kernels/rmsnorm/. It owns its inputs and its float64 reference and takes only `build` from the kernel.
"""
import json
from pathlib import Path

import pytest
import torch

from perfloop.correctness import check, module_for, requested_variants, tolerance

_HERE = Path(__file__).resolve().parent
# In the run's repository: <root>/tests/test_rmsnorm.py and <root>/kernels/rmsnorm/.
# Beside its source in perfloop's own tests/readme_kernel/: the folder kernel/ next to this file.
FOLDER = _HERE.parent / "kernels" / "rmsnorm"
if not FOLDER.is_dir():
    FOLDER = _HERE / "kernel"


def _tuples(v):
    return tuple(_tuples(e) for e in v) if isinstance(v, list) else v


KNOBS = {k: _tuples(v) for k, v in json.loads((FOLDER / "knobs.json").read_text()).items()}

VARIANTS = requested_variants() or [{"label": "committed", "folder": FOLDER, "knobs": KNOBS}]

EPS = 1e-6
# Several shapes, including column counts that no tile (512, 1024, 2048) divides, and odd rows.
CASES = [(1, 512), (3, 1000), (17, 1537), (64, 4096), (5, 2049)]
SEEDS = [0, 1, 2]


def _inputs(rows, cols, seed):
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn((rows, cols), generator=g, dtype=torch.float32)
    w = 1.0 + 0.1 * torch.randn((cols,), generator=g, dtype=torch.float32)
    return x, w


def _reference64(x, w):
    x, w = x.double(), w.double()
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + EPS) * w


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v["label"])
def test_matches_reference(variant):
    launch = module_for(variant["folder"]).build(variant["knobs"])
    tol = tolerance(FOLDER, "float32")
    for rows, cols in CASES:
        for seed in SEEDS:
            x, w = _inputs(rows, cols, seed)

            def run():                                  # poison, launch, return the output
                out = torch.full_like(x, float("nan"))
                launch((x, w), out)
                return out

            check(variant["label"], f"{rows}x{cols} seed {seed}", run, _reference64(x, w), **tol)
