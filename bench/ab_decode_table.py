#!/usr/bin/env python3
"""hopattn / cuDNN per decode row for each build of an A/B (bench/compare.py decode files).

DIR holds files named dec-VARIANT-ROUND.json. Prints one markdown table: a row per problem, each
variant's hopattn microseconds (every round), cuDNN's (the median over all files), then each
variant's ratio cuDNN / hopattn of the medians. Usage: bench/ab_decode_table.py DIR VARIANT...
"""
import collections
import glob
import json
import statistics
import sys


def row_key(row):
    return (row["page_size"], row["hdim"], row["batch"], f"{row['heads']}/{row['heads_kv']}", row["seqlen_q"],
            row["seqlen_k"])


def main(directory, variants):
    micros = collections.defaultdict(lambda: collections.defaultdict(list))  # row key -> impl or variant -> [us]
    for variant in variants:
        for path in sorted(glob.glob(f"{directory}/dec-{variant}-*.json")):
            for row in json.load(open(path))["rows"]:
                impl = variant if row["impl"] == "hopattn" else row["impl"]
                micros[row_key(row)][impl].append(row["ms"] * 1000)
    print("| page | d | batch | heads | q | k | " + " | ".join(f"{v} us" for v in variants) + " | cuDNN us | " +
          " | ".join(f"{v}/cuDNN" for v in variants) + " |")
    print("|" + "---|" * (6 + 2 * len(variants) + 1))
    for key in sorted(micros):
        times = micros[key]
        cudnn = statistics.median(times["cudnn"]) if times["cudnn"] else float("nan")
        rounds = " | ".join(", ".join(f"{x:.2f}" for x in times[v]) for v in variants)
        ratios = " | ".join(f"{cudnn / statistics.median(times[v]):.3f}" if times[v] else "-" for v in variants)
        print(f"| {' | '.join(map(str, key))} | {rounds} | {cudnn:.2f} | {ratios} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
