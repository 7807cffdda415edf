#!/usr/bin/env python3
"""Summary of tools/fwd_trace.patch's clock trace: the last call's per-CTA times, in microseconds
(p10 p50 p90 over the CTAs), of the forward kernel's first tile.

    python3 tools/fwd_trace_summary.py TRACE_FILE

A record is one CTA's 24 stamps (fwd_trace.patch); the slots read here: 0 the tile's key blocks
(<< 16), 1 the first consumer thread's entry, 2 its q_full wait done, 3 its Q loaded, 4 its first
K in, 5 its K/V waits in the main loop (a duration), 6 its epilogue start, 7 the partial stored,
8 the producer's scheduled tile read, 9 its first K copy issued, 10 its q_full arrival, 11 the
publisher's schedule arrival, 12 its q_full arrival, 13 thread 0's entry, 14 the producer's tile
made, 16 the publisher's schedule made, 17 its tile made, 18 and 19 the consumer's and thread 0's
__syncthreads done.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bwd_writer_trace import quantiles  # noqa: E402  (beside this file; imports no torch)


def last_call(path):
    calls = []
    for line in open(path):
        if line.startswith("CALL"):
            calls.append((line.strip(), []))
        elif line.startswith("TR") and calls:
            calls[-1][1].append([int(x) for x in line.split()[2:]])
    return calls[-1]


def us(values):
    """p10 p50 p90 of nanosecond values, in microseconds."""
    return " ".join(f"{v / 1e3:.2f}" for v in quantiles(values)) if values else "-"


def main():
    head, ctas = last_call(sys.argv[1])
    print(f"{head}, {len(ctas)} CTAs")
    t0 = min(r[13] for r in ctas)
    stored = [r for r in ctas if r[7] > 0]

    def after_entry(slot):
        return us([r[slot] - r[13] for r in ctas if r[slot]])

    lines = [
        ("key blocks of the tile", us([(r[0] >> 16) * 1000 for r in stored])),
        ("entry after the first CTA's", us([r[13] - t0 for r in ctas])),
        ("__syncthreads done (thread 0)", after_entry(19)),
        ("publisher: schedule made", after_entry(16)),
        ("publisher: schedule published", after_entry(11)),
        ("publisher: tile made", after_entry(17)),
        ("publisher: q_full arrival", after_entry(12)),
        ("producer: schedule read", after_entry(8)),
        ("producer: tile made", after_entry(14)),
        ("producer: first K issued", after_entry(9)),
        ("producer: q_full arrival", after_entry(10)),
        ("consumer: q_full wait done (after its entry)", us([r[2] - r[1] for r in stored])),
        ("consumer: Q load", us([r[3] - r[2] for r in stored])),
        ("consumer: first K wait", us([r[4] - r[3] for r in stored])),
        ("consumer: main loop", us([r[6] - r[4] for r in stored])),
        ("consumer: K/V waits in the loop", us([r[5] for r in stored])),
        ("consumer: partial store", us([r[7] - r[6] for r in stored])),
        ("consumer: entry to stored", us([r[7] - r[1] for r in stored])),
    ]
    for label, value in lines:
        print(f"  {label:46s} {value}")
    if stored:
        print(f"  last partial stored after the first entry     {(max(r[7] for r in stored) - t0) / 1e3:.2f}")


if __name__ == "__main__":
    main()
