"""The playbook as data: the optimization catalog, the decision rules, the autotune spaces."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from perfloop.core.errors import UserError
from perfloop.core.values import freeze, thaw  # noqa: F401 (public: perfloop.playbook.freeze)
from perfloop.core.vocab import MULTI  # noqa: F401 (perfloop.playbook.MULTI)

CLASSES = ("memory-bound", "balanced", "compute-bound")
# the repository's playbook/ in a source checkout (or an editable install); the copy installed
# as package data by a regular `pip install`
_PACKAGE = Path(__file__).resolve().parents[1]
_SOURCE = _PACKAGE.parent / "playbook"
SHIPPED = _SOURCE if (_SOURCE / "catalog.toml").is_file() else _PACKAGE / "_playbook"


@dataclass(frozen=True)
class Optimization:
    id: str
    title: str
    family: str
    knob: str
    values: tuple
    applies_to: tuple[str, ...]
    priority: dict
    why: str
    by_tag: dict = dataclasses.field(default_factory=dict)  # kernel tag -> rank, over the class's
    knobs: tuple[str, ...] = ()  # an entry that moves several knobs together: their names
    # (its knob is then MULTI and each value a {knob: value} patch)

    @property
    def moves(self) -> tuple[str, ...]:
        """The knobs an iteration of this entry changes."""
        return self.knobs or (self.knob,)

    @property
    def key(self) -> str:
        """Its name in kernel.toml's [candidates]: the knob, or the knobs joined by '+'."""
        return candidates_key(self.knobs) if self.knobs else self.knob

    def offered_to(self, tags: tuple, kernel_class: str | None = None) -> bool:
        """Whether it applies to a kernel with these tags and class (None: any class it
        lists): an entry with no applies_to is for its tags' kernels alone."""
        if any(t in self.by_tag for t in tags):
            return True
        return kernel_class in self.applies_to if kernel_class else bool(self.applies_to)

    def rank_for(self, kernel_class: str, tags: tuple = ()) -> tuple[int, str]:
        """This entry's rank for a kernel, and what set it: the best rank among the kernel's
        tags that the entry names, else the rank for its class."""
        tagged = sorted((int(self.by_tag[t]), t) for t in tags if t in self.by_tag)
        if tagged:
            return tagged[0][0], f"{tagged[0][1]} kernels"
        return int(self.priority[kernel_class]), f"{kernel_class} kernels"


@dataclass(frozen=True)
class DecisionRules:
    keep_gain: float
    minor_gain: float
    regression_tolerance: float
    family_penalty: int
    floor_tolerance: float
    min_gain: float = 0.0     # smallest gain that counts; absent from rules pinned before it


@dataclass(frozen=True)
class StopRules:
    no_improvement_streak: int
    max_iterations: int
    roofline_share: float | None = None  # stop when every shape is this close to its floor
    time_budget_s: float | None = None   # seconds of experiments; see suggest.suggestions


@dataclass(frozen=True)
class Search:
    joint_margin: float = 0.03      # one-knob values this close to the best join the search
    joint_max_configs: int = 30
    interactions: tuple = ()        # pairs of knobs searched together whenever one is
    pair_share: float = 1.0         # of a sampled joint search: configs moving one pair only
    screen_above: int = 8           # an experiment with more candidates is screened first:
    screen_keep: int = 4            # timed at the headline only, the fastest few go on
    screen_rounds: int = 3
    screen_processes: int = 0       # compile the screened side by side (0: compile_processes)
    dispatch: bool = True           # false: no per-bucket dispatch (one-knob steps and joint only)
    budget_reserve: int = 2         # joint searches the time budget keeps room for at the end
    screen_s_per_config: float = 1.7  # screening's estimate before the run has screened


@dataclass(frozen=True)
class Measure:
    rounds: int
    round_ms: float
    warmup_ms: float
    min_reps: int
    max_reps: int
    cliff_ratio: float | None = None  # a candidate this many times slower in warm-up: dropped


@dataclass(frozen=True)
class Limits:
    iteration_timeout_s: float = 600.0
    stall_timeout_s: float = 180.0
    log_cap_mb: float = 8.0      # of a child's output, the log keeps the first and last halves
    compile_processes: int = 0   # parallel warmers that fill cuTile's cache while judging
    judge_processes: int = 1     # pytest processes that judge an iteration's candidates
    start_ahead: bool = False    # GPU kernels: the next experiment's children start while timing
    confine: str = "read-write"  # what kernel code may touch: "read-write", "write" or "off"
    pass_env: tuple = ()         # more variables children get (perfloop.isolation.sandbox.PASSED)


@dataclass(frozen=True)
class Verify:
    max_fresh_ratio: float = 1.5   # (unused since every timed launch runs on fresh inputs)
    max_control_gap: float = 0.05  # a baseline whose A/A control differs more is no baseline


