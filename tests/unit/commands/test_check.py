"""`perfloop check`: ahead-of-time compilation of every variant, on a machine without a GPU."""

import json
import shutil

import pytest
from conftest import ROOT, git
from support.cli import human

from perfloop.contract import variants

pytest.importorskip("cuda.tile")


def _broken_repo(tmp_path):
    """A repository holding tests/broken's kernel, one of whose tiles cannot compile."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "broken" / "kernel", repo / "kernels" / "broken")
    (repo / "tests").mkdir()
    (repo / "tests" / "judge_broken.py").write_text("")
    git(repo.parent, "init", "-q", str(repo))
    return repo


def test_a_variant_that_cannot_compile_is_named(tmp_path):
    repo = _broken_repo(tmp_path)
    code, out, err = human(repo, "check", "--kernel", "kernels/broken", "--arch", "sm_90")
    assert code == 1, err
    failures = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert failures and all("tile=[1, 96]" in line for line in failures)
    assert all("not a power of two" in line for line in failures)
    assert "variants (every value pair)" in out and "0 failed" not in out


def test_the_committed_dispatch_tables_variants_are_compiled_too(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "broken" / "kernel", repo / "kernels" / "broken")
    manifest = repo / "kernels" / "broken" / "kernel.toml"
    manifest.write_text(manifest.read_text().replace("tile = [[1, 64], [1, 96]]", "tile = [[1, 64]]"))
    (repo / "kernels" / "broken" / "knobs.json").write_text(
        '{"tile": [1, 128], "occupancy": null, "dispatch": {"float16/n4096": {"tile": [1, 96]}}}')
    (repo / "tests").mkdir()
    (repo / "tests" / "judge_broken.py").write_text("")
    git(repo.parent, "init", "-q", str(repo))
    code, out, err = human(repo, "check", "--kernel", "kernels/broken", "--arch", "sm_90")
    assert code == 1, err
    failures = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(failures) == 1 and "tile=[1, 96]" in failures[0], out
    # the JSON counts what compiled, as the text does: the variants less the failures
    code, out, err = human(repo, "check", "--kernel", "kernels/broken", "--arch", "sm_90",
                           "--json")
    result = json.loads(out.strip().splitlines()[-1])
    assert code == 1 and len(result["failures"]) == 1, err
    assert result["compiled"] == result["variants"] - 1 > 0


def test_a_declared_finalist_is_compiled_too(tmp_path):
    # a launch in an unmeasured bucket may run it: a finalist that cannot compile is named
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "broken" / "kernel", repo / "kernels" / "broken")
    manifest = repo / "kernels" / "broken" / "kernel.toml"
    manifest.write_text(manifest.read_text().replace("tile = [[1, 64], [1, 96]]", "tile = [[1, 64]]")
                        + '\n[workload]\ndims = ["n"]\nn = [4096, 8192]\ndtypes = ["float16"]\n'
                        'unseen = "tune"\nfinalists = [{ tile = [1, 96] }]\n')
    (repo / "tests").mkdir()
    (repo / "tests" / "judge_broken.py").write_text("")
    git(repo.parent, "init", "-q", str(repo))
    code, out, err = human(repo, "check", "--kernel", "kernels/broken", "--arch", "sm_90")
    assert code == 1, err + out
    failures = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(failures) == 1 and "tile=[1, 96]" in failures[0], out


def test_pairwise_set_covers_every_pair_and_starts_with_the_committed_knobs():
    doms = {"a": [0, 1, 2], "b": ["x", "y"], "c": [True, False], "d": [None, 4, 8]}
    rows, _ = variants.pairwise(doms)
    assert rows[0] == {"a": 0, "b": "x", "c": True, "d": None}
    names = list(doms)
    for i, n in enumerate(names):
        for m in names[i + 1:]:
            for u in doms[n]:
                for v in doms[m]:
                    assert any(r[n] == u and r[m] == v for r in rows), (n, u, m, v)
    assert len(rows) < len(variants.exhaustive(doms)[0])


def test_pairwise_set_leaves_out_what_the_kernel_restricts_and_covers_the_rest():
    doms = {"a": [0, 1, 2], "b": ["x", "y"], "c": [True, False], "d": [None, 4, 8]}

    def allowed(k):  # a=2 with d=8 never runs; c=False needs b=y
        return not (k["a"] == 2 and k["d"] == 8) and not (k["c"] is False and k["b"] == "x")

    rows, dropped = variants.pairwise(doms, allowed)
    assert rows[0] == {"a": 0, "b": "x", "c": True, "d": None}
    assert all(allowed(r) for r in rows) and dropped == 2
    names = list(doms)
    for i, n in enumerate(names):
        for m in names[i + 1:]:
            for u in doms[n]:
                for v in doms[m]:
                    ruled = {n: u, m: v} in ({"a": 2, "d": 8}, {"b": "x", "c": False})
                    assert any(r[n] == u and r[m] == v for r in rows) != ruled, (n, u, m, v)
    every, ruled_out = variants.exhaustive(doms, allowed)
    assert len(every) + ruled_out == 36 and all(allowed(r) for r in every)
    assert ruled_out == 4 + 9 - 1    # a=2,d=8: 4; c=False,b=x: 9; both: 1


def test_a_sample_holds_every_value_then_n_more_seeded_rows_of_the_pairwise_set():
    doms = {"a": [0, 1, 2, 3, 4], "b": ["x", "y"], "c": [True, False], "d": [None, 4, 8]}
    rows, _ = variants.pairwise(doms)
    least = variants.sample(rows, 0, seed=0)
    assert least[0] == rows[0] and all(r in rows for r in least)
    assert [rows.index(r) for r in least] == sorted(rows.index(r) for r in least)
    assert all(any(r[k] == v for r in least) for k, vals in doms.items() for v in vals)
    assert len(least) == 5 < len(rows)         # five values of a: five rows, no more
    more = variants.sample(rows, 3, seed=0)
    assert len(more) == 8 and all(r in more for r in least)
    assert variants.sample(rows, 3, seed=0) == more            # seeded: the same rows again
    draws = {tuple(map(repr, variants.sample(rows, 3, seed=s))) for s in range(20)}
    assert len(draws) > 1                                        # other seeds, other rows
    assert variants.sample(rows, 1000, seed=0) == rows
    pairs = variants.pairs_covered(rows)
    assert len(pairs) == 5 * 2 + 5 * 2 + 5 * 3 + 2 * 2 + 2 * 3 + 2 * 3   # every value pair
    assert variants.pairs_covered(least) < pairs


def test_check_sample_compiles_a_subset_and_says_what_it_covers(tmp_path):
    repo = _broken_repo(tmp_path)
    code, out, err = human(repo, "check", "--kernel", "kernels/broken", "--arch", "sm_90",
                           "--sample", "1", "--seed", "3", "--json")
    result = json.loads(out.strip().splitlines()[-1])
    # tile has 3 values and occupancy 6: 6 rows hold them all, 1 more is drawn, of 18
    assert result["sample"] == {"variants": 7, "of_variants": 18, "extra": 1, "seed": 3,
                                "pairs": result["sample"]["pairs"], "of_pairs": 18}
    assert 6 <= result["sample"]["pairs"] < 18 and result["variants"] == 7
    # every value is compiled, so the one that cannot compile is still found
    assert code == 1 and [f["knobs"]["tile"] for f in result["failures"]] == [[1, 96]] * len(
        result["failures"]) and result["failures"], err
    code, out, err = human(repo, "check", "--kernel", "kernels/broken", "--sample", "x")
    assert code == 2 and "whole number" in err and "Traceback" not in err


def test_domains_hold_every_candidate_the_playbook_can_set():
    from perfloop.contract.playbook import SHIPPED, load

    doms = variants.domains(load(SHIPPED), {"occupancy": None, "tile": (1, 1024), "x": 1},
                            {"tile": ((1, 64),)})
    assert doms["occupancy"] == [None, 1, 2, 4, 8, 16]
    assert doms["tile"] == [(1, 1024), (1, 64)] and doms["x"] == [1]
    # an entry that moves several knobs together gives each of them its values
    import dataclasses

    from perfloop.contract.playbook import MULTI, Optimization

    pb = load(SHIPPED)
    both = Optimization("tile_occ", "t", "tile", MULTI,
                        ({"tile": (1, 4096), "occupancy": 32},), ("memory-bound",),
                        {"memory-bound": 1}, "", knobs=("tile", "occupancy"))
    doms = variants.domains(dataclasses.replace(pb, optimizations=(both,)),
                            {"occupancy": None, "tile": (1, 1024)},
                            {"occupancy+tile": ({"tile": (1, 64), "occupancy": 2},)})
    assert doms == {"occupancy": [None, 2], "tile": [(1, 1024), (1, 64)]}
    doms = variants.domains(dataclasses.replace(pb, optimizations=(both,)),
                            {"occupancy": None, "tile": (1, 1024)}, {})
    assert doms == {"occupancy": [None, 32], "tile": [(1, 1024), (1, 4096)]}


class CompilerExecutionError(Exception):  # cuTile's name for a compiler that failed
    pass


class _Flaky:
    """compile_ahead raising what cuTile raises when tileiras dies (or fails), `crashes` times."""

    def __init__(self, crashes: int, message: str = "Return code -11\n"):
        self.crashes, self.message, self.calls = crashes, message, 0

    def compile_ahead(self, knobs, shapes, arch):
        self.calls += 1
        if self.calls <= self.crashes:
            raise CompilerExecutionError(self.message)


def test_a_compiler_killed_by_a_signal_is_tried_once_more():
    from perfloop.commands.check import _compile

    once = _Flaky(1)
    _compile(once, {}, [], "sm_90")
    assert once.calls == 2
    twice = _Flaky(2)
    with pytest.raises(CompilerExecutionError):
        _compile(twice, {}, [], "sm_90")
    assert twice.calls == 2
    # a compiler that exits with an error is the variant's verdict: not tried again
    failed = _Flaky(1, "Return code 5\nerror: register allocation failed")
    with pytest.raises(CompilerExecutionError):
        _compile(failed, {}, [], "sm_90")
    assert failed.calls == 1


def test_all_combinations_past_the_cap_are_refused_in_one_line(tmp_path):
    repo = _broken_repo(tmp_path)   # a small space: --all is taken (one tile fails to compile)
    code, out, err = human(repo, "check", "--kernel", "kernels/broken", "--arch", "sm_90",
                           "--all", "--json")
    assert code == 1 and json.loads(out.strip().splitlines()[-1])["coverage"] == \
        "all combinations", err
    # twelve knobs, as the README-written row norm has: refused before anything compiles
    shutil.copytree(ROOT / "tests" / "readme_rownorm" / "kernels" / "rownorm",
                    repo / "kernels" / "rownorm")
    (repo / "tests" / "judge_rownorm.py").write_text("")
    code, out, err = human(repo, "check", "--kernel", "kernels/rownorm", "--arch", "sm_90",
                           "--all")
    lines = (out + err).strip().splitlines()
    assert code == 2 and len(lines) == 1, out + err
    assert "--all would compile" in lines[0] and "more than 5000" in lines[0]
