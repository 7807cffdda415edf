#!/usr/bin/env bash
# A/B of library builds on a Hopper machine: bench/compare.py on the same problems for each build,
# in alternating rounds (so that drift hits every build alike), hopattn against cuDNN only. Each
# result file records its build in env.variant; the last lines are the hopattn / cuDNN table per
# build (bench/ab_table.py). Usage:
#   tools/ab_compare.sh OUT_DIR ROUNDS "COMPARE_ARGS" NAME=LIBRARY [NAME=LIBRARY...]
# e.g. tools/ab_compare.sh out 2 "--direction bwd --hdims 64,128 --seqlens 2048,8192 --dtype bf16 --extra ''" \
#        main=build-main/src/libhopattn.so new=build/src/libhopattn.so
set -uo pipefail
out=$1 rounds=$2 args=$3
shift 3
mkdir -p "$out"
files=()
for round in $(seq 1 "$rounds"); do
  for variant in "$@"; do
    name=${variant%%=*} library=${variant#*=}
    json="$out/$name-$round.json"
    # A build inside a source tree (try_patches' variants) is timed by that tree's compare.py, whose
    # Python package matches the library's C ABI (a patch may add fields to it).
    tree=${library%/build/src/libhopattn.so}
    compare=bench/compare.py pythonpath=${PYTHONPATH:-}
    if [[ $tree != "$library" && -f $tree/bench/compare.py ]]; then
      # Its own package first: an importable package from elsewhere (PYTHONPATH) would win over
      # the tree's, and a library older than that package fails to load.
      compare=$tree/bench/compare.py pythonpath=$tree/python${PYTHONPATH:+:$PYTHONPATH}
    fi
    # shellcheck disable=SC2086  # the compare arguments are meant to split
    eval ${pythonpath:+PYTHONPATH="$pythonpath"} HOPATTN_LIBRARY="$library" python3 "$compare" run --json "$json" --peers cudnn $args \
      > "$out/$name-$round.log" 2>&1 || echo "ab_compare: $name round $round failed (see $json's log)"
    python3 - "$json" "$name" "$args" <<'EOF'
import json, os, sys
path, name, args = sys.argv[1:]
data = json.load(open(path))
data["env"]["variant"] = name
data["env"]["command"] = (f"HOPATTN_LIBRARY=<build {name}>/libhopattn.so python3 bench/compare.py run "
                          f"--json {os.path.basename(path)} --peers cudnn {args}")
json.dump(data, open(path, "w"), indent=1)
EOF
    files+=("$json")
  done
done
python3 bench/ab_table.py "${files[@]}" | tee "$out/ab.md"
