"""The profile's rules as a pure function (perfloop.plan.profile_rank): which metrics move
which catalog entries up or down in `perfloop next`'s ranking."""

import pytest

from perfloop.contract.playbook import SHIPPED, Optimization
from perfloop.plan import profile_rank
from perfloop.plan.decide import Suggestion


def _opt(opt_id, family):
    return Optimization(opt_id, opt_id, family, opt_id, (1,), ("memory-bound",),
                        {"memory-bound": 1}, "")


RANKED = [Suggestion(_opt("fast_math", "math"), (True,), 1, "priority 1"),
          Suggestion(_opt("memory_path", "memory"), ("x",), 2, "priority 2"),
          Suggestion(_opt("tile_shape", "tile"), ((1, 2),), 3, "priority 3"),
          Suggestion(_opt("occupancy", "occupancy"), (2,), 4, "priority 4")]


def metrics(**values):
    units = {"registers": "register/thread", "local_loads": "inst"}
    return {k: {"metric": f"metric_of_{k}", "value": v, "unit": units.get(k, "%")}
            for k, v in values.items()}


def test_shipped_rules_move_memory_and_tile_up_for_a_dram_bound_profile():
    rules = profile_rank.load(SHIPPED)
    out = profile_rank.adjust(RANKED, metrics(dram_pct=85.0, sm_pct=30.0), rules, "memory-bound")
    assert [sg.optimization.id for sg in out] == ["memory_path", "tile_shape", "fast_math",
                                                  "occupancy"]
    assert out[0].rank == -1 and out[0].reason.startswith(
        "the profile: metric_of_dram_pct = 85% (>= 60), DRAM-bound, moved it up 3")
    assert "moved it down 2" in out[2].reason and out[3].reason == "priority 4"


def test_spills_and_low_occupancy_move_tile_and_occupancy_up():
    rules = profile_rank.load(SHIPPED)
    out = profile_rank.adjust(RANKED, metrics(local_loads=1024.0, occupancy_pct=22.0,
                                              registers=255.0), rules, "memory-bound")
    ids = [sg.optimization.id for sg in out]
    assert ids[0] == "tile_shape" and ids.index("occupancy") < ids.index("memory_path")
    assert out[0].rank == -1 and out[ids.index("occupancy")].rank == 1
    assert "metric_of_local_loads = 1024 inst (> 0)" in out[0].reason   # the largest move
    # a rule for matmuls does not fire on a memory-bound kernel without the tag
    assert profile_rank.firing(rules, metrics(tensor_pct=5.0), "memory-bound") == []
    assert profile_rank.firing(rules, metrics(tensor_pct=5.0), "memory-bound", ("matmul",))
    # no metrics, no change
    assert profile_rank.adjust(RANKED, {}, rules, "memory-bound") == RANKED


def test_a_latency_bound_profile_puts_how_memory_is_issued_first():
    # softmax's plain version on an H100: DRAM 31%, SM 23%, 13% occupancy at 168 registers;
    # the TMA store was what held it back (2.9x), so the TMA entries must come before the tile
    ranked = RANKED + [Suggestion(_opt("store_tma", "tma"), (False,), 1, "priority 1")]
    rules = profile_rank.load(SHIPPED)
    out = profile_rank.adjust(ranked, metrics(dram_pct=31.36, sm_pct=23.27, occupancy_pct=13.1,
                                              registers=168.0), rules, "memory-bound")
    ids = [sg.optimization.id for sg in out]
    assert ids[0] == "store_tma" and ids.index("store_tma") < ids.index("tile_shape")
    assert "latency-bound, moved it up 3" in out[0].reason
    # a busy DRAM is not latency-bound
    fired = profile_rank.firing(rules, metrics(dram_pct=45.0, sm_pct=20.0), "memory-bound")
    assert "latency-bound" not in [rule.name for rule, _ in fired]


def test_broken_rules_are_one_clear_line(tmp_path):
    from perfloop.core.errors import UserError

    (tmp_path / "profile_rules.toml").write_text(
        '[metrics]\ndram_pct = ["d"]\n[[rule]]\nname = "x"\nwhen = { dram_pct = "about 60" }\n'
        "move = { tile = -1 }\n")
    with pytest.raises(UserError, match="must be '<op> <number>'"):
        profile_rank.load(tmp_path)
    (tmp_path / "profile_rules.toml").write_text(
        '[metrics]\ndram_pct = ["d"]\n[[rule]]\nname = "x"\nwhen = { sm = "> 1" }\nmove = { tile = -1 }\n')
    with pytest.raises(UserError, match="sm is not a key of"):
        profile_rank.load(tmp_path)
