"""perfloop.kernel_tools: the launcher, kernel-object, grid and inputs boilerplate the shipped
kernels share (their GPU behaviour is checked by their own GPU tests)."""

import json

import pytest
import torch
from conftest import ROOT

from perfloop import kernel_tools as kt
from perfloop.contract.kernel import import_module


def test_the_public_path_is_the_core_module():
    from perfloop.contract import kernel_tools

    assert kt is kernel_tools


def test_a_launcher_is_built_once_per_set_of_knobs_with_lists_as_tuples(tmp_path):
    knobs_file = tmp_path / "knobs.json"
    knobs_file.write_text(json.dumps({"tile": [1, 1024], "occupancy": None}))
    built = []

    def build(knobs):
        built.append(knobs)
        return lambda inputs, out: knobs

    launcher = kt.launchers(build, knobs_file)
    assert launcher() is launcher() and launcher(None) is launcher()
    assert built == [{"tile": (1, 1024), "occupancy": None}]
    knobs_file.write_text(json.dumps({"tile": [1, 64], "occupancy": None}))
    launcher()   # the file is read once, at the first call
    assert len(built) == 1
    mine = launcher({"occupancy": 2, "tile": [2, 64]})
    assert mine is launcher({"tile": [2, 64], "occupancy": 2})   # key order does not matter
    assert mine(None, None) == {"occupancy": 2, "tile": (2, 64)} and len(built) == 2


def test_one_kernel_object_per_set_of_hints(monkeypatch):
    ct = pytest.importorskip("cuda.tile")

    made = []
    monkeypatch.setattr(ct, "kernel", lambda fn, **hints: made.append(hints) or object())

    def body(x):
        pass

    kernel_object = kt.kernel_objects(body)
    assert kernel_object(4) is kernel_object(4, None) is kernel_object(occupancy=4)
    assert kernel_object(None, 2) is not kernel_object(4, 2)
    assert kernel_object() is kernel_object(None, None)
    assert kernel_object(worker_warps=8) is kernel_object(None, None, 8)
    assert made == [{"occupancy": 4}, {"num_ctas": 2}, {"occupancy": 4, "num_ctas": 2}, {},
                    {"num_worker_warps": 8}]


def test_a_persistent_grid_has_at_most_per_sm_blocks_on_every_sm(monkeypatch):
    monkeypatch.setattr(kt, "sm_count", lambda index: 132 if index == 0 else 8)
    cpu, second = torch.device("cpu"), torch.device("cuda", 1)
    assert kt.grid(1000, False, 4, cpu) == (1000,)
    assert kt.grid(1000, True, 4, cpu) == (528,)
    assert kt.grid(100, True, 4, cpu) == (100,)
    assert kt.grid(1000, True, 2, second) == (16,)


def test_draws_repeat_torchs_own_draws_for_a_seed():
    draw = kt.Draws(5, "cpu")
    a, u, b = draw.normal((3, 4)), draw.uniform((3, 1)), draw.normal(4)
    g = torch.Generator(device="cpu").manual_seed(5)
    assert torch.equal(a, torch.randn((3, 4), generator=g, dtype=torch.float32))
    assert torch.equal(u, torch.rand((3, 1), generator=g))
    assert torch.equal(b, torch.randn(4, generator=g, dtype=torch.float32))
    assert a.dtype == torch.float32 and not torch.equal(a, kt.Draws(6, "cpu").normal((3, 4)))


def test_dtypes_and_tma_codes():
    assert kt.dtypes() == {"bfloat16": torch.bfloat16, "float16": torch.float16,
                           "float32": torch.float32}
    assert kt.dtypes(("float16",)) == {"float16": torch.float16}
    assert kt.TMA_CODE == {None: -1, False: 0, True: 1}


def test_array_constraints_are_row_contiguous():
    pytest.importorskip("cuda.tile")
    assert kt.array("float16").stride_constant == (None, 1)
    assert kt.array("float32", 1).stride_constant == (1,)
    assert kt.array("bfloat16", 3).ndim == 3


def test_rows_per_block_halve_until_every_sm_has_two_blocks():
    assert kt.fill_rows(64, 32768, 132) == 64          # 512 blocks: as the knobs say
    assert kt.fill_rows(256, 11782, 132) == 32         # 369 blocks, not 47
    assert kt.fill_rows(8, 298, 132) == 1              # fewer rows than SMs: one per block
    assert kt.fill_rows(1, 7, 132) == 1
    assert kt.fill_rows(16, 4224, 132) == 16           # exactly two blocks per SM


@pytest.mark.parametrize("rows,cols,tile", [(1, 11008, [1, 1024]), (4096, 14336, [1, 2048]),
                                            (70001, 3, [1, 1024]), (200000, 5000, [2, 1024]),
                                            (131070, 2048, [1, 2048])])
def test_swiglus_grid_covers_every_tile_once_within_the_y_limit(rows, cols, tile):
    swiglu = import_module(ROOT / "kernels" / "swiglu", "grid_swiglu")
    x, y, z = swiglu.grid({"tile": tile, "persistent": False}, rows, cols, torch.device("cpu"))
    row_tiles, col_tiles = -(-rows // tile[0]), -(-cols // tile[1])
    assert x == col_tiles and y <= 65535
    # the kernel's row index i = y_index + z_index * y skips i >= row_tiles
    covered = sorted(yi + zi * y for zi in range(z) for yi in range(y))
    assert [i for i in covered if i < row_tiles] == list(range(row_tiles))
    assert len(covered) - row_tiles < z


def test_streaming_reads_sets_nothing_for_a_tensor_off_the_gpu(monkeypatch):
    def no_driver():
        raise AssertionError("the driver was reached for a CPU tensor")

    monkeypatch.setattr(kt, "_libcuda", no_driver)
    with kt.streaming_reads(torch.ones(4)):
        pass


def _window(stream):
    import ctypes

    got = kt._StreamAttr()
    assert kt._libcuda().cuStreamGetAttribute(ctypes.c_void_p(stream.cuda_stream),
                                              kt._ACCESS_POLICY_WINDOW, ctypes.byref(got)) == 0
    w = got.window
    return w.base_ptr or 0, w.num_bytes, w.hit_prop


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_streaming_reads_marks_the_tensor_on_the_stream_and_puts_back_the_window_before():
    stream = torch.cuda.Stream()
    x = torch.randn(4096, 1024, device="cuda")
    y = torch.randn(64, device="cuda")
    expected = x.square().sum(dim=1)
    with torch.cuda.stream(stream):
        before = _window(stream)
        with kt.streaming_reads(x):
            assert _window(stream) == (x.data_ptr(), x.numel() * 4, kt._STREAMING)
            got = x.square().sum(dim=1)
            with kt.streaming_reads(y):          # nested: the outer window comes back after
                assert _window(stream)[0] == y.data_ptr()
            assert _window(stream)[0] == x.data_ptr()
        assert _window(stream) == before
        with pytest.raises(ValueError), kt.streaming_reads(x):
            raise ValueError("a launch that failed")
        assert _window(stream) == before          # put back on the way out of an error too
    stream.synchronize()
    assert torch.equal(got, expected)
    big = torch.empty(kt._max_window(0) // 2 + 1, dtype=torch.float32, device="cuda")
    with torch.cuda.stream(stream), kt.streaming_reads(big):   # past the largest window
        assert _window(stream)[1] == kt._max_window(0)
