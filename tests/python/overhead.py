"""Per-call host overhead of hopattn's PyTorch functions next to PyTorch SDPA's cuDNN and
FlashAttention-2 backends, in one process (issue 7). Not a pytest file: run it by hand on a Hopper
machine with the package installed:

    python tests/python/overhead.py [--json overhead.json]

Each entry is the CPU time per call of a forward on a tiny problem (bf16, batch 1, seqlen 128,
8 heads, head dim 128), launched back to back so that the GPU is not the limit: the loop's wall
time divided by the calls, after warm-up, median of several rounds. `breakdown` splits hopattn's
own time into its parts, to say what dominates.
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import hopattn
from hopattn import _capi
from hopattn import _torch as hop_torch

CALLS, ROUNDS = 2000, 7


def per_call_us(fn, calls=CALLS, rounds=ROUNDS):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    results = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        results.append(elapsed / calls * 1e6)
    return statistics.median(results)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    torch.manual_seed(0)
    shape = (1, 128, 8, 128)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's (batch, heads, seqlen, d) view
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    backends = torch.nn.attention.SDPBackend

    def sdpa(backend):
        def call():
            with torch.nn.attention.sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

        return call

    entries = {
        "hopattn.attention": lambda: hopattn.attention(q, k, v, causal=True),
        "hopattn.attention (requires_grad)": lambda: hopattn.attention(qg, kg, vg, causal=True),
        "hopattn.flash_attn_func": lambda: hopattn.flash_attn_func(q, k, v, causal=True),
        "torch.ops.hopattn.forward (custom op)": lambda: torch.ops.hopattn.forward(q, k, v, 0.0, True, -1, -1, False, 0, -1),
        "sdpa cudnn": sdpa(backends.CUDNN_ATTENTION),
        "sdpa flash (FA2)": sdpa(backends.FLASH_ATTENTION),
    }
    results = {}
    for name, fn in entries.items():
        try:
            results[name] = per_call_us(fn)
        except Exception as e:  # a backend this PyTorch build lacks
            results[name] = f"unavailable: {type(e).__name__}: {e}"

    # What hopattn's own time is made of.
    out = torch.empty_like(q)
    lse = torch.empty((1, 8, 128), dtype=torch.float32, device="cuda")
    fields = [hop_torch._fields(t, _capi.BFLOAT16) for t in (q, k, v, out)] + [hop_torch._fields(lse, _capi.FLOAT32)]
    packed = _capi.pack_forward(*fields, 0.0, 1, -1, -1)
    invalid = _capi.pack_forward(*fields, 0.0, 1, -2, -1)  # rejected by validation: no launch
    lib = _capi.library()
    stream = hop_torch._current_stream(q.device.index)
    breakdown = {
        "checks (_check_qkv)": per_call_us(lambda: hop_torch._check_qkv(q, k, v)),
        "outputs (torch.empty x2)": per_call_us(
            lambda: (torch.empty(q.shape, dtype=q.dtype, device=q.device),
                     torch.empty((1, 8, 128), dtype=torch.float32, device=q.device))),
        "tensor fields + struct pack": per_call_us(
            lambda: _capi.pack_forward(*[hop_torch._fields(t, _capi.BFLOAT16) for t in (q, k, v, out)],
                                       hop_torch._fields(lse, _capi.FLOAT32), 0.0, 1, -1, -1)),
        "device guard + current stream": per_call_us(lambda: hop_torch._OnDevice(q.device).__enter__()),
        "ctypes call, validation only (rejected)": per_call_us(lambda: lib.hopattn_forward(invalid, stream)),
        "ctypes call, validation + launch": per_call_us(lambda: lib.hopattn_forward(packed, stream)),
    }

    report = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "problem": "bf16 causal, batch 1, seqlen 128, heads 8, head dim 128",
        "us_per_call": results,
        "hopattn_breakdown_us": breakdown,
    }
    width = max(len(n) for n in list(results) + list(breakdown))
    print(f"{report['device']}, torch {report['torch']}, {report['problem']}")
    for title, table in (("per call", results), ("hopattn breakdown", breakdown)):
        print(f"-- {title}")
        for name, value in table.items():
            print(f"{name:<{width}}  " + (f"{value:7.1f} us" if isinstance(value, float) else value))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
