#!/usr/bin/env python3
"""Two kernels' ncu per-instruction tables (profile_source.sh's source-N.csv) side by side, as markdown.

Where one kernel's extra time goes when both run the same problem: samples per stall reason, per
opcode (samples and instructions executed), and the opcode mix of the loop body: the instructions that share one execution count, the count
whose instructions make up most of the executed total (one warp, one block of the main loop).
Warp-state samples grow with time x resident warps, so the totals compare as times when both
kernels keep the same warps per SM. Usage:
    tools/source_compare.py OUT/source-1.csv 'ours' OUT/source-2.csv 'FA4'
"""
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def load(path):
    lines = list(csv.reader(open(path, errors="replace")))
    header_at = next(k for k, row in enumerate(lines) if any(c.strip() == "Source" for c in row))
    header = [c.strip() for c in lines[header_at]]
    return header, [dict(zip(header, row)) for row in lines[header_at + 1:] if len(row) == len(header)]


def opcode(row):
    words = row["Source"].split()
    return next((w for w in words if not w.startswith("@")), "?").split(".")[0]


def summarise(path):
    header, rows = load(path)
    reasons = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
    stalls, samples, executed = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows:
        samples[opcode(r)] += number(r[SAMPLES])
        executed[opcode(r)] += number(r[EXECUTED])
        for c in reasons:
            stalls[c[len("stall_"):]] += number(r[c])
    share = collections.Counter()  # execution count -> instructions executed by the instructions of that count
    for r in rows:
        share[int(number(r[EXECUTED]))] += number(r[EXECUTED])
    body_count = share.most_common(1)[0][0] if share else 0
    body = collections.Counter(opcode(r) for r in rows if int(number(r[EXECUTED])) == body_count)
    return dict(stalls=stalls, samples=samples, executed=executed, body=body, body_count=body_count)


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    a, b = summarise(sys.argv[1]), summarise(sys.argv[3])
    name_a, name_b = sys.argv[2], sys.argv[4]
    total_a, total_b = sum(a["samples"].values()), sum(b["samples"].values())
    print(f"## {name_a} against {name_b}\n")
    print(f"| | {name_a} | {name_b} |\n|---|---|---|")
    print(f"| warp-state samples | {total_a:.0f} | {total_b:.0f} |")
    print(f"| warp instructions executed | {sum(a['executed'].values()) / 1e6:.0f} M | "
          f"{sum(b['executed'].values()) / 1e6:.0f} M |")
    print(f"| loop body: instructions (executed {a['body_count']} / {b['body_count']} times) | "
          f"{sum(a['body'].values())} | {sum(b['body'].values())} |\n")
    print(f"| stall reason | {name_a} | {name_b} | difference |\n|---|---|---|---|")
    for reason, _ in (a["stalls"] + b["stalls"]).most_common(12):
        print(f"| {reason} | {a['stalls'][reason]:.0f} | {b['stalls'][reason]:.0f} | "
              f"{a['stalls'][reason] - b['stalls'][reason]:+.0f} |")
    print(f"\n| opcode | samples {name_a} | samples {name_b} | difference | executed {name_a} | "
          f"executed {name_b} |\n|---|---|---|---|---|---|")
    ops = set(a["samples"]) | set(b["samples"])
    for op in sorted(ops, key=lambda o: -abs(a["samples"][o] - b["samples"][o]))[:18]:
        print(f"| {op} | {a['samples'][op]:.0f} | {b['samples'][op]:.0f} | {a['samples'][op] - b['samples'][op]:+.0f} | "
              f"{a['executed'][op] / 1e6:.1f} M | {b['executed'][op] / 1e6:.1f} M |")
    print(f"\nLoop body per warp and block, by opcode:\n\n| opcode | {name_a} | {name_b} |\n|---|---|---|")
    for op, _ in (a["body"] + b["body"]).most_common(30):
        print(f"| {op} | {a['body'][op]} | {b['body'][op]} |")


if __name__ == "__main__":
    main()
