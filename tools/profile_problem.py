#!/usr/bin/env python3
"""Runs one hopattn call of a named problem a few times, for a profiler wrapped around it
(tools/profile_pipes.sh runs it under ncu): the problems of bench/compare.py (dense: softcap,
sinks, windows, GQA), bench/chunked_prefill.py (paged or packed caches) and bench/decode.py, built
by their own classes, so that a profile is of exactly what those benchmarks time. Prints the
problem it ran.

Usage (bf16 unless --dtype; every size has a default):
  profile_problem.py dense   [--dtype bf16|fp16|e4m3] [--hdim D] [--batch B] [--seqlen S] [--heads H] [--heads-kv HKV]
                             [--causal] [--window L] [--sinks] [--softcap C] [--direction fwd|bwd]
                             [--impl hopattn|fa4|cudnn|...] [--deterministic]
  profile_problem.py chunked [--hdim D] [--batch B] [--seqlen-q S] [--seqlen-k S] [--page-size P]
  profile_problem.py decode  [--hdim D] [--batch B] [--seqlen-k S] [--heads H] [--heads-kv HKV]
                             [--page-size P] [--num-splits N]
  common: [--calls N] (default 3: the profiler skips the first ones)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))


def dense_call(torch, a):
    import compare

    p = compare.Problem(a.dtype, a.hdim, a.causal, a.batch, a.seqlen, a.heads, a.heads_kv,
                        window=(a.window, 0) if a.window >= 0 else (-1, -1), sinks=a.sinks, softcap=a.softcap)
    t = compare.Tensors(torch, p, seed=0)
    if a.impl == "hopattn":
        fwd = compare.make_hopattn(torch, p, t, a.deterministic, **compare.mask_options(p, t))
    else:  # a peer on the same tensors, for a profile side by side with ours
        fwd = compare.PEERS[a.impl](torch, p, t, a.deterministic)
    if a.direction == "fwd":
        return p.describe(), fwd
    out = fwd()
    inputs = t.inputs()
    return p.describe(), lambda: torch.autograd.grad(out, inputs, t.dout, retain_graph=True)


def chunked_call(torch, a):
    import chunked_prefill

    p = chunked_prefill.Problem.sampled("bf16", a.hdim, a.heads, a.heads_kv, a.batch, a.seqlen_q, a.seqlen_k,
                                        a.page_size, seed=0)
    t = chunked_prefill.Tensors(torch, p, seed=0)
    return f"chunked prefill {p.batch} x {a.seqlen_q} against {a.seqlen_k}, page {a.page_size}", \
        chunked_prefill.make_hopattn(t)


def decode_call(torch, a):
    import decode

    p = decode.Problem("bf16", a.hdim, True, a.batch, a.heads, a.heads_kv, 1, a.seqlen_k, a.page_size)
    t = decode.Tensors(torch, p, seed=0)
    options = {"num_splits": a.num_splits} if a.num_splits else {}
    return f"decode b{a.batch} {a.heads}/{a.heads_kv} k{a.seqlen_k} page {a.page_size}", \
        decode.make_kvcache(p, t, options)


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=["dense", "chunked", "decode"])
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--seqlen-q", type=int, default=4096)
    ap.add_argument("--seqlen-k", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--heads-kv", type=int, default=None)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window", type=int, default=-1, help="left window (right 0); -1: none")
    ap.add_argument("--sinks", action="store_true")
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--direction", choices=["fwd", "bwd"], default="fwd")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "e4m3"], default="bf16",
                    help="dense only; e4m3: FP8 inputs (the bf16 ones rounded), forward only")
    ap.add_argument("--impl", default="hopattn", help="dense only: hopattn or a peer of bench/compare.py (fa4, cudnn, ...)")
    ap.add_argument("--deterministic", action="store_true", help="dense only: the deterministic mode")
    ap.add_argument("--page-size", type=int, default=0)
    ap.add_argument("--num-splits", type=int, default=0)
    ap.add_argument("--calls", type=int, default=3)
    return ap


def main(argv):
    a = parser().parse_args(argv)
    # The benchmarks' shapes: 16k tokens and 2048 of hidden size for dense rows, 32/8 heads else.
    if a.kind == "dense":
        a.batch = a.batch or max(1, 16384 // a.seqlen)
        a.heads = a.heads or 2048 // a.hdim
    else:
        a.batch = a.batch or (4 if a.kind == "chunked" else 1)
        a.heads = a.heads or 32
    a.heads_kv = a.heads_kv or (a.heads if a.kind == "dense" else 8)
    import torch

    name, call = {"dense": dense_call, "chunked": chunked_call, "decode": decode_call}[a.kind](torch, a)
    for _ in range(a.calls):
        call()
    torch.cuda.synchronize()
    print(f"profile_problem: {name}: {a.calls} calls")


if __name__ == "__main__":
    main(sys.argv[1:])
