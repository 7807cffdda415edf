#!/usr/bin/env bash
# Dev script for a Hopper machine: builds made elsewhere with tools/build_variant.sh (each a folder
# VARIANTS_DIR/NAME holding libhopattn.so and, for the checks, hopattn_gpu_tests) checked and
# timed in one go, within a time budget: no step starts once fewer than its own seconds are left.
#   tools/run_variants.sh VARIANTS_DIR OUT_DIR SECONDS STEPS NAME...
# STEPS, a comma list:
#   tests     the GPU suites of each NAME that has a test binary (SUITE_FILTER), in parallel
#   sanitize  compute-sanitizer memcheck (MEMCHECK_FILTER), then racecheck and synccheck
#             (RACECHECK_FILTER), on each such NAME, beside the suites
#   decode    bench/compare.py decode, every NAME in turn, ROUNDS rounds (DECODE_ARGS), then the
#             table of bench/ab_decode_table.py
#   prefill   bench/compare.py chunked_prefill likewise (PREFILL_ARGS; paged / contiguous per NAME)
#   fwd       tools/ab_compare.sh's forward A/B (FWD_ARGS) into OUT_DIR/fwd, if a minute is left
# Files land in OUT_DIR as dec-NAME-ROUND.json, cp-NAME-ROUND.json (and fwd/) with their logs.
# gtest names carry their instantiation prefix (Decode/DecodeSweep.*): filters start with '*'.
set -uo pipefail
variants=$1 out=$2 budget=$3 steps=$4
shift 4
names=("$@")
has() { [[ ",$steps," == *",$1,"* ]]; }
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt"

suite=${SUITE_FILTER:-'*DecodeSweep*:*ForwardDecode*:*KVCache*:*AppendSweep*:*AppendFaults*:*ForwardSweep*:*ForwardKernel*'}
memcheck=${MEMCHECK_FILTER:-'*DecodeSweep*d128*:KVCache.Overfull*:*KVCacheSweep*c0_*:*KVCacheSweep*c15_*:*chunked_prefill_page16'}
racecheck=${RACECHECK_FILTER:-'*DecodeSweep*q1_k8192_h32x8_d128*:*DecodeSweep*q4_k300_h32x8_d128*:*KVCacheSweep*c0_*'}
check_seconds=$(( $(left) / 3 ))
for name in "${names[@]}"; do
  tests=$variants/$name/hopattn_gpu_tests
  [[ -x $tests ]] || continue
  if has tests; then
    (timeout "$check_seconds" "$tests" --gtest_filter="$suite" > "$out/$name-tests.log" 2>&1
     echo "exit $?" >> "$out/$name-tests.log") &
  fi
  if has sanitize; then
    (timeout $((check_seconds * 2 / 3)) compute-sanitizer --tool memcheck --error-exitcode 1 "$tests" \
       --gtest_filter="$memcheck" > "$out/$name-memcheck.log" 2>&1
     echo "exit $?" >> "$out/$name-memcheck.log"
     for tool in racecheck synccheck; do
       timeout $((check_seconds / 6)) compute-sanitizer --tool $tool --error-exitcode 1 "$tests" \
         --gtest_filter="$racecheck" > "$out/$name-$tool.log" 2>&1
       echo "exit $?" >> "$out/$name-$tool.log"
     done) &
  fi
done
wait
for log in "$out"/*-tests.log "$out"/*check.log; do
  [[ -f $log ]] || continue
  echo "== $(basename "$log"): $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|ERROR SUMMARY|^exit' "$log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Z]' "$log" | sort -u | head -20
done

# Each named step's runs, alternating the builds round by round, while `seconds` are left.
export PYTHONPATH=${PYTHONPATH:-python}
time_step() {
  local step=$1 prefix=$2 seconds=$3
  shift 3
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for name in "${names[@]}"; do
      (($(left) < seconds)) && return
      HOPATTN_LIBRARY=$variants/$name/libhopattn.so timeout "$seconds" python3 bench/compare.py "$step" "$@" \
        --json "$out/$prefix-$name-$round.json" > "$out/$prefix-$name-$round.log" 2>&1 ||
        echo "run_variants: $step $name round $round failed (see its log)"
    done
  done
}
if has decode; then
  # shellcheck disable=SC2086  # the arguments are meant to split
  time_step decode dec 60 ${DECODE_ARGS:---hdims 128 --heads 32/8,32/1 --batches 1,16 --seqlens-q 1 --seqlens-k 8192,32768 --page-sizes 0 --no-append --peers cudnn --no-check}
  python3 bench/ab_decode_table.py "$out" "${names[@]}"
fi
if has prefill; then
  # shellcheck disable=SC2086
  time_step chunked_prefill cp 60 ${PREFILL_ARGS:---quick --page-sizes 0,16,64 --peers= --no-check}
  for name in "${names[@]}"; do
    python3 - "$out" "$name" <<'EOF'
import glob, json, statistics, sys
out, name = sys.argv[1:]
ms = {}
for path in glob.glob(f"{out}/cp-{name}-*.json"):
    for r in json.load(open(path))["rows"]:
        if r["impl"] == "hopattn":
            ms.setdefault(r["page_size"], []).append(r["ms"])
if 0 in ms:
    base = statistics.median(ms[0])
    print(name, " ".join(f"page {p}: {base / statistics.median(v):.3f}" for p, v in sorted(ms.items()) if p))
EOF
  done
fi
if has fwd && (($(left) >= 60)); then
  libraries=()
  for name in "${names[@]}"; do libraries+=("$name=$variants/$name/libhopattn.so"); done
  tools/ab_compare.sh "$out/fwd" "${ROUNDS:-2}" \
    "${FWD_ARGS:---direction fwd --hdims 128 --seqlens 512,1024,8192 --dtype bf16 --extra= --no-check}" "${libraries[@]}"
fi
echo "run_variants: done in $(($(date +%s) - start)) s"
