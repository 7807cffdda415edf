#!/usr/bin/env python3
"""hopattn / cuDNN per row for each build of an A/B (compare.py JSON files carrying env.variant).

Prints one markdown table: a row per problem, a column per build (the median ratio over its rounds),
then the geometric mean per panel over seqlen >= 2k and a line of mismatches. Rows, panels and
labels are bench/compare.py's. Usage: bench/ab_table.py FILES...
"""
import collections
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402

LONG_FROM = 2048


def main(paths):
    ratios = collections.defaultdict(lambda: collections.defaultdict(list))  # row key -> variant -> [ratio]
    failures, variants = [], []
    for path in paths:
        rows, envs = compare.load_rows([path])
        variant = envs[0].get("variant", path)
        if variant not in variants:
            variants.append(variant)
        for row in rows:
            if row["impl"] == "hopattn" and row.get("check") not in (None, "pass", "skipped"):
                failures.append(f"{variant}: {compare.panel_label(compare.panel_of(compare.row_key(row)))} "
                                f"{row['seqlen_q']}: {row.get('check')}")
        for key, impls in compare.collect(rows).items():
            if "hopattn" in impls and "cudnn" in impls:
                ratios[key][variant].append(impls["hopattn"]["tflops"] / impls["cudnn"]["tflops"])
    header = " | ".join(variants)
    print(f"| problem | {header} |\n|---|" + "---|" * len(variants))
    panels = collections.defaultdict(lambda: collections.defaultdict(list))
    for key in sorted(ratios, key=compare.sort_key):
        cells = []
        for v in variants:
            values = ratios[key].get(v)
            median = statistics.median(values) if values else None
            cells.append(f"{median:.3f}" if values else "-")
            if values and key[11] >= LONG_FROM:  # seqlen_q
                panels[compare.panel_of(key)][v].append(median)
        print(f"| {compare.panel_label(compare.panel_of(key))} {key[11]} | " + " | ".join(cells) + " |")
    print(f"\n| geomean, seqlen >= {LONG_FROM} | {header} |\n|---|" + "---|" * len(variants))
    for panel, by_variant in panels.items():
        cells = [f"{compare.geomean(by_variant[v]):.3f}" if by_variant.get(v) else "-" for v in variants]
        print(f"| {compare.panel_label(panel)} | " + " | ".join(cells) + " |")
    print(f"\nmismatches: {len(failures)}")
    for line in failures:
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
