"""A kernel's work per execution unit (perfloop.contract.traffic): the floor and the class it gives, on
the CPU, with an H100's published facts standing in for a measured device."""

import pytest
from conftest import ROOT

from perfloop.contract import roofline, traffic
from perfloop.core.errors import UserError
from perfloop.contract.kernel import SHIPPED, Shape, import_module
from perfloop.contract.manifest import load_spec
from perfloop.contract.playbook import SHIPPED as PLAYBOOK
from perfloop.contract.playbook import Classes, load
from perfloop.plan import decide

H100 = {"sm": "sm_90", "sm_count": 132, "clock_sm_max": "1980"}   # nvidia-smi's max SM clock
H100_CEILINGS = {"copy_gbps": 3000.0, "bf16_tflops": 772.0,         # ~3.0e12 B/s measured copy
                 "unit_peaks_tflops": roofline.unit_peaks_tflops(H100)}
SHAPE = Shape("s", (4096,), "bfloat16", headline=True)


def test_each_units_peak_is_sms_times_max_clock_times_its_rate_per_sm():
    peaks = roofline.unit_peaks_tflops(H100)
    per_clock = 132 * 1980e6 / 1e12
    assert peaks["tensor.bf16"] == pytest.approx(4096 * per_clock)       # 1070 TFLOP/s
    assert peaks["tensor.fp16"] == peaks["tensor.bf16"]
    assert peaks["tensor.tf32"] == pytest.approx(peaks["tensor.bf16"] / 2)
    assert peaks["tensor.fp8"] == pytest.approx(peaks["tensor.bf16"] * 2)
    assert peaks["fp32"] == pytest.approx(256 * per_clock)               # 66.9 TFLOP/s
    assert peaks["sfu"] == pytest.approx(16 * per_clock)                 # 4.18 T results/s
    assert roofline.peak_tensor_tflops(H100) == peaks["tensor.bf16"]
    a100 = roofline.unit_peaks_tflops({"sm": "sm_80", "sm_count": 108, "clock_sm_max": "1410"})
    assert a100["tensor.bf16"] == pytest.approx(311.9, abs=0.1) and "tensor.fp8" not in a100
    assert a100["fp32"] == pytest.approx(19.5, abs=0.05)
    b200 = roofline.unit_peaks_tflops({"sm": "sm_100", "sm_count": 148, "clock_sm_max": "1965"})
    assert b200["tensor.fp8"] == pytest.approx(2 * b200["tensor.bf16"])
    assert roofline.unit_peaks_tflops({"sm": "sm_75", "sm_count": 40, "clock_sm_max": "1500"}) == {}
    assert roofline.unit_peaks_tflops({"sm": "sm_90", "clock_sm_max": "[N/A]", "sm_count": 1}) == {}


def test_both_forms_of_traffic_read_as_work_per_unit():
    old = traffic.parse((1000, 5000), "k")
    assert old == traffic.Work(1000.0, {"tensor.bf16": 5000.0})   # what the pair always meant
    new = traffic.parse({"bytes": 1000, "flops": {"tensor.bfloat16": 10, "tensor.bf16": 5,
                                                  "fp32": 7, "sfu": 0}}, "k")
    assert new.flops == {"tensor.bf16": 15.0, "fp32": 7.0} and new.total_flops == 22
    assert traffic.parse({"bytes": 8}, "k") == traffic.Work(8.0, {})
    assert traffic.parse([8, 0], "k").flops == {}


