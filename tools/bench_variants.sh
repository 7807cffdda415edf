#!/usr/bin/env bash
# Times several hopattn-bench builds (kernel variants) on the same forward problems, one after the
# other in one run, so their differences can be read as ratios. Usage:
#   tools/bench_variants.sh OUT_DIR HEADDIM NAME=BENCH_BINARY...
set -uo pipefail
out=$1 d=$2
shift 2
mkdir -p "$out"
for variant in "$@"; do
  name=${variant%%=*} bin=${variant#*=}
  for causal in "" "--causal"; do
    for seqlen in 512 2048 8192 16384; do
      "$bin" --direction fwd --no-check --batch $((16384 / seqlen)) --seqlen "$seqlen" --heads $((2048 / d)) \
        --headdim "$d" $causal --reps 30 --json "$out/$name-d$d-s$seqlen$causal.json" > /dev/null 2>&1
      python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(f\"{sys.argv[2]:10s} d{r['hdim']} {'causal' if r['causal'] else 'none  '} s{r['seqlen_q']:<6d} {r['tflops']:7.1f} TFLOP/s\")" \
        "$out/$name-d$d-s$seqlen$causal.json" "$name"
    done
  done
done
