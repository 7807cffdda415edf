#!/usr/bin/env python3
"""Markdown table of hopattn against its peers from JSON files of one run (hopattn-bench --json and
bench/peers_sdpa.py --json, docs/benchmarking.md schema), printed to stdout: TFLOP/s per row, the
ratios hopattn / peer, and per panel the geomean ratios. A thin front end of
`bench/compare.py report` (which also writes the PNG plots); kept for tools/gpu_kernel_check.sh.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("json", nargs="+", help="result files of one run")
    parser.add_argument("--peers", default="cudnn,fa2", help="peer impls, comma separated")
    a = parser.parse_args()
    rows, _ = compare.load_rows(a.json)
    sys.stdout.write(compare.markdown_table(compare.collect(rows), peers=a.peers.split(",")))


if __name__ == "__main__":
    main()
