"""RESULTS.md as rendered from the record (perfloop.report.results): pure functions, no run.
`perfloop report --results` on a real run is tested in test_report.py."""

import re

from perfloop.report import results

TABLE = ("| iteration | optimization                             | latency_ms | correctness | status |\n"
         "|----------:|:-----------------------------------------|-----------:|:------------|-------:|\n"
         "| 0         | baseline                                 |   0.671616 | PASS        | keep   |\n"
         "| 1         | tile_shape: tile=128x128x64              |   0.226944 | PASS        | keep   |\n")
GPU = {"gpu_name": "NVIDIA H100 80GB HBM3", "sm": "sm_90", "sm_count": 132,
       "driver": "580.159.04", "cutile": "1.7.0", "tileiras": "release 13.4, V13.4.92",
       "torch": "2.11.0", "python": "3.12.3", "host": "gpu-1", "clock_sm": "1980"}
CONFIRMED = {"square": {"baseline_ms": 0.6716, "final_ms": 0.1875, "speedup": 3.581,
                        "speedup_ci": [3.554, 3.599]},
             "skinny": {"baseline_ms": 0.0972, "final_ms": 0.0517, "speedup": 1.880,
                        "speedup_ci": [1.871, 1.889]}}


def bench_rows():
    rows = []
    for shape, ours in (("skinny", 0.0517), ("square", 0.1866)):   # not kernel.toml's order
        for variant, ms in (("cutile", ours), ("cutile-again", ours * 1.001),
                            ("torch-eager", 0.1800 if shape == "square" else 0.0502)):
            ratio = ms / ours
            rows.append({"shape": shape, "variant": variant, "median_ms": ms,
                         "share_of_floor": 0.688 if variant == "cutile" else None,
                         "vs_cutile": ratio, "ratio_ci": [ratio - 0.002, ratio + 0.002]})
    return rows


def facts(**changes):
    base = dict(kernel="matmul", branch="cutile-perf-matmul-20261122", started_at=1795000000.0,
                stopped="no improvement in 2 consecutive iterations of the catalog",
                environment=GPU, table=TABLE, shapes=["square", "skinny"], headline="square",
                confirmation=CONFIRMED, bench={"rows": bench_rows()}, bench_of_final=True)
    return results.RunFacts(**{**base, **changes})


def test_the_page_holds_the_machine_the_table_as_written_the_confirmation_and_the_bench():
    text = results.page(facts())
    assert text.startswith("# matmul: the current result\n")
    assert ("**Machine:** NVIDIA H100 80GB HBM3, sm_90, 132 SMs, driver 580.159.04, cuTile "
            "1.7.0, tileiras release 13.4, V13.4.92, torch 2.11.0, Python 3.12.3.") in text
    assert TABLE in text                                   # byte for byte
    assert "run `cutile-perf-matmul-20261122`" in text and "stopped: no improvement" in text
    assert "| square (headline) | 0.6716 | 0.1875 | 3.581x (3.554-3.599) |" in text
    assert "| skinny | 0.0972 | 0.0517 | 1.880x (1.871-1.889) |" in text
    assert "timed the final knobs" in text
    assert "| square (headline) | cutile | 0.1866 | 0.688 | 1.000 |" in text
    assert "| square (headline) | torch-eager | 0.1800 | - | 0.965 (0.963-0.967) |" in text
    bench = text.split("## Against peers", 1)[1]
    assert bench.index("| square") < bench.index("| skinny")    # kernel.toml's order
    assert "## Workload" not in text
    assert len(text) <= results.LIMIT


def test_a_page_says_what_it_lacks():
    text = results.page(facts(confirmation=None, stopped=None, bench=None,
                              environment={"python": "3.11.7", "torch": "2.13.0+cpu"}))
    assert "not stopped yet" in text
    assert "Not confirmed: the run has not stopped" in text
    assert "**Machine:** no GPU recorded (a kernel timed on the CPU); torch 2.13.0+cpu, " \
           "Python 3.11.7." in text
    assert "## Against peers" not in text
    failed = results.page(facts(confirmation=None, confirmation_error="the confirmation could "
                                "not be timed: final: crashed"))
    assert "Not confirmed: the confirmation could not be timed: final: crashed." in failed
    other = results.page(facts(bench_of_final=False))
    assert "other knobs than the final ones: run `perfloop bench` again" in other
    same = results.page(facts(confirmation={"square": {"speedup": 1.0, "speedup_ci": [1.0, 1.0]}},
                              nothing_kept=True))
    assert "Nothing was kept: the final incumbent is the baseline commit" in same
    assert "(1.000-1.000)" not in same   # a ratio by definition is no measurement with a CI


def test_workload_rows_render_as_a_table_of_their_keys():
    workload = [{"shape": "held:h2048", "bucket": "bfloat16/n2048", "cutile_ms": 0.012345,
                 "best_peer": "torch-compile", "peer_ms": 0.0119, "vs_best": [0.95, 0.97],
                 "below_0.9": False}]
    text = results.page(facts(bench={"rows": bench_rows(), "workload": workload}))
    section = text.split("## Workload", 1)[1]
    assert "| shape | bucket | cutile_ms | best_peer | peer_ms | vs_best | below_0.9 |" in section
    assert "| held:h2048 | bfloat16/n2048 | 0.01235 | torch-compile | 0.0119 | 0.95-0.97 | " \
           "false |" in section


def test_a_workload_object_gives_lines_for_its_values_and_tables_for_its_records():
    below = [f"held:bf16:{n}x4096x4096" for n in range(1000, 1006)]   # (past a cell's width)
    workload = {"geomean_vs_best_peer": 0.9712, "below": below,
                "shapes": {"held:a": {"cutile_ms": 1.0, "peer": "triton"},
                           "held:b": {"cutile_ms": 2.0, "peer": "triton", "note": "a|b"}}}
    section = results.page(facts(bench={"rows": [], "workload": workload})).split(
        "## Workload", 1)[1]
    assert "- geomean_vs_best_peer: 0.9712" in section and f"- below: {', '.join(below)}\n" in section
    assert "|  | cutile_ms | peer | note |" in section
    assert "| held:b | 2 | triton | a/b |" in section     # a pipe would break the table


def test_a_long_workload_is_cut_to_keep_the_page_short():
    workload = [{"shape": f"held:{i}", "cutile_ms": 0.1 + i, "best_peer_ms": 0.2 + i,
                 "peer": "torch-compile"} for i in range(400)]
    text = results.page(facts(bench={"rows": bench_rows(), "workload": workload}))
    assert len(text) <= results.LIMIT
    shown = re.findall(r"^\| held:\d+ ", text, re.M)
    left = int(re.search(r"^(\d+) more rows in bench.json's \"workload\"", text, re.M)[1])
    assert len(shown) > 10 and len(shown) + left == 400


def test_cells():
    assert results.cell(None) == "-" and results.cell(True) == "true"
    assert results.cell(0.123456) == "0.1235" and results.cell(3) == "3"
    assert results.cell([0.991, 1.003]) == "0.991-1.003"
    assert results.cell({"b": 1, "a": [1, 2, 3]}) == '{"a": [1, 2, 3], "b": 1}'
    assert results.cell("x" * 100).endswith("...") and len(results.cell("x" * 100)) == 60
