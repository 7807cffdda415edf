#!/usr/bin/env python3
"""Times the peers (PyTorch SDPA's cuDNN and FlashAttention-2 backends) on one problem, in the
JSON schema of docs/benchmarking.md, so that hopattn-bench's rows can be compared as ratios from
the same run on the same GPU. Fixed-length, non-GQA problems only (what SDPA's fused backends take).
"""
import argparse
import json
import sys

import torch

import gpu_timing  # bench/, beside this script
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}


# The standard sweep of docs/benchmarking.md: 16k tokens, hidden 2048, bf16.
SWEEP_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
SWEEP_HEADDIMS = (64, 128, 256)


def problems(a):
    """(batch, seqlen, heads, headdim, causal) of every problem the flags ask for."""
    if not a.sweep:
        return [(a.batch, a.seqlen, a.heads, a.headdim, a.causal)]
    dims = [int(d) for d in a.sweep_headdims.split(",")]
    return [(16384 // s, s, 2048 // d, d, c) for d in dims for c in (False, True) for s in SWEEP_SEQLENS]


def time_problem(a, batch, seqlen, heads, headdim, causal):
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    shape = (batch, heads, seqlen, headdim)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    flops = 4 * batch * heads * seqlen * seqlen * headdim / (2 if causal else 1)
    directions = ("fwd", "bwd") if a.direction == "both" else (a.direction,)
    rows = []
    for impl, backend in BACKENDS.items():
        with sdpa_kernel(backend):
            forward = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            out = forward()
            backward = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            for direction, fn, scale in (("fwd", forward, 1.0), ("bwd", backward, 2.5)):
                if direction not in directions:
                    continue
                ms, _ = gpu_timing.median_ms(torch, fn, a.warmup, a.reps)
                rows.append({"impl": impl, "direction": direction, "dtype": a.dtype, "hdim": headdim,
                             "causal": causal, "window_left": -1, "window_right": -1,
                             "batch": batch, "heads": heads, "heads_kv": heads, "seqlen_q": seqlen,
                             "seqlen_k": seqlen, "varlen": False, "deterministic": False, "ms": ms,
                             "tflops": scale * flops / (ms * 1e9)})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--headdim", type=int, default=128)
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", default="-")
    parser.add_argument("--sweep", action="store_true", help="the standard sweep (shape flags ignored)")
    parser.add_argument("--sweep-headdims", default=",".join(map(str, SWEEP_HEADDIMS)),
                        help="the sweep's head dims, comma separated (default 64,128,256)")
    parser.add_argument("--direction", choices=["fwd", "bwd", "both"], default="both")
    a = parser.parse_args()

    rows = []
    for problem in problems(a):
        rows += time_problem(a, *problem)
    env = {"date": None, "gpu": torch.cuda.get_device_name(), "driver": None, "cuda": torch.version.cuda,
           "torch": torch.__version__, "cudnn": str(torch.backends.cudnn.version()), "commit": None,
           "command": " ".join(sys.argv)}
    text = json.dumps({"env": env, "rows": rows}, indent=1)
    if a.json == "-":
        print(text)
    else:
        with open(a.json, "w") as f:
            f.write(text)
    for r in rows:
        print(f"{r['impl']:8s} {r['direction']} d{r['hdim']:<3d} {'causal' if r['causal'] else 'none':6s} "
              f"s{r['seqlen_q']:<6d} {r['ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s", file=sys.stderr)


if __name__ == "__main__":
    main()