@pytest.mark.parametrize("raw,words", [
    (12, "returned int 12"),
    ((1, 2, 3), "returned tuple"),
    ((-1, 2), "bytes -1"),
    ((1, "many"), "flops 'many'"),
    ({"flops": {"fp32": 1}}, "keys ['flops']"),
    ({"bytes": 1, "flops": 7}, "keys ['bytes', 'flops']"),
    ({"bytes": 1, "flop": {}}, "keys ['bytes', 'flop']"),
    ({"bytes": 1, "flops": {"tensor.int4": 1}}, "unknown execution unit 'tensor.int4'"),
    ({"bytes": 1, "flops": {"fp32": float("nan")}}, "flops['fp32']"),
    ({"bytes": True, "flops": {}}, "bytes True"),
])
def test_a_wrong_traffic_is_one_line_naming_the_kernel(raw, words):
    class Module:
        @staticmethod
        def traffic(shape):
            return raw

    with pytest.raises(UserError) as err:
        traffic.of(Module, SHAPE, "mine")
    message = str(err.value)
    assert "\n" not in message and "kernel 'mine': traffic(shape 's')" in message
    assert words in message, message


def test_a_traffic_that_raises_or_is_missing_is_one_line():
    class Raises:
        @staticmethod
        def traffic(shape):
            raise KeyError("dtype\nsecond line")

    with pytest.raises(UserError, match=r"kernel 'mine': traffic\(shape 's'\) raised KeyError"):
        traffic.of(Raises, SHAPE, "mine")
    with pytest.raises(UserError, match="kernel 'mine': kernel.py has no traffic"):
        traffic.of(object(), SHAPE, "mine")


def test_floor_is_the_longest_of_the_bytes_and_each_units_operations():
    ceil = {**H100_CEILINGS, "l2_bytes": 0}
    peaks = ceil["unit_peaks_tflops"]
    gb = 1e9
    assert roofline.floor_ms(gb, {}, ceil) == pytest.approx(gb / 3000e6)
    # each unit alone, at its own peak: an exp-heavy kernel is bound by the SFUs
    sfu = 5e10
    assert roofline.floor_ms(gb, {"sfu": sfu}, ceil) == pytest.approx(sfu / (peaks["sfu"] * 1e9))
    fp32 = 1e12
    assert roofline.floor_ms(gb, {"fp32": fp32}, ceil) == pytest.approx(fp32 / (peaks["fp32"] * 1e9))
    tf32 = 2e14
    assert roofline.floor_ms(0, {"tensor.tf32": tf32}, ceil) == \
        pytest.approx(2 * roofline.floor_ms(0, {"tensor.bf16": tf32}, ceil))
    # the units run concurrently: the longest one, not their sum
    both = roofline.floor_ms(gb, {"sfu": sfu, "fp32": fp32}, ceil)
    assert both == pytest.approx(max(sfu / peaks["sfu"], fp32 / peaks["fp32"]) / 1e9)
    # the old number of FLOPs is bf16 tensor-core work
    assert roofline.floor_ms(0, 2 * 4096 ** 3, ceil) == \
        roofline.floor_ms(0, {"tensor.bf16": 2 * 4096 ** 3}, ceil)
    # the L2 write-back correction applies to the bytes of either form
    assert roofline.floor_ms(gb, {"fp32": 1}, {**ceil, "l2_bytes": 50e6}) == \
        pytest.approx(0.95e9 / 3000e6)


def test_floor_without_the_architectures_rates_stays_a_lower_bound():
    measured = {"copy_gbps": 3000.0, "bf16_tflops": 700.0}   # an unknown architecture
    f = 7e14
    assert roofline.floor_ms(0, {"tensor.bf16": f}, measured) == pytest.approx(f / 700e9)
    assert roofline.floor_ms(0, {"tensor.tf32": f}, measured) == pytest.approx(f / 700e9)
    # no peak known for these units: only the bytes bound the floor
    assert roofline.floor_ms(3e9, {"fp32": 1e15, "sfu": 1e15, "tensor.fp8": 1e15}, measured) == \
        pytest.approx(1.0)
    # an architecture without the unit (fp8 on sm_80) does not bound it either
    a100 = {"copy_gbps": 1500.0, "unit_peaks_tflops": roofline.unit_peaks_tflops(
        {"sm": "sm_80", "sm_count": 108, "clock_sm_max": "1410"})}
    assert roofline.floor_ms(1.5e9, {"tensor.fp8": 1e15}, a100) == pytest.approx(1.0)


