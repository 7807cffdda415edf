#!/usr/bin/env bash
# Dev script for a Hopper machine: SASS summary of the kernels, the GPU suite, the forward (with
# DIRECTION=bwd the backward) sweep of hopattn and its peers (cuDNN, FlashAttention-2 through
# PyTorch SDPA) in one run, an ncu profile of the default problem (DIRECTION, HEADDIM), compute-sanitizer on a subset of
# the suite. Usage:
#   tools/gpu_kernel_check.sh BUILD_DIR OUT_DIR [STEPS]
# with STEPS a comma list of sass,tests,sanitize,sweep,ncu (default: all).
set -uo pipefail
build=$1 out=$2 steps=${3:-sass,tests,sanitize,sweep,ncu}
logs=$out/logs
mkdir -p "$logs"
has() { [[ ",$steps," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"

if has sass; then
  for obj in "$build"/src/CMakeFiles/hopattn_objects.dir/generated/kernels/instantiations/*ward_*.o; do
    printf '%s: ' "$(basename "$obj" .cu.o)"
    cuobjdump -sass "$obj" | grep -oE "HGMMA\.[0-9x]+|UTMALDG|UBLKRED|USETMAXREG|STSM|LDL|STL|MUFU\.EX2|STG\.E\.128" |
      sort | uniq -c | awk '{printf "%s=%s ", $2, $1} END {print ""}'
  done | tee "$logs/sass.txt"
fi
if has tests; then
  timeout 300 "$build/tests/hopattn_gpu_tests" > "$logs/gpu_tests.log" 2>&1
  echo "gpu tests exit $?"; grep -E "^\[  FAILED|^\[  PASSED|tests ran" "$logs/gpu_tests.log" | tail -25
fi
if has sanitize; then
  # Small cases that cover 2 and 3 consumer warpgroups, GQA, varlen and strides, and
  # the backward's two layouts (keys split between the warpgroups; d192/d256: head dim split).
  subset='Sweep/*Sweep.*/bf16_d64_113x203*:Sweep/*Sweep.*/bf16_d256_113x203*'
  subset+=':Sweep/*Sweep.*/fp16_d128_257x1000*:Special/*Sweep.*/varlen_causal_gqa'
  subset+=':Special/*Sweep.*/strided_batch3_gqa:Sweep/*Sweep.*/bf16_d192_113x203*'
  # racecheck does not follow mbarrier arrive/wait between warps (tools/racecheck_mbarrier_probe.cu
  # draws a hazard on every read of a correctly published slot): its reports between a store
  # before an arrive and loads after the matching wait, such as the backward's tile ring
  # (bwd_tile_stream.cuh) and the forward publisher's slots, are of that kind. Map a hazard's
  # SASS offsets (cuobjdump -sass) to those before reading more into it.
  for tool in memcheck racecheck synccheck; do
    timeout 100 compute-sanitizer --tool "$tool" --error-exitcode 3 "$build/tests/hopattn_gpu_tests" \
      --gtest_filter="$subset" > "$logs/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -cE '^\[       OK' "$logs/sanitizer_$tool.log") tests ok;" \
      "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/sanitizer_$tool.log" | tail -1))"
  done
fi
if has sweep; then
  # DIRECTION=bwd sweeps the backward instead (plus hopattn's deterministic mode);
  # SWEEP_HEADDIMS=64,128 narrows the head dims.
  dir=${DIRECTION:-fwd} dims=${SWEEP_HEADDIMS:-64,128,256}
  timeout 280 "$build/bench/hopattn-bench" --sweep --sweep-headdims "$dims" --direction "$dir" --no-check --json "$out/hopattn_$dir.json" > "$logs/bench.log" 2>&1
  files=("$out/hopattn_$dir.json")
  if [[ $dir == bwd ]]; then
    timeout 280 "$build/bench/hopattn-bench" --sweep --sweep-headdims "$dims" --direction bwd --deterministic --no-check \
      --json "$out/hopattn_bwd_deterministic.json" > "$logs/bench_deterministic.log" 2>&1
    files+=("$out/hopattn_bwd_deterministic.json")
  fi
  timeout 60 "$build/bench/hopattn-bench" --direction "$dir" > "$logs/bench_default_checked.log" 2>&1
  tail -1 "$logs/bench_default_checked.log"
  timeout 200 python3 bench/peers_sdpa.py --sweep --sweep-headdims "$dims" --direction "$dir" --json "$out/peers_$dir.json" > "$logs/peers.log" 2>&1
  files+=("$out/peers_$dir.json")
  python3 bench/ratio_table.py "${files[@]}" | tee "$out/ratios.md"
  # The same table with the plots (needs matplotlib; bench/compare.py report).
  python3 bench/compare.py report "${files[@]}" --out "$out/report" --name "$dir" \
    > /dev/null 2>&1 || echo "report with plots skipped (python3 bench/compare.py report failed; matplotlib missing?)"
fi
if has ncu; then
  # The default problem's kernels (DIRECTION=bwd: preprocess, main, postprocess; HEADDIM=256 etc.),
  # with the memory workload section for the L2 traffic of the backward's dQ reduce-adds.
  dir=${DIRECTION:-fwd}
  kernels=$([[ $dir == bwd ]] && echo "regex:backward" || echo "regex:forward_kernel")
  count=$([[ $dir == bwd ]] && echo 3 || echo 1)
  timeout 200 ncu --clock-control none --kernel-name "$kernels" --launch-skip $((2 * count)) --launch-count "$count" \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis \
    "$build/bench/hopattn-bench" --direction "$dir" --headdim "${HEADDIM:-128}" --warmup 2 --reps 1 --no-check \
    > "$logs/ncu.txt" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Stall|Warp Cycles|Registers|Shared Memory Config|Achieved" "$logs/ncu.txt" | head -30
fi
# Logs travel as one archive; the JSON results and the ratio table stay beside it.
tar czf "$out/logs.tgz" -C "$out" logs && rm -r "$logs"
