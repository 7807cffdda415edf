#!/usr/bin/env bash
# Dev script for a Hopper machine: main against main + patches (docs/wip/*.patch), in one go.
# Each variant is the working tree (build folders and .git left out) with its patches applied,
# built beside the others (the given head dims; DTYPES, a CMake list, default bf16); then the GPU suite (GTEST_FILTER narrows it) on every variant, and an A/B of
# all of them with tools/ab_compare.sh (hopattn / cuDNN tables per variant). Usage:
#   tools/try_patches.sh OUT_DIR CUTLASS_INCLUDE_DIR HEADDIMS STEPS "COMPARE_ARGS" NAME=PATCH[+PATCH...]...
# with HEADDIMS a CMake list ("64;128;256"), STEPS a comma list of build,tests,ab,decode,prefill
# (decode: bench/compare.py decode of each variant's own tree, with DECODE_ARGS, default --quick;
# prefill: its chunked_prefill mode, with PREFILL_ARGS, default --quick; python: the variant's own
# pytest suite against its library, PYTEST_ARGS narrowing it, default tests/python), and sanitize
# (compute-sanitizer memcheck, racecheck and synccheck on the GPU tests SANITIZE_FILTER names, for
# every variant but main; TESTS_TIMEOUT, default 200 s, bounds the suite per variant), e.g.
#   tools/try_patches.sh out "$CUTLASS" "64;128;256" build,tests,ab \
#     "--direction bwd --hdims 64,128 --seqlens 2048,8192 --dtype bf16" \
#     uniform=docs/wip/backward-uniform-descriptors.patch slices=docs/wip/backward-gqa-head-slices.patch
# "main" is always built. Variants live in build-variants/NAME (ignored by git), so a later call
# with STEPS=tests,ab reuses them.
set -uo pipefail
out=$1 cutlass=$2 dims=$3 steps=$4 compare_args=$5
shift 5
has() { [[ ",$steps," == *",$1,"* ]]; }
mkdir -p "$out"
root=build-variants
variants=(main "$@")
names=()
for v in "${variants[@]}"; do names+=("${v%%=*}"); done

if has build; then
  jobs=$(( $(nproc) / ${#variants[@]} ))
  (( jobs < 1 )) && jobs=1
  for v in "${variants[@]}"; do
    name=${v%%=*} patches=${v#*=}
    [[ $v == main ]] && patches=""
    dir=$root/$name
    rm -rf "$dir" && mkdir -p "$dir"
    tar --exclude="./$root" --exclude='./build*' --exclude=./.git -cf - . | tar -x -C "$dir"
    # From the top: inside a git work tree, `git apply` run in a subfolder would skip every path
    # outside that folder without a word.
    for p in ${patches//+/ }; do
      git apply --directory="$dir" "$p" || { echo "try_patches: $p does not apply" >&2; exit 1; }
    done
    (cmake -S "$dir" -B "$dir/build" -DHOPATTN_DTYPES="${DTYPES:-bf16}" -DHOPATTN_HEADDIMS="$dims" \
       -DCUTLASS_INCLUDE_DIR="$cutlass" > "$out/$name-configure.log" 2>&1 &&
     cmake --build "$dir/build" --parallel "$jobs" > "$out/$name-build.log" 2>&1
     echo "build $name: exit $?") &
  done
  wait
fi
if has tests; then
  for name in "${names[@]}"; do
    log=$out/$name-gpu-tests.log
    timeout "${TESTS_TIMEOUT:-200}" "$root/$name/build/tests/hopattn_gpu_tests" ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"} > "$log" 2>&1
    echo "gpu tests $name: exit $? ($(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ tests?' "$log" | tr '\n' ' '))"
    grep -E '^\[  FAILED  \] [A-Z]' "$log" | head -10
  done
fi
if has sanitize; then
  for name in "${names[@]}"; do
    [[ $name == main ]] && continue
    for tool in memcheck racecheck synccheck; do
      log=$out/$name-$tool.log
      timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 1 "$root/$name/build/tests/hopattn_gpu_tests" \
        --gtest_filter="${SANITIZE_FILTER:?sanitize needs SANITIZE_FILTER}" > "$log" 2>&1
      echo "$tool $name: exit $? ($(grep -E 'ERROR SUMMARY|^\[  PASSED|^\[  FAILED  \] [0-9]+ tests?' "$log" | tr '\n' ' '))"
    done
  done
fi
if has python; then
  for name in "${names[@]}"; do
    log=$out/$name-pytest.log
    # shellcheck disable=SC2086  # the pytest arguments are meant to split
    (cd "$root/$name" && HOPATTN_LIBRARY="$PWD/build/src/libhopattn.so" HOPATTN_REQUIRE_LIBRARY=1 PYTHONPATH=python \
       timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-tests/python}) > "$log" 2>&1
    echo "pytest $name: exit $? ($(tail -1 "$log"))"
  done
fi
# One compare.py mode on every variant, each with its own tree's compare.py (a patch may change
# the Python package too): run_mode MODE LABEL ARGS.
run_mode() {
  local mode=$1 label=$2 args=$3
  for name in "${names[@]}"; do
    # shellcheck disable=SC2086  # the mode's arguments are meant to split
    HOPATTN_LIBRARY="$root/$name/build/src/libhopattn.so" python3 "$root/$name/bench/compare.py" "$mode" \
      --json "$out/$name-$label.json" $args > "$out/$name-$label.log" 2>&1
    echo "$mode $name: exit $?"; tail -25 "$out/$name-$label.log"
  done
}
if has decode; then run_mode decode decode "${DECODE_ARGS:---quick}"; fi
if has ab; then
  libraries=()
  for name in "${names[@]}"; do libraries+=("$name=$root/$name/build/src/libhopattn.so"); done
  tools/ab_compare.sh "$out/ab" "${AB_ROUNDS:-2}" "$compare_args" "${libraries[@]}"
fi
if has prefill; then run_mode chunked_prefill prefill "${PREFILL_ARGS:---quick}"; fi
