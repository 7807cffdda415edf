#!/usr/bin/env python3
"""Runs one backward problem three times with a library built from tools/bwd_writer_trace.patch and
summarizes the last call's per-CTA clock records: where the dQ writer warp's time went, how long a
block took, how the CTAs filled the SMs. Usage (bf16, fixed lengths, heads_kv defaults to heads):

    python3 tools/bwd_writer_trace.py BATCH SEQLEN HEADS HEAD_DIM [--heads-kv N] [--causal] [--deterministic]
"""
import argparse
import collections
import os
import statistics
import tempfile


def run(args, trace_file):
    import torch
    from hopattn.flash_attn_interface import flash_attn_func

    os.environ["HOPATTN_TRACE_FILE"] = trace_file  # read by the patched launch at every call
    g = torch.Generator(device="cuda").manual_seed(0)
    heads_kv = args.heads_kv or args.heads

    def tensor(heads):
        return torch.randn(args.batch, args.seqlen, heads, args.head_dim, device="cuda", dtype=torch.bfloat16,
                           generator=g).requires_grad_()

    q, k, v = tensor(args.heads), tensor(heads_kv), tensor(heads_kv)
    out = flash_attn_func(q, k, v, causal=args.causal, deterministic=args.deterministic)
    dout = torch.randn_like(out)
    for _ in range(3):  # the first calls warm up; the summary reads the last
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()


def quantiles(values, fractions=(0.1, 0.5, 0.9)):
    values = sorted(values)
    return [values[int(f * (len(values) - 1))] for f in fractions]


def summarize(trace_file):
    lines = open(trace_file).read().splitlines()
    last_call = max(i for i, line in enumerate(lines) if line.startswith("CALL"))
    print(lines[last_call], "(batch seqlen heads heads_kv head_dim masked deterministic slices)")
    rows = []
    for line in lines[last_call + 1:]:
        x = [int(v) for v in line.split()[1:]]
        rows.append(dict(sm=x[0], n=x[2], unit=(x[3], x[4]), t0=x[5], t1=x[6], turn=x[7], full=x[8],
                         complete=x[9], blocks=max(x[10], 1)))
    start, end = min(r["t0"] for r in rows), max(r["t1"] for r in rows)
    span = (end - start) / 1e3
    busy = sum(r["t1"] - r["t0"] for r in rows) / 1e3
    sms = len({r["sm"] for r in rows})
    blocks = sum(r["blocks"] for r in rows)
    print(f"  {len(rows)} CTAs on {sms} SMs, {span:.1f} us; SMs busy {busy / (sms * span):.3f} of it")
    share = lambda key: sum(r[key] for r in rows) / 1e3 / busy
    per_block = lambda key: sum(r[key] for r in rows) / blocks
    print(f"  writer: turn waits {share('turn'):.3f} of CTA time ({per_block('turn'):.0f} ns a block), share waits "
          f"{share('full'):.3f}, completion and hand-on {share('complete'):.3f} ({per_block('complete'):.0f} ns a block)")
    print("  CTA time a block, us (p10 p50 p90): " + " ".join(
        f"{v:.2f}" for v in quantiles([(r["t1"] - r["t0"]) / 1e3 / r["blocks"] for r in rows])))
    print("  turn waits a CTA, us (p10 p50 p90): " + " ".join(f"{v:.1f}" for v in quantiles([r["turn"] / 1e3 for r in rows])))
    by_unit = collections.defaultdict(list)
    for r in rows:
        by_unit[r["unit"]].append(r)
    sample = rows[::max(1, len(rows) // 400)]
    together = [sum(1 for o in by_unit[r["unit"]] if o["t0"] <= r["t0"] < o["t1"]) for r in sample]
    print("  CTAs of the same unit running at a CTA's start (p10 p50 p90): " + " ".join(map(str, quantiles(together))))
    top = [r for r in rows if r["n"] == max(o["n"] for o in by_unit[r["unit"]])]
    print(f"  top key block of each unit (never waits for another CTA): {statistics.median((r['t1'] - r['t0']) / 1e3 / r['blocks'] for r in top):.2f} us a block")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("batch", type=int)
    parser.add_argument("seqlen", type=int)
    parser.add_argument("heads", type=int)
    parser.add_argument("head_dim", type=int)
    parser.add_argument("--heads-kv", type=int, default=None)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        trace_file = os.path.join(folder, "trace.txt")
        run(args, trace_file)
        summarize(trace_file)


if __name__ == "__main__":
    main()
