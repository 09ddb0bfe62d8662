"""The row norm written from the README (tests/readme_rownorm/) stays a kernel perfloop takes:
its manifest, workload and finalists load, and its benchmark shapes fall in three buckets of
their own, as the runs in docs/findings/2026-11-26-kernels-from-the-readme.md saw them."""
from conftest import ROOT

from perfloop.contract import workload
from perfloop.contract.manifest import load_spec

REPO = ROOT / "tests" / "readme_rownorm"


def test_the_readme_row_norm_loads_with_three_buckets_and_its_finalists():
    spec = load_spec(REPO / "kernels" / "rownorm", REPO)
    wl = workload.load(spec.folder)
    assert wl.unseen == "tune" and len(wl.finalists) == 4
    assert (REPO / spec.judge).is_file()
    assert sorted(workload.shape_bucket(wl, s) for s in spec.shapes) == [
        "bfloat16/rows<=8192/hidden<=4096", "float16/rows<=1024/hidden<=16384",
        "float32/rows<=4096/hidden<=8192"]
    assert spec.read_knobs()["block_elems"] is None   # the start writing-a-kernel.md advises
