"""tools/source_compare.py on two small ncu-style per-instruction tables."""

import csv
import subprocess
import sys

from bench_scripts import REPO

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_wait",
          "stall_wait (Not Issued)", "stall_barrier"]


def write_table(path, rows):
    with open(path, "w", newline="") as f:
        f.write('"ncu preamble line"\n')
        writer = csv.writer(f)
        writer.writerow(HEADER)
        writer.writerows(rows)


def test_compares_stalls_opcodes_and_the_loop_body(tmp_path):
    # Kernel a: a loop of two MUFUs and an HGMMA run 100 times, set-up run once; b: one MUFU per turn.
    write_table(tmp_path / "a.csv", [
        ["0x10", "MOV R1, R2", "5", "1", "0", "0", "5"],
        ["0x20", "MUFU.EX2 R3, R3", "40", "100", "30", "30", "0"],
        ["0x30", "MUFU.EX2 R4, R4", "40", "100", "30", "30", "0"],
        ["0x40", "@P0 HGMMA.64x128x16.F32.BF16 R8, gdesc[UR4], R8", "15", "100", "0", "0", "10"],
    ])
    write_table(tmp_path / "b.csv", [
        ["0x10", "MUFU.EX2 R3, R3", "20", "100", "2", "2", "0"],
        ["0x20", "SHFL.IDX PT, R5, R6, R7, 0x1f", "10", "100", "0", "0", "0"],
    ])
    out = subprocess.run([sys.executable, str(REPO / "tools" / "source_compare.py"), str(tmp_path / "a.csv"), "ours",
                          str(tmp_path / "b.csv"), "peer"], capture_output=True, text=True, check=True).stdout
    assert "| warp-state samples | 100 | 30 |" in out
    assert "| loop body: instructions (executed 100 / 100 times) | 3 | 2 |" in out
    assert "| wait | 60 | 2 | +58 |" in out
    assert "| MUFU | 80 | 20 | +60 | 0.0 M | 0.0 M |" in out
    assert "| HGMMA | 1 | 0 |" in out  # predicated instructions count under their opcode
    assert "| SHFL | 0 | 1 |" in out
