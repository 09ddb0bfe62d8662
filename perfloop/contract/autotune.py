"""Tune once, cache, launch: autotuning for cuTile kernels on cuda.tile.tune.exhaustive_search.

- The search space is a list (a generator is listed first), at most 30 configs, and always
  holds the kernel's fixed config; the search's winner replaces it only when it is faster
  beyond both configs' error margins, so tuning does not lose to it by noise.
- Each config's kernel object is made once with replace_hints and cached with the config; the
  fast path is a dict lookup and ct.launch.
- Winners are cached in memory and on disk. A disk entry is named by a hash of everything that
  decides it (GPU name, architecture, cuTile and tileiras versions, a hash of the kernel's
  source, the shapes/dtypes/device key and the space), so a change of any of them misses.
  Entries are written atomically.
- For kernels that write their inputs, pass search_args_fn with separate output buffers: the
  search then never corrupts the caller's data.
- DISABLE_AUTOTUNE=1 (or PERFLOOP_DISABLE_AUTOTUNE=1), set when a tuner is made, skips every
  search and launches the fixed config.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

from perfloop.core.atomic import write_json
from perfloop.core.errors import UserError

MAX_CONFIGS = 30
HINTS = ("occupancy", "num_ctas")
DISABLE_VARS = ("DISABLE_AUTOTUNE", "PERFLOOP_DISABLE_AUTOTUNE")


class AutotuneError(UserError):
    pass


def disabled() -> bool:
    return any(os.environ.get(var, "0") == "1" for var in DISABLE_VARS)


def prepare_space(space: Iterable[dict], fixed: dict, limit: int = MAX_CONFIGS) -> list[dict]:
    """The configs to search, as a list: the fixed config first, duplicates dropped."""
    configs = [dict(fixed)]
    for config in list(space):
        if dict(config) not in configs:
            configs.append(dict(config))
    if len(configs) > limit:
        raise AutotuneError(f"autotune search space has {len(configs)} configs (with the fixed "
                            f"one); the limit is {limit}, since each config costs a cuTile "
                            "compile: build a smaller space")
    return configs


def space_for(kernel_class: str, capability: tuple[int, int], spaces: dict | None = None,
              ) -> list[dict]:
    """The playbook's space for a kernel class (autotune.toml), fitted to the architecture."""
    if spaces is None:
        from perfloop.contract import playbook
        spaces = playbook.load(playbook.resolve_dir(None, None)).autotune
    dims = dict(spaces.get("space", {}).get(kernel_class, {}))
    if not dims:
        raise AutotuneError(f"no autotune space for kernel class '{kernel_class}'")
    arch = spaces.get("arch", {})
    if capability[0] * 10 + capability[1] < arch.get("num_ctas_min_sm", 90):
        dims.pop("num_ctas", None)
    names = list(dims)
    configs = [dict(zip(names, values)) for values in itertools.product(*dims.values())]
    limit = arch.get("max_configs", MAX_CONFIGS)
    if len(configs) > limit:
        raise AutotuneError(f"the {kernel_class} space in autotune.toml has {len(configs)} "
                            f"configs; the limit is {limit}")
    return configs


def hints_of(config: dict) -> dict:
    return {k: config[k] for k in HINTS if config.get(k) is not None}


def identity(name: str, source: bytes, key, space: list[dict], device: str = "cuda") -> dict:
    """Everything that decides the winner, read from this machine."""
    import torch

    from perfloop.core.envinfo import _tileiras_version, _version

    major, minor = torch.cuda.get_device_capability(device)
    return {"kernel": name, "source_sha256": hashlib.sha256(source).hexdigest(),
            "gpu": torch.cuda.get_device_name(device), "arch": f"sm_{major}{minor}",
            "cutile": _version("cuda-tile"), "tileiras": _tileiras_version(),
            "key": repr(key), "space": space}


