"""ncu's output and errors as perfloop.measure.ncu reads them, and the command it builds."""

from perfloop.measure import ncu

DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
GMMA = "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"

CSV = """==PROF== Connected to process 11 (/usr/bin/python3)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","11","python3","h","fill(float*)","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","5,000"
"1","11","python3","h","main_kernel","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2,048.5"
"1","11","python3","h","main_kernel","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","launch__registers_per_thread","register/thread","168"
"1","11","python3","h","main_kernel","1","7","(128, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","smsp__sass_inst_executed_op_local_ld.sum","inst","n/a"
==PROF== Disconnected from process 11
"""


def test_ncu_csv_is_parsed_per_kernel_and_the_longest_kernel_is_the_one_that_counts():
    # (5,000 ns of fill against 2,048.5 us of the main kernel: units count, not digits)
    kernels = ncu.parse(CSV)
    assert [k["name"] for k in kernels] == ["fill(float*)", "main_kernel"]
    main = ncu.main_kernel(kernels)
    assert main["name"] == "main_kernel" and main["grid"] == "(1024, 1, 1)"
    assert main["metrics"]["gpu__time_duration.sum"] == {"unit": "usecond", "value": 2048.5,
                                                         "raw": "2,048.5"}
    picked = ncu.pick(main, {"registers": ["launch__registers_per_thread"],
                             "spills": ["smsp__sass_inst_executed_op_local_ld.sum"],
                             "tensor": ["nope", "launch__registers_per_thread"]})
    assert picked["registers"] == {"metric": "launch__registers_per_thread", "value": 168.0,
                                   "unit": "register/thread"}
    assert "spills" not in picked and picked["tensor"]["value"] == 168.0   # n/a is no number


def test_ncu_errors_are_recognized():
    assert ncu.permission_denied("==ERROR== ERR_NVGPUCTRPERM - The user does not have ...")
    wanted = [DRAM, GMMA, "smsp__sass_inst_executed_op_local_ld.sum"]
    text = ("==ERROR== Failed to find metric regex:^sm__pipe_tensor_op_gmma_cycles_active\\.avg"
            "\\.pct_of_peak_sustained_active$\n==ERROR== Failed to find metric "
            "regex:^smsp__sass_inst_executed_op_local_ld\\.(sum|avg|min|max)$")
    assert ncu.unknown_metrics(text, wanted) == wanted[1:]
    assert ncu.unknown_metrics("==PROF== ok", wanted) == []
    cmd = ncu.command("ncu", [DRAM, SM], ["python", "t.py"], log="x.csv", kernel_name="gemm")
    assert cmd[:6] == ["ncu", "--csv", "--print-units", "base", "--metrics", f"{DRAM},{SM}"]
    assert cmd[-4:] == ["--kernel-name", "regex:gemm", "python", "t.py"]
    assert "--target-processes" in cmd and cmd[cmd.index("--profile-from-start") + 1] == "off"