@dataclass(frozen=True)
class Classes:
    """Where the kernel classes begin: multiples of the device's ridge point (a unit's peak over
    the measured bandwidth), and fixed FLOP/byte where no peak is known (a CPU clock)."""
    memory_below: float = 0.5       # intensity under this x the ridge: memory-bound
    compute_above: float = 2.0      # over this x the ridge: compute-bound; between: balanced
    fallback_memory_below: float = 10.0    # FLOP/byte, seed 002's fixed classes
    fallback_compute_above: float = 50.0


@dataclass(frozen=True)
class Rules:
    decision: DecisionRules
    stop: StopRules
    iteration_timeout_s: float
    stall_timeout_s: float
    measure: Measure
    verify: Verify
    search: Search = Search()
    log_cap_mb: float = 8.0        # absent from rules pinned before it: the default
    compile_processes: int = 0
    judge_processes: int = 1
    start_ahead: bool = False
    classes: Classes = Classes()   # absent from rules pinned before it: the defaults
    confine: str = "read-write"    # absent from rules pinned before it: the default
    pass_env: tuple = ()           # absent from rules pinned before it: none


@dataclass(frozen=True)
class Playbook:
    path: Path
    optimizations: tuple[Optimization, ...]
    rules: Rules
    autotune: dict

    def rules_dict(self) -> dict:
        return dataclasses.asdict(self.rules)

    def get(self, opt_id: str) -> Optimization:
        for opt in self.optimizations:
            if opt.id == opt_id:
                return opt
        known = ", ".join(o.id for o in self.optimizations)
        raise UserError(f"unknown optimization '{opt_id}' (known: {known})")


def resolve_dir(explicit: str | None, repo_root: Path | None) -> Path:
    """--playbook, then $PERFLOOP_PLAYBOOK, then the kernel repo's playbook/, then perfloop's."""
    for candidate in (explicit, os.environ.get("PERFLOOP_PLAYBOOK")):
        if candidate:
            path = Path(candidate)
            if not (path / "catalog.toml").is_file():
                raise UserError(f"playbook directory {path} has no catalog.toml")
            return path
    if repo_root is not None and (repo_root / "playbook" / "catalog.toml").is_file():
        return repo_root / "playbook"
    return SHIPPED


def read_toml(path: Path, what: str = "playbook file") -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{what} {path} is missing") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{what} {path} is not valid TOML: {exc}") from None


def _section(data: dict, name: str, cls, path: Path):
    raw = data.get(name, {})
    try:
        return cls(**raw)
    except TypeError as exc:
        raise UserError(f"{path}: section [{name}]: {exc}") from None


def _optimization(raw: dict, path: Path) -> Optimization:
    together = raw.get("knobs", ())
    together = tuple(together) if isinstance(together, list) else together
    try:
        if together and (not isinstance(together, tuple) or "knob" in raw or len(together) < 2
                         or len(set(together)) < len(together)
                         or not all(isinstance(k, str) for k in together)):
            raise UserError(f"{path}: optimization {raw['id']}: `knobs` is a list of two "
                            "different knobs or more, moved together, in place of `knob`")
        opt = Optimization(
            id=raw["id"], title=raw["title"], family=raw["family"],
            knob=MULTI if together else raw["knob"],
            values=tuple(patch_values(raw["values"], together, f"{path}: optimization "
                                      f"{raw['id']}") if together else
                         (freeze(v) for v in raw["values"])),
            applies_to=tuple(raw["applies_to"]), priority=dict(raw["priority"]),
            why=raw.get("why", ""), by_tag=dict(raw.get("by_tag", {})), knobs=together,
        )
    except KeyError as exc:
        raise UserError(f"{path}: optimization {raw.get('id', '?')} lacks {exc}") from None
    bad = [c for c in opt.applies_to if c not in CLASSES or c not in opt.priority]
    bad += [t for t, rank in opt.by_tag.items()
            if not isinstance(rank, int) or isinstance(rank, bool)]
    if bad or not opt.values:
        raise UserError(f"{path}: optimization {opt.id}: every class in applies_to needs a "
                        f"priority, every by_tag rank must be an integer and values must not be empty (check "
                        f"{bad or 'values'})")
    return opt




def candidates_key(knobs) -> str:
    """The [candidates] key of an entry moving `knobs` together, in any order: "a+b"."""
    return "+".join(sorted(knobs))


def patch_values(values: list, knobs: tuple, where: str) -> tuple[dict, ...]:
    """The values of an entry that moves `knobs` together: each a table naming every one of
    them, its values frozen."""
    if not all(isinstance(v, dict) and set(v) == set(knobs) for v in values):
        raise UserError(f"{where}: each value must be a table of {', '.join(knobs)} (e.g. "
                        f"{{{', '.join(f'{k} = ...' for k in knobs)}}})")
    return tuple({k: freeze(v[k]) for k in knobs} for v in values)




