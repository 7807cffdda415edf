#!/usr/bin/env bash
# Dev script for a Hopper machine: SASS summary of the forward kernels, the GPU suite, the forward
# sweep of hopattn and its peers (cuDNN, FlashAttention-2 through PyTorch SDPA) in one run, and an
# ncu profile of the default problem. Usage: tools/gpu_forward_check.sh BUILD_DIR OUT_DIR [STEPS]
# with STEPS a comma list of sass,tests,sweep,ncu (default: all).
set -uo pipefail
build=$1 out=$2 steps=${3:-sass,tests,sweep,ncu}
mkdir -p "$out"
has() { [[ ",$steps," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

if has sass; then
  for obj in "$build"/src/CMakeFiles/hopattn_objects.dir/generated/kernels/instantiations/forward_*.o; do
    printf '%s: ' "$(basename "$obj" .cu.o)"
    cuobjdump -sass "$obj" | grep -oE "HGMMA\.[0-9x]+|UTMALDG|USETMAXREG|STSM|LDL|STL|MUFU\.EX2|STG\.E\.128" |
      sort | uniq -c | awk '{printf "%s=%s ", $2, $1} END {print ""}'
  done | tee "$out/sass.txt"
fi
if has tests; then
  timeout 300 "$build/tests/hopattn_gpu_tests" > "$out/gpu_tests.log" 2>&1
  echo "gpu tests exit $?"; grep -E "^\[  FAILED|^\[  PASSED|tests ran" "$out/gpu_tests.log" | tail -25
fi
if has sweep; then
  timeout 200 "$build/bench/hopattn-bench" --sweep --direction fwd --no-check --json "$out/hopattn_fwd.json" > "$out/bench.log" 2>&1
  timeout 200 python3 bench/peers_sdpa.py --sweep --direction fwd --json "$out/peers_fwd.json" > "$out/peers.log" 2>&1
  python3 bench/ratio_table.py "$out/hopattn_fwd.json" "$out/peers_fwd.json" | tee "$out/ratios.md"
fi
if has ncu; then
  timeout 200 ncu --clock-control none --kernel-name regex:forward_kernel --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
    "$build/bench/hopattn-bench" --direction fwd --warmup 2 --reps 1 --no-check > "$out/ncu.txt" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Stall|Warp Cycles|Registers|Shared Memory Config|Achieved" "$out/ncu.txt" | head -30
fi
