"""A kernel's runs as perfloop.store.session finds them in sandbox/_archive/."""


def test_the_latest_archived_run_is_the_one_that_started_last(tmp_path):
    from perfloop.store.session import latest_archived

    assert latest_archived(tmp_path / "none") is None
    for name in ("cutile-perf-k-20250101-1700000300", "cutile-perf-k-20250101-2-1700000900",
                 "cutile-perf-k-20250102-1700000500", "cutile-perf-k-20250103-1700009999"):
        (tmp_path / name).mkdir()
        if not name.endswith("9999"):   # (no state.json: not a run)
            (tmp_path / name / "state.json").write_text("{}")
    assert latest_archived(tmp_path).name == "cutile-perf-k-20250101-2-1700000900"