def rules_from_dict(raw: dict, where: str = "pinned rules") -> Rules:
    try:
        return Rules(decision=DecisionRules(**raw["decision"]), stop=StopRules(**raw["stop"]),
                     iteration_timeout_s=raw["iteration_timeout_s"],
                     stall_timeout_s=raw["stall_timeout_s"], measure=Measure(**raw["measure"]),
                     verify=Verify(**raw["verify"]), search=_search(raw.get("search", {})),
                     log_cap_mb=raw.get("log_cap_mb", 8.0),
                     compile_processes=raw.get("compile_processes", 0),
                     judge_processes=raw.get("judge_processes", 1),
                     start_ahead=raw.get("start_ahead", False),
                     classes=Classes(**raw.get("classes", {})),
                     confine=raw.get("confine", "read-write"),
                     pass_env=tuple(raw.get("pass_env", ())))
    except (KeyError, TypeError) as exc:
        raise UserError(f"{where} are incomplete ({exc.__class__.__name__}: {exc}); start a new "
                        "run with --new") from None


def _search(raw: dict, path="pinned rules") -> Search:
    pairs = raw.get("interactions", ())
    if not all(isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(k, str) for k in p)
               for p in pairs):
        raise UserError(f"{path}: [search] interactions must be pairs of knob names, e.g. "
                        '[["tile", "num_ctas"]]')
    return Search(**{**raw, "interactions": tuple(tuple(p) for p in pairs)})


def _classes(classes: Classes, path: Path) -> Classes:
    if not (0 < classes.memory_below <= classes.compute_above
            and 0 < classes.fallback_memory_below <= classes.fallback_compute_above):
        raise UserError(f"{path}: [classes] bounds must be positive, each memory_below no "
                        "larger than its compute_above")
    return classes


def _positive(value: float, what: str, path: Path) -> float:
    if value <= 0:
        raise UserError(f"{path}: {what} must be above 0, not {value!r}")
    return float(value)


CONFINE = ("read-write", "write", "off")


def _confine(value, path: Path) -> str:
    if value not in CONFINE:
        raise UserError(f"{path}: [limits] confine must be one of {', '.join(CONFINE)}, not "
                        f"{value!r}")
    return value


def _pass_env(value, path: Path) -> tuple:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise UserError(f"{path}: [limits] pass_env must be a list of variable names or "
                        f"patterns (e.g. [\"MY_KERNEL_*\"]), not {value!r}")
    return tuple(value)


def with_rules(book: Playbook, raw: dict) -> Playbook:
    """The playbook with the rules a run pinned when it started."""
    return dataclasses.replace(book, rules=rules_from_dict(raw))


def _typed(cls, raw: dict, section: str, path: Path):
    """A section's values, each of the type its field declares (an int may stand for a float)."""
    obj = _section(raw, section, cls, path)
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        want = {"float": (int, float), "int": (int,), "bool": (bool,),
                "float | None": (int, float)}.get(str(f.type), ())
        if value is None and f.type == "float | None":
            continue
        if want and (not isinstance(value, want) or (isinstance(value, bool) and f.type != "bool")):
            raise UserError(f"{path}: [{section}] {f.name} must be a number "
                            f"({f.type}), not {value!r}")
    return obj


def load(directory: Path) -> Playbook:
    catalog_path = directory / "catalog.toml"
    rules_path = directory / "rules.toml"
    catalog = read_toml(catalog_path)
    rules = read_toml(rules_path)
    opts = tuple(_optimization(raw, catalog_path) for raw in catalog.get("optimization", []))
    ids = [o.id for o in opts]
    if len(set(ids)) != len(ids):
        raise UserError(f"{catalog_path}: optimization ids must be unique")
    limits = _typed(Limits, rules, "limits", rules_path)
    parsed = Rules(
        decision=_typed(DecisionRules, rules, "decision", rules_path),
        stop=_typed(StopRules, rules, "stop", rules_path),
        iteration_timeout_s=float(limits.iteration_timeout_s),
        stall_timeout_s=float(limits.stall_timeout_s),
        measure=_typed(Measure, rules, "measure", rules_path),
        verify=_typed(Verify, rules, "verify", rules_path),
        search=_search(vars(_typed(Search, rules, "search", rules_path)), rules_path),
        log_cap_mb=_positive(limits.log_cap_mb, "[limits] log_cap_mb", rules_path),
        compile_processes=limits.compile_processes,
        judge_processes=limits.judge_processes,
        start_ahead=bool(limits.start_ahead),
        classes=_classes(_typed(Classes, rules, "classes", rules_path), rules_path),
        confine=_confine(limits.confine, rules_path),
        pass_env=_pass_env(limits.pass_env, rules_path),
    )
    autotune_path = directory / "autotune.toml"
    autotune = read_toml(autotune_path) if autotune_path.exists() else {}
    return Playbook(path=directory, optimizations=opts, rules=parsed, autotune=autotune)