def _classify(nbytes, flops, ceil=H100_CEILINGS, bounds=Classes()):
    peaks, bandwidth = roofline.roofline(ceil, flops)
    return decide.classify(nbytes, flops, peaks, bandwidth, bounds)


def test_class_boundaries_are_multiples_of_the_ridge_of_the_unit_that_dominates():
    ridge = H100_CEILINGS["unit_peaks_tflops"]["tensor.bf16"] * 1e12 / 3e12   # ~357 FLOP/byte
    assert _classify(1.0, {"tensor.bf16": 0.49 * ridge}).name == "memory-bound"
    assert _classify(1.0, {"tensor.bf16": 0.51 * ridge}).name == "balanced"
    assert _classify(1.0, {"tensor.bf16": 2.0 * ridge}).name == "balanced"
    assert _classify(1.0, {"tensor.bf16": 2.1 * ridge}).name == "compute-bound"
    # 20 FLOP/byte was balanced by the fixed bounds; on the tensor cores it is far below the
    # ridge, on the fp32 lanes (ridge ~22) it is near it, and on the SFUs far above
    assert _classify(1.0, {"tensor.bf16": 20}).name == "memory-bound"
    assert _classify(1.0, {"fp32": 20}).name == "balanced"
    assert _classify(1.0, {"sfu": 20}).name == "compute-bound"
    # the unit whose operations take longest decides, whatever has the most operations
    mixed = _classify(1.0, {"tensor.bf16": 300, "sfu": 4})   # 0.84x and 2.9x
    assert mixed.name == "compute-bound" and "sfu" in mixed.basis
    # the bounds are data
    assert _classify(1.0, {"fp32": 20}, bounds=Classes(memory_below=1.0)).name == "memory-bound"
    assert "ridge point" in mixed.basis


def test_without_device_facts_the_fixed_bounds_of_seed_002_apply():
    for flops, name in ((5.0, "memory-bound"), (20.0, "balanced"), (80.0, "compute-bound")):
        got = _classify(1.0, {"fp32": flops / 2, "sfu": flops / 2}, ceil=None)
        assert got.name == name and got.intensity == flops and "fixed bounds" in got.basis
        assert decide.classify(1.0, flops).name == name                  # the old call


def test_rules_give_the_class_bounds_and_pinned_rules_without_them_get_the_defaults():
    from perfloop.contract.playbook import rules_from_dict

    book = load(PLAYBOOK)
    assert book.rules.classes == Classes(0.5, 2.0, 10.0, 50.0)
    pinned = book.rules_dict()
    del pinned["classes"]
    assert rules_from_dict(pinned).classes == Classes()


def test_a_bad_class_bound_in_rules_is_one_line(tmp_path):
    import shutil

    shutil.copytree(PLAYBOOK, tmp_path / "pb")
    rules = tmp_path / "pb" / "rules.toml"
    rules.write_text(rules.read_text().replace("compute_above = 2.0", "compute_above = 0.1"))
    with pytest.raises(UserError, match=r"\[classes\] bounds"):
        load(tmp_path / "pb")


