#!/usr/bin/env bash
# CUDA compiler launcher: runs the compile (through ccache when given) and fails it when ptxas
# reports that it serialized WGMMA instructions (C7514/C7515, printed as "info" with -Xptxas=-v).
# ptxas then waits after every wgmma.mma_async, which cost a forward kernel 25% once; no test
# without a GPU would notice, and the build still succeeds. Typical cause: a WGMMA issued under
# one branch and waited for under another, or a wait depth chosen at run time.
set -u
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>"$log"
status=$?
cat "$log" >&2
if [ "$status" -eq 0 ] && grep -qE 'C751[45]' "$log"; then
  echo "error: ptxas serialized WGMMA instructions (C7514/C7515 above); see docs/perf-log.md" >&2
  exit 1
fi
exit "$status"
