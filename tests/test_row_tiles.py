"""RMSNorm loads and stores unmasked where its constants say the row's tiles end at n
(EXACT): a wrong EXACT reads and writes past the row. Checked on the CPU over every width
up to 20000 and the knobs that shape the tiles."""

import itertools
from pathlib import Path

import pytest

pytest.importorskip("cuda.tile")
pytest.importorskip("torch")

from perfloop.core.kernel import import_module, read_knobs  # noqa: E402

FOLDER = Path(__file__).resolve().parent.parent / "kernels" / "rmsnorm"


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