EXPECTED = {"swiglu": "memory-bound", "rmsnorm": "memory-bound", "softmax": "memory-bound",
            "matmul": "compute-bound"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_kernels_keep_their_classes_on_an_h100(name):
    spec = load_spec(SHIPPED / name, ROOT)
    module = import_module(spec.folder, f"test_traffic_{name}")
    done = traffic.of(module, spec.headline, name)
    got = _classify(done.bytes, done.flops, bounds=load(PLAYBOOK).rules.classes)
    assert got.name == EXPECTED[name], got.basis
    # the fixed bounds, from the same total, agree: the class did not change with the units
    assert decide.classify(done.bytes, done.total_flops).name == EXPECTED[name]
    floor = roofline.floor_ms(done.bytes, done.flops, {**H100_CEILINGS, "l2_bytes": 0})
    if name == "matmul":   # 2 x 4096^3 at the bf16 tensor peak
        assert set(done.flops) == {"tensor.bf16"}
        assert floor == pytest.approx(2 * 4096 ** 3 / (132 * 1980e6 * 4096) * 1e3)
    else:                  # the bytes at the copy bandwidth: arithmetic is far from binding
        assert {"fp32", "sfu"} <= set(done.flops)
        assert floor == pytest.approx(done.bytes / 3e12 * 1e3)
    for shape in spec.shapes + spec.held_back:   # every shape reads
        traffic.of(module, shape, name)


def test_work_from_a_record_reads_old_and_new_records():
    assert traffic.from_record({"bytes": 10, "flops": 40}).flops == {"tensor.bf16": 40.0}
    new = {"bytes": 10, "flops": 7, "flops_by_unit": {"fp32": 4, "sfu": 3}}
    assert traffic.from_record(new) == traffic.Work(10.0, {"fp32": 4.0, "sfu": 3.0})


def test_the_loop_classifies_the_baseline_from_its_record_against_the_timing_device():
    from types import SimpleNamespace

    from perfloop.measure import phases
    from perfloop.run import finish as iteration
    from perfloop.store.records import TimingDetail

    rounds = [[1.0] * 3] * 3
    timed = {"rounds": {"incumbent": rounds, "incumbent-again": rounds}, "reps": 3,
             "bytes": 1e9, "flops": 5e8, "flops_by_unit": {"sfu": 2.5e8, "fp32": 2.5e8}}
    summary = phases.summarize_pass({"shapes": {"head": timed}})
    assert summary["head"]["flops_by_unit"] == {"sfu": 2.5e8, "fp32": 2.5e8}

    def classified(ceil):
        s = SimpleNamespace(spec=SimpleNamespace(headline=SimpleNamespace(name="head")),
                            playbook=load(PLAYBOOK), state=SimpleNamespace())
        timing = TimingDetail.from_dict({"shapes": summary, "ceilings": ceil,
                                         "chosen": "incumbent", "labels": {}})
        iteration._classify(s, SimpleNamespace(timing=timing))
        return s.state

    on_h100 = classified(H100_CEILINGS)   # 0.25 sfu results per byte: 0.18x its ridge
    assert on_h100.kernel_class == "memory-bound" and on_h100.intensity == 0.25
    assert "sfu" in on_h100.class_basis and "ridge point" in on_h100.class_basis
    on_cpu = classified(None)            # no ceilings: 0.5 FLOP per byte, fixed bounds
    assert on_cpu.kernel_class == "memory-bound" and on_cpu.intensity == 0.5
    assert "fixed bounds" in on_cpu.class_basis


def test_a_timing_process_given_a_wrong_traffic_stops_with_its_one_line(tmp_path):
    import json

    from perfloop.measure import phases
    from perfloop.referee import timer as worker

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "kernel.py").write_text("def traffic(shape):\n    return 'lots'\n")
    spec = {"measure": {"rounds": 3, "round_ms": 5, "warmup_ms": 20, "min_reps": 3,
                        "max_reps": 5}, "progress": str(tmp_path / "progress.jsonl"),
            "variants": [], "contract_folder": str(folder), "out": str(tmp_path / "out.json"),
            "root": str(tmp_path),
            "shapes": [{"name": "s", "dims": [8], "dtype": "float32"}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert worker.main(str(tmp_path / "spec.json")) == 6
    last = phases._last_progress(tmp_path / "progress.jsonl")
    assert last["label"] is None and last["stage"] == "contract"
    assert last["reason"].startswith("kernel 'mine': traffic(shape 's') returned str lots")
