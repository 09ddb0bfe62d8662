"""RMSNorm and softmax load and store unmasked where their constants say the row's tiles end
at n (EXACT): a wrong EXACT reads and writes past the row. Checked on the CPU over every
width up to 20000 (softmax: 70000) and the knobs that shape the tiles; and softmax's split
of few wide rows across blocks covers each row once."""

import itertools
import pytest
from conftest import ROOT

pytest.importorskip("cuda.tile")
pytest.importorskip("torch")

from perfloop.contract.kernel import import_module, read_knobs  # noqa: E402

FOLDER = ROOT / "kernels" / "rmsnorm"


@pytest.fixture(scope="module")
def rmsnorm():
    return import_module(FOLDER, "row_tiles_rmsnorm")


@pytest.mark.parametrize("split_row,cols,block_elems",
                         list(itertools.product([False, True], [0, 1024], [None, 4096, 32768])))
def test_exact_only_where_the_tiles_end_at_n(rmsnorm, split_row, cols, block_elems):
    knobs = {**read_knobs(FOLDER / "knobs.json"), "tile": (1, cols),
             "block_elems": block_elems, "split_row": split_row}
    exact_widths = set()
    for n in range(1, 20001):
        tm, tn, tt, one_tile, *_, exact = rmsnorm._constants(knobs, n)
        if not exact:
            continue
        exact_widths.add(n)
        assert one_tile and tn + tt == n, (n, tn, tt)
        # the tail tile is read at tile index tn // tt of width tt: it must start at tn
        assert tt == 0 or (tn % tt == 0 and tn // tt * tt == tn), (n, tn, tt)
        assert tm >= 1
    powers = {1 << k for k in range(15) if 1 << k <= 20000}
    if cols:                      # a row wider than the tile is read in pieces, masked
        assert max(exact_widths) == cols and {n for n in powers if n <= cols} <= exact_widths
    else:
        assert powers <= exact_widths
        assert ({3072, 5120, 12288} <= exact_widths) == split_row
        assert 5000 not in exact_widths and 3000 not in exact_widths


@pytest.fixture(scope="module")
def softmax():
    return import_module(FOLDER.parent / "softmax", "row_tiles_softmax")


@pytest.mark.parametrize("cols,block_elems", list(itertools.product([0, 2048], [None, 4096])))
def test_softmax_exact_only_where_one_tile_is_the_row(softmax, cols, block_elems):
    knobs = {**read_knobs(FOLDER.parent / "softmax" / "knobs.json"), "tile": (1, cols),
             "block_elems": block_elems}
    exact = [n for n in range(1, 70001) if softmax._constants(knobs, 1000, n, 132)[-1]]
    for n in exact:
        tm, tn, one_tile = softmax._constants(knobs, 1000, n, 132)[:3]
        assert one_tile and tn == n and tm >= 1, n
    assert exact == [1 << k for k in range(17) if 1 << k <= (cols or softmax.WHOLE_MAX)]


@pytest.mark.parametrize("m", [1, 2, 5, 16, 31, 32, 100])
@pytest.mark.parametrize("n", [32768, 32769, 40000, 50304, 128256])
def test_softmax_splits_cover_the_row_once(softmax, m, n):
    knobs = {"split_rows": 32}
    split = softmax.splits(knobs, m, n, 132)
    if m >= 32 or n <= softmax.WHOLE_MAX:
        assert split is None
        return
    parts, chunk, parts_pow2 = split
    tiles = -(-n // softmax.SPLIT_COLS)
    assert (parts - 1) * chunk < tiles <= parts * chunk      # no chunk empty, none past n
    assert parts <= parts_pow2 < 2 * parts and parts_pow2 & (parts_pow2 - 1) == 0
    assert softmax.splits({"split_rows": None}, m, n, 132) is None
