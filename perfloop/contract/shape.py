"""A shape of the benchmark (kernel.toml's [[shapes]]), of the held-back ones, or of the
workload: the object a kernel's make_inputs, traffic and tolerance get."""

from __future__ import annotations

from dataclasses import dataclass


def pow2(n: int) -> int:
    """The smallest power of two at or above n (a bucket's size class)."""
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class Shape:
    name: str
    dims: tuple[int, ...]
    dtype: str
    headline: bool = False
    held_back: bool = False   # timed only to check that a per-bucket choice generalizes
    param_items: tuple = ()   # (name, value) pairs: the case's named parameters (params)
    dtype_items: tuple = ()   # (tensor name, dtype) pairs: dtypes other than `dtype` (dtypes)

    @property
    def params(self) -> dict:
        """The case's named parameters, e.g. {"M": 128, "eps": 1e-6} (kernel.toml's params)."""
        return dict(self.param_items)

    @property
    def dtypes(self) -> dict:
        """The dtype of each tensor kernel.toml names in `dtypes`, e.g. {"w": "float32"}."""
        return dict(self.dtype_items)

    def dtype_of(self, tensor: str) -> str:
        """The dtype of the named tensor: as `dtypes` gives it, else the case's `dtype`."""
        return self.dtypes.get(tensor, self.dtype)

    def as_dict(self) -> dict:
        """name, dims (a list), dtype, headline, held_back, params, dtypes: the fields a
        kernel's functions may read."""
        return {"name": self.name, "dims": list(self.dims), "dtype": self.dtype,
                "headline": self.headline, "held_back": self.held_back,
                "params": self.params, "dtypes": self.dtypes}

    @classmethod
    def from_dict(cls, raw: dict) -> Shape:
        return cls(raw["name"], tuple(raw["dims"]), raw["dtype"], bool(raw.get("headline")),
                   bool(raw.get("held_back")), _items(raw.get("params")),
                   _items(raw.get("dtypes")))


def _items(table) -> tuple:
    """A TOML or JSON table as sorted (key, value) pairs, so a Shape stays hashable."""
    return tuple(sorted((table or {}).items()))
