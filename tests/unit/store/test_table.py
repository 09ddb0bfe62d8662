"""perf_results.md's rows (perfloop.store.table): exactly the format the seeds wrote."""

from perfloop.store import table


def test_table_format_is_exactly_the_seeds():
    assert table.HEADER.splitlines()[0].split("|")[1:-1] == [
        " iteration ", f" {'optimization':<40} ", " latency_ms ", " correctness ", " status "]
    assert table.HEADER.splitlines()[1] == f"|----------:|:{'-' * 41}|-----------:|:------------|-------:|"
    assert table.format_row(0, "baseline", 0.82, "PASS", "keep") == \
        f"| 0         | {'baseline':<40} |   0.820000 | PASS        | keep   |\n"
    assert table.format_row(3, "a|b", None, "FAIL", "crash") == \
        f"| 3         | {'a/b':<40} |            | FAIL        | crash  |\n"
