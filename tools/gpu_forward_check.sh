#!/usr/bin/env bash
# Dev script for a Hopper machine: SASS summary of the forward kernels, the GPU suite, the forward
# sweep of hopattn and its peers (cuDNN, FlashAttention-2 through PyTorch SDPA) in one run, and an
# ncu profile of the default problem, compute-sanitizer on a subset of the suite. Usage:
#   tools/gpu_forward_check.sh BUILD_DIR OUT_DIR [STEPS]
# with STEPS a comma list of sass,tests,sanitize,sweep,ncu (default: all).
set -uo pipefail
build=$1 out=$2 steps=${3:-sass,tests,sanitize,sweep,ncu}
logs=$out/logs
mkdir -p "$logs"
has() { [[ ",$steps," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"

if has sass; then
  for obj in "$build"/src/CMakeFiles/hopattn_objects.dir/generated/kernels/instantiations/forward_*.o; do
    printf '%s: ' "$(basename "$obj" .cu.o)"
    cuobjdump -sass "$obj" | grep -oE "HGMMA\.[0-9x]+|UTMALDG|USETMAXREG|STSM|LDL|STL|MUFU\.EX2|STG\.E\.128" |
      sort | uniq -c | awk '{printf "%s=%s ", $2, $1} END {print ""}'
  done | tee "$logs/sass.txt"
fi
if has tests; then
  timeout 300 "$build/tests/hopattn_gpu_tests" > "$logs/gpu_tests.log" 2>&1
  echo "gpu tests exit $?"; grep -E "^\[  FAILED|^\[  PASSED|tests ran" "$logs/gpu_tests.log" | tail -25
fi
if has sanitize; then
  # Small cases that cover 2 and 3 consumer warpgroups, O staged in Q, GQA, varlen and strides.
  subset='Sweep/ForwardSweep.*/bf16_d64_113x203*:Sweep/ForwardSweep.*/bf16_d256_113x203*'
  subset+=':Sweep/ForwardSweep.*/fp16_d128_257x1000*:Special/ForwardSweep.*/varlen_causal_gqa'
  subset+=':Special/ForwardSweep.*/strided_batch3_gqa'
  for tool in memcheck racecheck synccheck; do
    timeout 100 compute-sanitizer --tool "$tool" --error-exitcode 3 "$build/tests/hopattn_gpu_tests" \
      --gtest_filter="$subset" > "$logs/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -cE '^\[       OK' "$logs/sanitizer_$tool.log") tests ok;" \
      "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/sanitizer_$tool.log" | tail -1))"
  done
fi
if has sweep; then
  timeout 280 "$build/bench/hopattn-bench" --sweep --direction fwd --no-check --json "$out/hopattn_fwd.json" > "$logs/bench.log" 2>&1
  timeout 60 "$build/bench/hopattn-bench" --direction fwd > "$logs/bench_default_checked.log" 2>&1
  tail -1 "$logs/bench_default_checked.log"
  timeout 200 python3 bench/peers_sdpa.py --sweep --direction fwd --json "$out/peers_fwd.json" > "$logs/peers.log" 2>&1
  python3 bench/ratio_table.py "$out/hopattn_fwd.json" "$out/peers_fwd.json" | tee "$out/ratios.md"
  # The same table with the plots (needs matplotlib; bench/compare.py report).
  python3 bench/compare.py report "$out/hopattn_fwd.json" "$out/peers_fwd.json" --out "$out/report" --name forward \
    > /dev/null 2>&1 || echo "report with plots skipped (python3 bench/compare.py report failed; matplotlib missing?)"
fi
if has ncu; then
  timeout 200 ncu --clock-control none --kernel-name regex:forward_kernel --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
    "$build/bench/hopattn-bench" --direction fwd --warmup 2 --reps 1 --no-check > "$logs/ncu.txt" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Stall|Warp Cycles|Registers|Shared Memory Config|Achieved" "$logs/ncu.txt" | head -30
fi
# Logs travel as one archive; the JSON results and the ratio table stay beside it.
tar czf "$out/logs.tgz" -C "$out" logs && rm -r "$logs"
