#!/usr/bin/env python3
"""A model of the backward grid's makespan under a causal mask, in block times: no GPU needed.

Each unit (head or head slice) has key blocks n = 0..N-1; the CTA of key block n visits query
blocks n..N-1 (one block time each, square causal, kBlockM = kBlockN). CTAs start as SMs free up,
in the grid's order (bwd_grid_order.hpp): the default mode ascending (longest first within a
unit), the deterministic one descending, where key block n's dQ sum at query block m also waits
for key block n + 1's at m plus a handoff. Each CTA pays `start_end` block times once (a CTA per
tile). Prints the makespan of both orders against the ideal (all work spread evenly). Usage:
  tools/backward_grid_sim.py [--key-blocks 16] [--units 256] [--sms 132] [--start-end 1] [--handoff 0.3]
(d64 causal 2k, batch 8 x 32 heads: 16 key blocks, 256 units.)
"""
import argparse
import heapq


def makespan(order, key_blocks, sms, start_end, handoff, ordered_dq):
    added = {}  # (n, unit, m) -> when key block n's dQ sum at query block m is in
    free = [0.0] * sms
    end = 0.0
    for n, unit in order:
        t = heapq.heappop(free) + start_end / 2
        for m in range(n, key_blocks):
            t += 1.0
            if ordered_dq and n + 1 <= m:
                t = max(t, added[(n + 1, unit, m)] + handoff)
            added[(n, unit, m)] = t
        t += start_end / 2
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--key-blocks", type=int, default=16)
    ap.add_argument("--units", type=int, default=256)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--start-end", type=float, default=1.0)
    ap.add_argument("--handoff", type=float, default=0.3)
    a = ap.parse_args()
    n_range = range(a.key_blocks)
    work = a.units * sum(a.key_blocks - n for n in n_range) + a.units * a.key_blocks * a.start_end
    ideal = work / a.sms
    default = [(n, u) for u in range(a.units) for n in n_range]
    deterministic = [(n, u) for u in range(a.units) for n in reversed(n_range)]
    d = makespan(default, a.key_blocks, a.sms, a.start_end, a.handoff, False)
    t = makespan(deterministic, a.key_blocks, a.sms, a.start_end, a.handoff, True)
    print(f"ideal {ideal:.1f}; default order {d:.1f} ({d / ideal:.3f} of ideal); "
          f"deterministic order with ordered dQ {t:.1f} ({t / ideal:.3f})")


if __name__ == "__main__":
    main()
