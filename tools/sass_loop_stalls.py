#!/usr/bin/env python3
"""The fixed stall cycles that ptxas encoded in a kernel's loops, from `cuobjdump -sass` output: no
GPU needed. Each sm_90 instruction carries, in its control bits, how many cycles its warp waits
before issuing the next one (bits 105-108 of the 128-bit word): latencies of fixed-latency results
and pipe throughputs (a MUFU.EX2 holds its sub-partition's XU pipe for 8 cycles). ncu reports the
same waits as the `wait` stall reason. For each loop that issues at least --min-hgmma HGMMAs (the
block loops), prints its instruction count, the sum of those cycles and their split by opcode;
--at-least N also lists every instruction encoded with N or more cycles.

Usage: cuobjdump -sass OBJ > k.sass; tools/sass_loop_stalls.py k.sass [--function REGEX] [--at-least N]
"""
import argparse
import collections
import re

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]+) \*/")
CONTROL = re.compile(r"^\s*/\* (0x[0-9a-f]+) \*/\s*$")


def functions(lines):
    """(name, [instructions]) per function; an instruction is (address, text, stall cycles)."""
    name, body = None, []
    for k, line in enumerate(lines):
        if "Function :" in line:
            if name:
                yield name, body
            name, body = line.split("Function :")[1].strip(), []
            continue
        m = INSTRUCTION.search(line)
        c = CONTROL.match(lines[k + 1]) if m and k + 1 < len(lines) else None
        if m and c:
            high = int(c.group(1), 16)  # bits 64-127 of the instruction
            body.append((int(m.group(1), 16), m.group(2), (high >> 41) & 0xF))
    if name:
        yield name, body


def opcode(text):
    return next(w for w in text.split() if not w.startswith("@")).split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sass")
    ap.add_argument("--function", default=".", help="regex on the mangled name (default: every function)")
    ap.add_argument("--min-hgmma", type=int, default=8)
    ap.add_argument("--at-least", type=int, default=0)
    a = ap.parse_args()
    for name, body in functions(open(a.sass).read().split("\n")):
        if not re.search(a.function, name):
            continue
        for address, text, _ in body:
            target = re.search(r"BRA (0x[0-9a-f]+)", text)
            if not target or int(target.group(1), 16) >= address:
                continue
            loop = [x for x in body if int(target.group(1), 16) <= x[0] <= address]
            if sum("HGMMA" in x[1] for x in loop) < a.min_hgmma:
                continue
            cycles = collections.Counter()
            for _, t, stall in loop:
                cycles[opcode(t)] += stall
            print(f"...{name[-90:]}\n  loop {loop[0][0]:#x}-{address:#x}: {len(loop)} instructions, "
                  f"{sum(cycles.values())} encoded stall cycles; by opcode: "
                  + ", ".join(f"{op} {n}" for op, n in cycles.most_common(10)))
            for addr, t, stall in loop:
                if a.at_least and stall >= a.at_least:
                    print(f"    {addr:#07x} {stall:2d}  {t}")


if __name__ == "__main__":
    main()
