#!/usr/bin/env python3
"""hopattn / cuDNN per row for each build of an A/B (compare.py JSON files carrying env.variant).

Prints one markdown table: a row per problem, a column per build (the median ratio over its rounds),
then the geometric mean per (direction, head dim, causal, deterministic) over seqlen >= 2k and a
line of mismatches. Usage: bench/ab_table.py FILES...
"""
import collections
import json
import math
import statistics
import sys


def problem_key(row):
    return (row["direction"], row["dtype"], row["hdim"], row["causal"], row.get("deterministic", False),
            row["heads"], row["heads_kv"], row.get("varlen", False), row["seqlen_q"])


def label(key):
    direction, dtype, hdim, causal, det, heads, heads_kv, varlen, seqlen = key
    parts = [direction, dtype, f"d{hdim}", "causal" if causal else "full"]
    if det:
        parts.append("det")
    if heads != heads_kv:
        parts.append(f"gqa{heads}/{heads_kv}")
    if varlen:
        parts.append("varlen")
    return " ".join(parts) + f" {seqlen}"


def main(paths):
    ratios = collections.defaultdict(lambda: collections.defaultdict(list))  # key -> variant -> [ratio]
    failures = []
    variants = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        variant = data["env"].get("variant", path)
        if variant not in variants:
            variants.append(variant)
        by_key = collections.defaultdict(dict)
        for row in data["rows"]:
            by_key[problem_key(row)][row["impl"]] = row
            if row["impl"] == "hopattn" and row.get("check") not in (None, "pass"):
                failures.append(f"{variant}: {label(problem_key(row))}: {row.get('check')}")
        for key, impls in by_key.items():
            ours, cudnn = impls.get("hopattn"), impls.get("cudnn")
            if ours and cudnn and ours.get("tflops") and cudnn.get("tflops"):
                ratios[key][variant].append(ours["tflops"] / cudnn["tflops"])
    print("| problem | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    panels = collections.defaultdict(lambda: collections.defaultdict(list))
    for key in sorted(ratios):
        cells = []
        for v in variants:
            values = ratios[key].get(v)
            if values:
                median = statistics.median(values)
                cells.append(f"{median:.3f}")
                if key[-1] >= 2048:
                    panels[key[:-1]][v].append(median)
            else:
                cells.append("-")
        print(f"| {label(key)} | " + " | ".join(cells) + " |")
    print()
    print("| geomean, seqlen >= 2k | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for panel in sorted(panels):
        cells = []
        for v in variants:
            values = panels[panel].get(v)
            cells.append(f"{math.exp(sum(map(math.log, values)) / len(values)):.3f}" if values else "-")
        print(f"| {label(panel + (0,))[:-2]} | " + " | ".join(cells) + " |")
    print(f"\nmismatches: {len(failures)}")
    for line in failures:
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
