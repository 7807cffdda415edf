#!/usr/bin/env python3
"""Decode A/B table: for each row of bench/compare.py decode files named dec-VARIANT-ROUND.json in DIR,
hopattn's microseconds per variant (every round) and cuDNN's (median over all files), then each
variant's median time as a ratio cuDNN / hopattn. Usage: bench/ab_decode_table.py DIR VARIANT...
"""
import json, sys, glob, collections, statistics, os
d = sys.argv[1]; variants = sys.argv[2:]
t = collections.defaultdict(lambda: collections.defaultdict(list))
for v in variants:
    for f in sorted(glob.glob(f"{d}/dec-{v}-*.json")):
        for r in json.load(open(f))["rows"]:
            k = (r["page_size"], r["hdim"], r["batch"], f"{r['heads']}/{r['heads_kv']}", r["seqlen_q"], r["seqlen_k"])
            t[k][v if r["impl"] == "hopattn" else r["impl"]].append(r["ms"] * 1000)
print("| page | d | batch | heads | q | k | " + " | ".join(f"{v} us" for v in variants) + " | cuDNN us | " + " | ".join(f"{v}/cuDNN" for v in variants) + " |")
print("|" + "---|" * (6 + 2 * len(variants) + 1))
for k in sorted(t):
    c = statistics.median(t[k]["cudnn"]) if t[k]["cudnn"] else float("nan")
    us = " | ".join(", ".join(f"{x:.2f}" for x in t[k][v]) for v in variants)
    rat = " | ".join(f"{c / statistics.median(t[k][v]):.3f}" if t[k][v] else "-" for v in variants)
    print(f"| {' | '.join(map(str, k))} | {us} | {c:.2f} | {rat} |")
