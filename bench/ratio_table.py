#!/usr/bin/env python3
"""Markdown table of hopattn against its peers from JSON files of one run (hopattn-bench --json and
bench/peers_sdpa.py --json, docs/benchmarking.md schema): TFLOP/s per row and the ratios
hopattn / peer, plus the geometric mean of hopattn / cuDNN per head dim over rows with seqlen >= 2k.
"""
import argparse
import json
import math
from collections import defaultdict


def key(row):
    return (row["direction"], row["dtype"], row["hdim"], bool(row["causal"]), row["batch"], row["heads"],
            row.get("heads_kv", row["heads"]), row["seqlen_q"], row["seqlen_k"], bool(row.get("deterministic", False)))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("json", nargs="+", help="result files of one run")
    parser.add_argument("--peers", default="cudnn,fa2", help="peer impls, comma separated")
    a = parser.parse_args()
    peers = a.peers.split(",")

    by_key = defaultdict(dict)
    for path in a.json:
        with open(path) as f:
            for row in json.load(f)["rows"]:
                by_key[key(row)][row["impl"]] = row["tflops"]

    header = ["dir", "d", "causal", "seqlen", "hopattn"] + peers + [f"vs {p}" for p in peers]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    logs = defaultdict(list)
    for k in sorted(by_key):
        impls = by_key[k]
        if "hopattn" not in impls:
            continue
        direction, _, hdim, causal, _, _, _, seqlen, _, det = k
        ours = impls["hopattn"]
        cells = [direction + (" det" if det else ""), str(hdim), "yes" if causal else "no", str(seqlen), f"{ours:.0f}"]
        cells += [f"{impls[p]:.0f}" if p in impls else "" for p in peers]
        cells += [f"{ours / impls[p]:.3f}" if p in impls else "" for p in peers]
        print("| " + " | ".join(cells) + " |")
        if "cudnn" in impls and seqlen >= 2048:
            logs[(direction, det, hdim)].append(math.log(ours / impls["cudnn"]))
    print()
    print("| dir | d | rows (seqlen >= 2k) | geomean vs cudnn | min vs cudnn |")
    print("|---|---|---|---|---|")
    for (direction, det, hdim), values in sorted(logs.items()):
        print(f"| {direction}{' det' if det else ''} | {hdim} | {len(values)} | {math.exp(sum(values) / len(values)):.3f} "
              f"| {math.exp(min(values)):.3f} |")


if __name__ == "__main__":
    main()
