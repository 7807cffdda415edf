#!/usr/bin/env bash
# Which SASS instructions a kernel's warps stall on: ncu's warp-state sampling per instruction
# (SourceCounters) on tools/profile_problem.py's problems, one profiled launch each, summarised
# as markdown (OUT/source.md: the instructions with the most samples, with their top stall
# reasons, and the samples per opcode; the first two problems side by side, tools/source_compare.py)
# beside ncu's per-instruction CSV (OUT/source-N.csv).
# Usage on a Hopper machine with the hopattn package importable (PYTHONPATH, HOPATTN_LIBRARY):
#   tools/profile_source.sh OUT 'LABEL|KERNEL_REGEX|SKIP|PROFILE_PROBLEM_ARGS' ...
# SKIP: launches of matching kernels to skip first (the warm-up calls'), as in profile_pipes.sh.
# E.g. our d64 backward beside FlashAttention-4's (its kernel names are not ours: '.' and a skip
# that passes its forward and warm-up launches; check ncu-N.log for what was profiled):
#   tools/profile_source.sh out 'ours d64|backward_kernel|2|dense --hdim 64 --direction bwd' \
#     'fa4 d64|bwd|2|dense --hdim 64 --direction bwd --impl fa4'
set -uo pipefail
out=$1
shift
mkdir -p "$out"
here=$(dirname "$0")
n=0
for spec in "$@"; do
  IFS='|' read -r label kernel skip args <<< "$spec"
  n=$((n + 1))
  rm -f "$out/rep-$n.ncu-rep"
  # shellcheck disable=SC2086  # the problem's arguments are meant to split
  timeout 300 ncu --clock-control none --target-processes all --kernel-name "regex:$kernel" \
    --launch-skip "$skip" --launch-count 1 --section SourceCounters --section WarpStateStats \
    --import-source no -o "$out/rep-$n" python3 "$here/profile_problem.py" $args > "$out/ncu-$n.log" 2>&1 ||
    echo "profile_source: '$label' failed (see $out/ncu-$n.log)"
  ncu --import "$out/rep-$n.ncu-rep" --page source --csv --print-source sass > "$out/source-$n.csv" 2>> "$out/ncu-$n.log"
  echo "$label" > "$out/label-$n.txt"
done
python3 - "$out" "$n" <<'PY' | tee "$out/source.md"
import collections, csv, sys
out, n = sys.argv[1], int(sys.argv[2])

def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None

for i in range(1, n + 1):
    label = open(f"{out}/label-{i}.txt").read().strip()
    lines = list(csv.reader(open(f"{out}/source-{i}.csv", errors="replace")))
    header_at = next((k for k, r in enumerate(lines) if any("Source" == c.strip() for c in r)), None)
    print(f"## {label}\n")
    if header_at is None:
        print(f"no per-instruction table in source-{i}.csv\n")
        continue
    header = [c.strip() for c in lines[header_at]]
    rows = [dict(zip(header, r)) for r in lines[header_at + 1:] if len(r) == len(header)]
    all_samples = next((c for c in header if "Samples" in c and "Not" not in c), None)
    stall_columns = [c for c in header if "stall" in c.lower() and "Sampling" not in c]  # per reason, if listed
    if all_samples is None:
        print(f"no sample column among {header}\n")
        continue
    total = sum(number(r[all_samples]) or 0 for r in rows)
    print(f"{len(rows)} instructions, {total:.0f} samples ({all_samples}); columns: {', '.join(header)}\n")
    print("| address | instruction | samples | % | top stall columns |")
    print("|---|---|---|---|---|")
    ranked = sorted(rows, key=lambda r: -(number(r[all_samples]) or 0))
    for r in ranked[:40]:
        samples = number(r[all_samples]) or 0
        stalls = sorted(((number(r[c]) or 0, c) for c in stall_columns), reverse=True)[:3]
        top = ", ".join(f"{c} {v:.0f}" for v, c in stalls if v > 0)
        address = r.get("# Address", r.get("Address", ""))
        print(f"| {address} | `{r['Source'].strip()}` | {samples:.0f} | {100 * samples / max(total, 1):.1f} | {top} |")
    by_opcode = collections.Counter()
    for r in rows:
        words = r["Source"].split()
        opcode = next((w for w in words if not w.startswith("@")), "?").split(".")[0]
        by_opcode[opcode] += number(r[all_samples]) or 0
    print("\n| opcode | samples | % |\n|---|---|---|")
    for opcode, samples in by_opcode.most_common(15):
        print(f"| {opcode} | {samples:.0f} | {100 * samples / max(total, 1):.1f} |")
    print()
PY
# The first two problems side by side (where one kernel's extra time goes), appended to source.md.
if (( n >= 2 )); then
  python3 "$here/source_compare.py" "$out/source-1.csv" "$(cat "$out/label-1.txt")" \
    "$out/source-2.csv" "$(cat "$out/label-2.txt")" | tee -a "$out/source.md"
fi
