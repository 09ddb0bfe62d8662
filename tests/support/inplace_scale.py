"""A small in-place cuTile kernel, x *= s, that exists to prove autotune's split-buffer path:
a search that ran it on the caller's tensor would scale it once per trial."""

from pathlib import Path

import cuda.tile as ct
import torch

from perfloop.autotune import Autotuner, space_for

TILE = 1024


@ct.kernel
def scale_kernel(x_in, x_out, s: float, T: ct.Constant[int]):
    t = ct.bid(0)
    v = ct.load(x_in, (t,), (T,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(x_out, (t,), ct.astype(ct.astype(v, ct.float32) * s, x_out.dtype))


def tuner(cache) -> Autotuner:
    return Autotuner(scale_kernel, space=space_for("memory-bound", torch.cuda.get_device_capability()),
                     fixed={"occupancy": None}, name="inplace-scale",
                     source=Path(__file__).read_bytes(), cache=cache)


def scale_(x: torch.Tensor, s: float, tuned: Autotuner, split_buffer: bool = True) -> None:
    grid = lambda cfg: (-(-x.numel() // TILE),)  # noqa: E731
    scratch = torch.empty_like(x) if split_buffer else None
    tuned.launch(torch.cuda.current_stream(), (tuple(x.shape), str(x.dtype), str(x.device)),
                 grid_fn=grid, args_fn=lambda cfg: (x, x, s, TILE),
                 search_args_fn=(lambda cfg: (x, scratch, s, TILE)) if split_buffer else None)
