"""The timing worker's result file as the parent reads it (perfloop.measure.phases): anything
that is not a result reads as none."""

from perfloop.measure import phases


def test_a_timing_result_that_is_not_a_result_reads_as_none(tmp_path):
    for i, garbage in enumerate(["not json", "[1, 2]", ""]):
        path = tmp_path / f"timing-{i}.json"
        path.write_text(garbage)
        assert phases._read_result(path) is None
    assert phases._read_result(tmp_path / "missing.json") is None
