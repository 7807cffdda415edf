#!/usr/bin/env python3
"""The kernels of one decode step on the GPU's timeline: each implementation's call (hopattn and
the SDPA peers, built as bench/decode.py builds them, on copies of the inputs enough that a replay
finds none of its K/V in L2) is captured in a CUDA graph per copy, and the graphs are replayed in
turn under the PyTorch profiler, which records every kernel's start and end. Prints, per
implementation, each kernel's median duration and start after the step's first kernel, the step's
span (first start to last end) and its period (one replay's start to the next's), which is what
bench/decode.py's graph-replay timing measures: the span plus what the GPU spends between steps.

Usage: decode_timeline.py [--hdim D] [--batch B] [--heads H] [--heads-kv HKV] [--seqlen-k S]
                          [--num-splits N] [--impls hopattn,cudnn,fa2] [--replays R]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))


def calls(torch, a):
    """Per implementation, its calls: one per copy of the inputs (bench/decode.py's _build)."""
    import decode

    p = decode.Problem("bf16", a.hdim, True, a.batch, a.heads, a.heads_kv, 1, a.seqlen_k, 0)
    copies = [decode.Tensors(torch, p, seed=i) for i in range(p.copies())]
    options = {"num_splits": a.num_splits} if a.num_splits else {}
    return {impl: decode._build(torch, p, impl, copies, options) for impl in a.impls.split(",")}


def step_kernels(torch, fns, replays):
    """The kernels of `replays` graph replays (the copies' graphs in turn), as (name, start us,
    end us), in start order."""
    import gpu_timing

    graphs, outputs = gpu_timing.captured_graphs(torch, fns, warmup=3)  # outputs: alive while replayed
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(replays):
            graphs[i % len(graphs)].replay()
        torch.cuda.synchronize()
    kernels = []
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start:
            kernels.append((e.name, e.time_range.start, e.time_range.end))
    return sorted(kernels, key=lambda k: k[1])


def report(name, kernels, replays):
    if not kernels or len(kernels) % replays:
        print(f"{name}: {len(kernels)} kernels in {replays} replays, not a whole number per step")
        return
    per = len(kernels) // replays
    steps = [kernels[i * per:(i + 1) * per] for i in range(replays)][1:]  # the first replay starts cold
    med = statistics.median
    print(f"{name}: {per} kernel(s) a step; median over {len(steps)} steps, us")
    for j in range(per):
        short = steps[0][j][0][:90]
        print(f"  {short:90s} start {med(s[j][1] - s[0][1] for s in steps):6.2f}  "
              f"dur {med(s[j][2] - s[j][1] for s in steps):6.2f}")
    span = med(s[-1][2] - s[0][1] for s in steps)
    period = med(b[0][1] - a[0][1] for a, b in zip(steps, steps[1:]))
    print(f"  span {span:.2f}  period {period:.2f}")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--seqlen-k", type=int, default=8192)
    ap.add_argument("--num-splits", type=int, default=0)
    ap.add_argument("--impls", default="hopattn,cudnn")
    ap.add_argument("--replays", type=int, default=40)
    a = ap.parse_args(argv)
    import torch

    print(f"decode b{a.batch} {a.heads}/{a.heads_kv} d{a.hdim} k{a.seqlen_k}")
    for name, fns in calls(torch, a).items():
        report(name, step_kernels(torch, fns, a.replays), a.replays)


if __name__ == "__main__":
    main(sys.argv[1:])
