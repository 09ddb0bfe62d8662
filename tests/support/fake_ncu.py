"""A stand-in for Nsight Compute's `ncu`, for machines without a GPU: it runs the profiled
command as ncu would, then prints canned metrics in ncu's --csv format (to --log-file if given).
FAKE_NCU_MODE: memory | compute (a profile of that kind), perm (ERR_NVGPUCTRPERM, no metrics),
plus FAKE_NCU_UNKNOWN: metric names this "GPU" does not have (ncu then fails before running
the command). Every call is logged, as JSON lines, to FAKE_NCU_LOG."""

import json
import os
import subprocess
import sys

VALUE_OPTIONS = {"--metrics", "--print-units", "--clock-control", "--target-processes",
                 "--profile-from-start", "--launch-skip", "--launch-count", "--log-file",
                 "--kernel-name"}
HEADER = ['ID', 'Process ID', 'Process Name', 'Host Name', 'Kernel Name', 'Context', 'Stream',
          'Block Size', 'Grid Size', 'Device', 'CC', 'Section Name', 'Metric Name',
          'Metric Unit', 'Metric Value']
PROFILES = {
    "memory": {"gpu__time_duration.sum": ("nsecond", "612,448"),
               "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "86.41"),
               "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "31.20"),
               "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", "72.53"),
               "launch__registers_per_thread": ("register/thread", "32"),
               "smsp__sass_inst_executed_op_local_ld.sum": ("inst", "0"),
               "smsp__sass_inst_executed_op_local_st.sum": ("inst", "0"),
               "lts__t_sector_hit_rate.pct": ("%", "12.30"),
               "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "0")},
    "compute": {"gpu__time_duration.sum": ("usecond", "1,204.51"),
                "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "18.52"),
                "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "83.14"),
                "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", "45.02"),
                "launch__registers_per_thread": ("register/thread", "96"),
                "smsp__sass_inst_executed_op_local_ld.sum": ("inst", "0"),
                "smsp__sass_inst_executed_op_local_st.sum": ("inst", "0"),
                "lts__t_sector_hit_rate.pct": ("%", "88.00"),
                "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "0")},
}


def row(kernel_id, name, metric, unit, value):
    cells = [str(kernel_id), "4242", "python3", "127.0.0.1", name, "1", "7", "(128, 1, 1)",
             "(1024, 1, 1)", "0", "9.0", "Command line profiler metrics", metric, unit, value]
    return ",".join(f'"{c}"' for c in cells)


def main(argv):
    if argv == ["--version"]:
        print("NVIDIA (R) Nsight Compute Command Line Profiler\n"
              "Copyright (c) 2018-2024 NVIDIA Corporation\n"
              "Version 2024.1.1.0 (build 33998838) (public-release)")
        return 0
    options, i = {}, 0
    while i < len(argv) and argv[i].startswith("--"):
        if argv[i] in VALUE_OPTIONS:
            options[argv[i]] = argv[i + 1]
            i += 2
        else:
            options[argv[i]] = True
            i += 1
    app = argv[i:]
    mode = os.environ.get("FAKE_NCU_MODE", "memory")
    metrics = options.get("--metrics", "").split(",")
    entry = {"options": options, "app": app, "app_returncode": None}
    out = []
    unknown = [m for m in metrics if m in os.environ.get("FAKE_NCU_UNKNOWN", "").split(",")]
    if unknown:
        name = unknown[0].replace(".", "\\.")
        out.append(f"==ERROR== Failed to find metric regex:^{name}$")
        code = 1
    else:
        out.append(f"==PROF== Connected to process 4242 ({app[0] if app else '?'})")
        entry["app_returncode"] = subprocess.run(app).returncode
        if mode == "perm":
            out.append("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to "
                       "access NVIDIA GPU Performance Counters on the target device 0. For "
                       "instructions on enabling permissions and to get more information see "
                       "https://developer.nvidia.com/ERR_NVGPUCTRPERM")
            out.append("==WARNING== No kernels were profiled.")
        else:
            out.append('"' + '","'.join(HEADER) + '"')
            # a short fill kernel first, then the kernel that matters (the longer one)
            for metric in metrics:
                if metric == "gpu__time_duration.sum":
                    out.append(row(0, "vectorized_elementwise_kernel", metric, "nsecond", "2,112"))
            for metric in metrics:
                if metric in PROFILES[mode]:
                    unit, value = PROFILES[mode][metric]
                    out.append(row(1, "cutile_kernel_main", metric, unit, value))
        out.append("==PROF== Disconnected from process 4242")
        code = 0
    text = "\n".join(out) + "\n"
    if "--log-file" in options:
        with open(options["--log-file"], "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if os.environ.get("FAKE_NCU_LOG"):
        with open(os.environ["FAKE_NCU_LOG"], "a") as f:
            f.write(json.dumps(entry) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
