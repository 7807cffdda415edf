#!/usr/bin/env bash
# Where a kernel's time goes, per pipe: ncu on tools/profile_problem.py's problems, one profiled
# launch each, with the issue-slot and pipe utilizations (tensor, FMA, ALU, XU = MUFU), the DRAM
# throughput and the warp stall reasons, as one markdown table (OUT/pipes.md) and ncu's raw CSV.
# Usage on a Hopper machine with the hopattn package importable (PYTHONPATH, HOPATTN_LIBRARY):
#   tools/profile_pipes.sh OUT 'LABEL|KERNEL_REGEX|SKIP|PROFILE_PROBLEM_ARGS' ...
# SKIP: launches of matching kernels to skip first (the warm-up calls'); PROFILE_LAUNCHES (default 1)
# launches are profiled from there, so that KERNEL_REGEX '.' with a count covers every kernel of a
# call (a peer's, whose kernel names we do not know in advance). E.g.
#   tools/profile_pipes.sh out 'softcap d128|forward_kernel|2|dense --softcap 30' \
#     'no softcap d128|forward_kernel|2|dense' 'page 16|forward_kernel|2|chunked --page-size 16'
set -uo pipefail
out=$1
shift
mkdir -p "$out"
here=$(dirname "$0")
metrics=gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum
# The busiest SM sub-partition against the average one: warps are placed on sub-partitions by
# warp index mod 4, so work that only some warps of a CTA do (a producer's helpers) shows here.
metrics+=,smsp__inst_executed.max,smsp__inst_executed.avg
metrics+=,regex:sm__pipe_.*_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,regex:sm__inst_executed_pipe_.*.avg.pct_of_peak_sustained_active
metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio
n=0
for spec in "$@"; do
  IFS='|' read -r label kernel skip args <<< "$spec"
  n=$((n + 1))
  # shellcheck disable=SC2086  # the problem's arguments are meant to split
  timeout 300 ncu --clock-control none --target-processes all --kernel-name "regex:$kernel" \
    --launch-skip "$skip" --launch-count "${PROFILE_LAUNCHES:-1}" --metrics "$metrics" --csv --page raw \
    python3 "$here/profile_problem.py" $args > "$out/ncu-$n.csv" 2> "$out/ncu-$n.log" ||
    echo "profile_pipes: '$label' failed (see $out/ncu-$n.log)"
  echo "$label" > "$out/label-$n.txt"
done
python3 - "$out" "$n" <<'PY' | tee "$out/pipes.md"
import csv, io, sys
out, n = sys.argv[1], int(sys.argv[2])
def rows(path):
    text = open(path).read()
    start = text.find('"ID"')
    if start < 0:
        return []
    table = list(csv.reader(io.StringIO(text[start:])))
    header, units = table[0], dict(zip(table[0], table[1]))
    return [(dict(zip(header, r)), units) for r in table[2:] if len(r) == len(header)]
scale_to_us = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
pipes = ["tensor_op_gmma", "tensor_op_hmma", "fma", "fmaheavy", "alu", "xu", "lsu", "uniform"]
print("| problem | kernel | us | Minst | issue % | busiest sub-partition / mean | " + " | ".join(f"{p} %" for p in pipes)
      + " | dram % | top stalls (per issue) |")
print("|" + "---|" * (len(pipes) + 8))
for i in range(1, n + 1):
    label = open(f"{out}/label-{i}.txt").read().strip()
    for r, units in rows(f"{out}/ncu-{i}.csv"):
        def metric(name):
            v = r.get(name, "")
            return v.replace(",", "") if v not in ("", "n/a") else ""
        def pipe(p):
            return metric(f"sm__pipe_{p}_cycles_active.avg.pct_of_peak_sustained_active") or \
                metric(f"sm__inst_executed_pipe_{p}.avg.pct_of_peak_sustained_active")
        stalls = sorted(((float(v.replace(",", "")), k.replace("smsp__average_warps_issue_stalled_", "")
                          .replace("_per_issue_active.ratio", "")) for k, v in r.items()
                         if k.startswith("smsp__average_warps_issue_stalled_") and v not in ("", "n/a")),
                        reverse=True)[:4]
        us = metric("gpu__time_duration.sum")
        us = f"{float(us) * scale_to_us.get(units.get('gpu__time_duration.sum'), 1.0):.1f}" if us else ""
        inst = metric("smsp__inst_executed.sum")
        inst = f"{float(inst) / 1e6:.1f}" if inst else ""
        busiest, mean = metric("smsp__inst_executed.max"), metric("smsp__inst_executed.avg")
        balance = f"{float(busiest) / float(mean):.3f}" if busiest and mean and float(mean) > 0 else ""
        print(f"| {label} | {r.get('Kernel Name', '')[:60]} | {us} | {inst} | "
              f"{metric('smsp__issue_active.avg.pct_of_peak_sustained_active')} | {balance} | "
              + " | ".join(pipe(p) for p in pipes)
              + f" | {metric('dram__throughput.avg.pct_of_peak_sustained_elapsed')} | "
              + ", ".join(f"{k} {v:.2f}" for v, k in stalls) + " |")
PY