class DiskCache:
    """One JSON file per winner, named by a hash of its identity."""

    def __init__(self, directory: Path | None = None):
        # XDG_CACHE_HOME: a confined child may write only its own cache (perfloop.isolation.sandbox)
        self.directory = Path(directory or os.environ.get("PERFLOOP_AUTOTUNE_CACHE")
                              or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                              / "perfloop" / "autotune")

    def path(self, ident: dict) -> Path:
        digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()
        return self.directory / f"{ident['kernel']}-{digest[:32]}.json"

    def get(self, ident: dict) -> Any:   # the winner (Autotuner's a config; tuneonce's a name)
        path = self.path(ident)
        try:
            entry = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):   # absent, or not readable here
            return None
        if entry.get("identity") != json.loads(json.dumps(ident, default=str)):
            return None
        return entry["config"] if entry["config"] in ident["space"] else None

    def put(self, ident: dict, config: Any, detail: dict) -> None:
        """Keep the winner on disk; where the directory cannot be written (a confined child,
        a read-only home) it is said, and the winner holds only where the caller keeps it."""
        try:
            write_json(self.path(ident), {"identity": ident, "config": config, **detail,
                                          "written_at": time.time()})
        except OSError as e:
            warnings.warn(f"perfloop: the tuning cache {self.directory} cannot be written "
                          f"({e.strerror or e}); the choice is not kept for later processes",
                          stacklevel=2)


_memory: dict = {}  # (name, source hash, key) -> (config, kernel object); shared by tuners


def prefer_fixed(result, fixed: dict) -> dict:
    """The search's best, unless it beats the fixed config by less than their error margins:
    a difference the search cannot tell from noise is no reason to leave the fixed config."""
    best = result.best
    base = next((m for m in result.successes if m.config == fixed), None)
    if base is None or best.config == fixed:
        return best.config
    if best.mean_us + best.error_margin_us < base.mean_us - base.error_margin_us:
        return best.config
    return fixed


class Autotuner:
    def __init__(self, kernel, *, space: Iterable[dict], fixed: dict, name: str,
                 source: bytes, cache: DiskCache | None = None, search=None, launch=None,
                 identify=None):
        self.kernel, self.name = kernel, name
        self.space = prepare_space(space, fixed)
        self.fixed = self.space[0]
        self.source = source
        self._memo = (name, hashlib.sha256(source).hexdigest())  # once, not per launch
        self.disabled = disabled()  # read when the tuner is made, not on every launch
        self.cache = cache or DiskCache()
        self._search, self._launch = search, launch
        self._identify = identify or (lambda key: identity(name, source, key, self.space))
        self._kernels: dict = {}
        self.searches = 0        # searches this tuner ran (the tests count them)
        self.last_search_s: float | None = None
        self.last_config: dict | None = None

    def kernel_for(self, config: dict):
        """replace_hints once per distinct set of hints."""
        hints = tuple(sorted(hints_of(config).items()))
        if hints not in self._kernels:
            self._kernels[hints] = self.kernel.replace_hints(**dict(hints))
        return self._kernels[hints]

    def _launcher(self):
        if self._launch is None:
            import cuda.tile as ct
            self._launch = ct.launch
        return self._launch

    def launch(self, stream, key, grid_fn: Callable[[dict], tuple], args_fn: Callable[[dict], tuple],
               search_args_fn: Callable[[dict], tuple] | None = None) -> dict:
        """Launch with the best config for `key` (what decides it: shapes, dtypes, device)."""
        if self.disabled:
            config, kern = self.fixed, self.kernel_for(self.fixed)
        else:
            memo = (*self._memo, key)
            entry = _memory.get(memo)
            if entry is None:
                config = self._tune(stream, key, grid_fn, search_args_fn or args_fn)
                entry = _memory[memo] = (config, self.kernel_for(config))
            config, kern = entry
        self._launcher()(stream, grid_fn(config), kern, args_fn(config))
        self.last_config = config
        return config

    def _tune(self, stream, key, grid_fn, args_fn) -> dict:
        ident = self._identify(key)
        found = self.cache.get(ident)
        if found is not None:
            return found
        search = self._search
        if search is None:
            from cuda.tile import tune

            search = tune.exhaustive_search
        t0 = time.monotonic()
        result = search(list(self.space), stream, grid_fn, self.kernel, args_fn, hints_of,
                        quiet=True)
        self.last_search_s = time.monotonic() - t0
        self.searches += 1
        best = dict(prefer_fixed(result, self.fixed))
        self.cache.put(ident, best, {"mean_us": result.best.mean_us,
                                     "search_s": self.last_search_s,
                                     "measured": [{"config": m.config, "mean_us": m.mean_us}
                                                  for m in result.successes]})
        return best
