#!/usr/bin/env python3
"""Where the varlen forward and backward lose against the dense call of the same tokens (issue 26's
varlen bar): compare.py's varlen problem (16k tokens, 16 heads, d128, bf16) run as
  dense       the fixed-length batch of equal sequences
  equal       the same lengths through the varlen call (the varlen path's own cost)
  random      compare.py's random lengths (the row the bar is judged on)
  rand128     those lengths rounded to multiples of 128 (no partial key or query blocks)
  sorted      the random lengths, longest sequence first (the grid's tail)
  r128sorted  both
Prints each case's TFLOP/s (exact FLOPs of its lengths) over dense's, best of the rounds.

Usage: varlen_gap_probe.py OUT.json [--seqlens 2048,4096,8192] [--rounds 2]
"""
import argparse
import functools
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

HEADS, HDIM, TOKENS = 16, 128, 16384


def cases(seqlen):
    from compare import varlen_lengths

    lengths = varlen_lengths(seqlen, TOKENS, seed=seqlen)
    rounded = [max(128, 128 * round(n / 128)) for n in lengths]
    equal = [seqlen] * (TOKENS // seqlen)
    return {"dense": (equal, True), "equal": (equal, False), "random": (lengths, False),
            "rand128": (rounded, False), "sorted": (sorted(lengths, reverse=True), False),
            "r128sorted": (sorted(rounded, reverse=True), False)}


def tflops(torch, lengths, causal, dense):
    """Forward and backward TFLOP/s of hopattn on these sequence lengths."""
    import hopattn
    from gpu_timing import median_ms

    total = sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand():
        return torch.randn(total, HEADS, HDIM, device="cuda", dtype=torch.bfloat16, generator=g)

    q, k, v, dout = rand(), rand(), rand(), rand()
    if dense:
        shape = (len(lengths), lengths[0], HEADS, HDIM)
        q, k, v, dout = (x.view(shape) for x in (q, k, v, dout))
        inputs = tuple(x.requires_grad_() for x in (q, k, v))

        def forward():
            return hopattn.attention(*inputs, causal=causal)
    else:
        cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
        longest = max(lengths)
        inputs = tuple(x.requires_grad_() for x in (q, k, v))

        def forward():
            return hopattn.attention_varlen(*inputs, cu, cu, longest, longest, causal=causal)
    out = forward()
    backward = functools.partial(torch.autograd.grad, out, inputs, dout, retain_graph=True)
    flops = sum(4 * HEADS * n * n * HDIM / (2 if causal else 1) for n in lengths)
    result = {}
    for name, fn, factor in (("fwd", forward, 1.0), ("bwd", backward, 2.5)):
        fn()  # module loading and first-call costs stay out of median_ms's host-time estimate
        torch.cuda.synchronize()
        ms, _ = median_ms(torch, fn, 3, 30)
        result[name] = flops * factor / ms / 1e9
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json")
    parser.add_argument("--seqlens", default="2048,4096,8192")
    parser.add_argument("--rounds", type=int, default=2)
    a = parser.parse_args()
    import torch

    rows = []
    for causal in (False, True):
        for seqlen in (int(s) for s in a.seqlens.split(",")):
            named = cases(seqlen)
            for rnd in range(a.rounds):
                for name, (lengths, dense) in named.items():
                    rows.append(dict(causal=causal, seqlen=seqlen, case=name, round=rnd, lengths=lengths,
                                     **tflops(torch, lengths, causal, dense)))
            for direction in ("fwd", "bwd"):
                best = {}
                for r in rows:
                    if r["causal"] == causal and r["seqlen"] == seqlen:
                        best[r["case"]] = max(best.get(r["case"], 0.0), r[direction])
                print(f"causal={int(causal)} seqlen={seqlen} {direction}: " +
                      " ".join(f"{c} {best[c] / best['dense']:.3f}" for c in named), flush=True)
    with open(a.json, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
