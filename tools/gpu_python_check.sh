#!/usr/bin/env bash
# Dev script for a Hopper machine with PyTorch: the pytest suite of the Python package (GPU tests
# included) and the per-call overhead next to SDPA's cuDNN and FlashAttention-2 backends, against
# a CMake build's shared library. Usage: tools/gpu_python_check.sh LIBHOPATTN_SO OUT_DIR
set -uo pipefail
export HOPATTN_LIBRARY=$1 HOPATTN_REQUIRE_LIBRARY=1 PYTHONUNBUFFERED=1
export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}  # the package from the source tree
out=$2
mkdir -p "$out"
timeout 400 python3 -m pytest -rs -p no:cacheprovider tests/python > "$out/pytest.log" 2>&1
echo "pytest exit $?"; grep -E "passed|failed|error" "$out/pytest.log" | tail -5
timeout 120 python3 tests/python/overhead.py --json "$out/overhead.json" > "$out/overhead.log" 2>&1
echo "overhead exit $?"; tail -15 "$out/overhead.log"
