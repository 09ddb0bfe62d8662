"""Matmul's tail_tile, on the CPU: which rows make whole waves, and that a launch with it runs
those rows in its tiles and the rest in the tail's, each row once."""

import random

import pytest

torch = pytest.importorskip("torch")
# `matmul`: the shipped kernel.py on the CPU (conftest.py)


def test_rows_in_whole_waves_at_the_shapes_measured(matmul):
    # 1721 x 4096: 13 whole rows of 32 tiles (416) are 3 waves of 132 and a bit: 12 rows
    assert matmul.wave_rows(1721, 4096, 128, 128, 132) == 1536
    assert matmul.wave_rows(1268, 4096, 128, 128, 132) == 1024
    assert matmul.wave_rows(188, 8192, 128, 128, 132) == 0     # 64 tiles: under one wave
    assert matmul.wave_rows(33 * 128, 512, 128, 128, 132) == 0  # exactly one wave: one launch
    assert matmul.wave_rows(100, 4096, 128, 128, 1) == 0        # no whole row of tiles


@pytest.mark.parametrize("seed", range(5))
def test_the_first_launch_ends_on_a_nearly_full_wave_and_leaves_the_rest(matmul, seed):
    rng = random.Random(seed)
    split = 0
    for _ in range(400):
        m, n = rng.randint(1, 9000), rng.randint(1, 30000)
        tm, tn = rng.choice([64, 128, 256]), rng.choice([64, 128, 256])
        slots = rng.choice([1, 114, 132, 264])
        rows = matmul.wave_rows(m, n, tm, tn, slots)
        per_row, whole = -(-n // tn), m // tm * -(-n // tn)
        if rows == 0:   # under one wave, a row of tiles wider than the waves, or no tail left
            fit = whole // slots * slots // per_row * tm
            assert whole < slots or fit == 0 or fit >= m
            continue
        split += 1
        assert 0 < rows < m and rows % tm == 0
        tiles = rows // tm * per_row
        waves = -(-tiles // slots)
        assert waves * slots - tiles < per_row      # its last wave lacks under a row of tiles
        assert whole >= waves * slots or tiles % slots == 0
    assert split > 50


def test_a_launch_with_a_tail_runs_each_row_once_in_the_right_tiles(matmul, monkeypatch):
    calls = []

    def fake_launch(knobs):
        def launch(inputs, out):
            a, _ = inputs
            calls.append((tuple(knobs["tile"]), knobs["persistent"], a.shape[0]))
            out.fill_(float(len(calls)))
            return out
        return launch

    monkeypatch.setattr(matmul, "_one_launch", fake_launch)
    monkeypatch.setattr(matmul.kt, "sm_count", lambda index: 132)
    base = {"tile": [128, 128, 64], "group": 8, "num_ctas": None, "occupancy": None,
            "worker_warps": None, "persistent": True, "latency": None, "load_allow_tma": None,
            "store_allow_tma": None}
    a, b = torch.zeros(1721, 8), torch.zeros(8, 4096)
    out = torch.zeros(1721, 4096)
    matmul._build_one({**base, "tail_tile": [64, 128, 64]})((a, b), out)
    assert calls == [((128, 128, 64), True, 1536), ((64, 128, 64), False, 185)]
    assert torch.equal(out[:1536], torch.full((1536, 4096), 1.0))
    assert torch.equal(out[1536:], torch.full((185, 4096), 2.0))
    calls.clear()
    matmul._build_one({**base, "tail_tile": [64, 128, 64]})((a[:188], b), out[:188])
    assert calls == [((128, 128, 64), True, 188)]       # under one wave: one launch
    calls.clear()
    matmul._build_one({**base, "tail_tile": None})((a, b), out)
    assert calls == [((128, 128, 64), True, 1721)]
