#!/usr/bin/env bash
# Dev script for a machine without a GPU: builds the committed tree (HEAD) plus patches in a
# separate source tree, and collects what a Hopper machine needs to test and time it (the shared
# library, the GPU test binary, the Python package), so that only those files travel. Usage:
#   tools/build_variant.sh WORK_DIR OUT_DIR NAME HEADDIMS DTYPES [PATCH...]
# e.g. tools/build_variant.sh /tmp/variants out main128 128 bf16
#      tools/build_variant.sh /tmp/variants out decode 128 bf16 docs/wip/forward-narrow-tile-whole-key-blocks.patch
# HEADDIMS and DTYPES are CMake lists ("64;128"); CUTLASS_INCLUDE_DIR (else the build installs the
# headers from PyPI), HOPATTN_SOFTCAP and HOPATTN_FP8 (ON/OFF, default OFF here: smaller builds)
# pass through. With ccache, set CCACHE_BASEDIR to WORK_DIR so that variants share compiled units.
# On the Hopper machine, tools/run_variants.sh OUT_DIR ... checks and times the collected builds.
set -euo pipefail
work=$1 out=$2 name=$3 dims=$4 dtypes=$5
shift 5
root=$(git rev-parse --show-toplevel)
src=$work/$name
rm -rf "$src" && mkdir -p "$src"
git -C "$root" archive HEAD | tar -x -C "$src"
for patch in "$@"; do (cd "$src" && git apply "$root/$patch"); done
cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DHOPATTN_HEADDIMS="$dims" -DHOPATTN_DTYPES="$dtypes" \
  -DHOPATTN_SOFTCAP="${HOPATTN_SOFTCAP:-OFF}" -DHOPATTN_FP8="${HOPATTN_FP8:-OFF}" \
  ${CUTLASS_INCLUDE_DIR:+-DCUTLASS_INCLUDE_DIR="$CUTLASS_INCLUDE_DIR"} > "$work/$name-configure.log"
cmake --build "$src/build" --parallel "$(nproc)" > "$work/$name-build.log" 2>&1 ||
  { tail -30 "$work/$name-build.log"; exit 1; }
dest=$out/$name
rm -rf "$dest" && mkdir -p "$dest"
cp -L "$src"/build/src/libhopattn.so "$src"/build/tests/hopattn_gpu_tests "$dest"/
cp -r "$src/python" "$dest/python"
du -sh "$dest"
