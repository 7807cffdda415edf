#!/usr/bin/env python3
"""hopattn side by side with its peers: timing on a Hopper GPU, and a report that needs no GPU.

    python3 bench/compare.py run --json OUT.json [--report-dir DIR] [--quick] [subset options]
    python3 bench/compare.py report FILES... --out DIR [--name NAME] [--peers cudnn,fa2]
    python3 bench/compare.py decode --json OUT.json [--report-dir DIR] [--quick] [subset options]
    python3 bench/compare.py chunked_prefill --json OUT.json [--report-dir DIR] [--quick] [subset options]

`run` (needs PyTorch, a Hopper GPU and the hopattn package) times hopattn and its peers on the
same tensors in one process: PyTorch SDPA's cuDNN, FlashAttention-2 and memory-efficient backends
always, FlashAttention-3 (`flash_attn_interface`) and FlashAttention-4 (`flash_attn.cute`) when
importable. Problems: the standard sweep of docs/benchmarking.md (16k tokens, hidden 2048, seqlen
512..16k, head dim 64/96/128/192/256, causal and not) plus GQA rows (d128, 16k tokens, query / KV
heads 64/8, 32/4 and 32/1) and varlen rows (16 heads, d128, random lengths in [seqlen/2, 3*seqlen/2] adding up to
16k tokens, seqlen <= 8k), forward and backward, bf16 and fp16, and deterministic backward rows for
the implementations that have one (hopattn, FA3, FA4). `--window LEFT` adds each causal problem
with the sliding window (LEFT, 0) (hopattn, FA3, FA4), `--sinks` each problem with attention sinks
(hopattn and FA4), `--softcap VALUE` each problem with the scores capped at VALUE (hopattn, FA3,
FA4); the copies combine (docs/benchmarking.md). `--hdim-pairs 192x128[,...]` adds sweep problems
whose V (and O, dO, dV) has its own head dim (hdim_v 128 beside hdim 192), each right after the
problem of equal head dims when --hdims selects it; their FLOPs count both head dims, forward
2 * (hdim + hdim_v) per visible query-key pair and head. Forward and backward are timed with
autograd on (inputs require grad), the backward as torch.autograd.grad of one retained forward
output (with sinks, also their gradient), GPU time only (bench/gpu_timing.py). Before timing, every output
(hopattn's and each peer's) is checked with FA3's rule against a float64 reference on one batch
element and one KV-head group of the same tensors (with the window, the sinks and the cap of the
problem): error <= 2 * the naive low-precision error + atol; the sinks' gradient over the whole
batch. A hopattn mismatch is reported and not timed. The JSON follows docs/benchmarking.md.

`report` reads JSON files of one run (e.g. hopattn-bench --json plus bench/peers_sdpa.py --json, or
one file of `run`) and writes NAME.md (TFLOP/s per implementation and hopattn/peer ratios per row,
geomean per panel; with sink rows, hopattn with / without sinks per problem; with softcap rows,
hopattn with / without the cap per problem; with hdim_v rows, hopattn on them beside the same
problem with hdim_v = hdim, and hopattn / peer there) and
NAME-<direction>-<dtype>[-gqaH-HKV|-varlen][-hdim_vV][-windowL_R][-sinks][-softcapC].png plots in
the style of the FlashAttention papers (grouped bars per seqlen, one panel per head dim x causal).

`decode` (bench/decode.py) times decode attention, a few query rows against a long KV cache
(contiguous or paged, and the step that appends a key with rotary embedding), in TB/s.

`chunked_prefill` (bench/chunked_prefill.py) times varlen query chunks attending causally to their
KV caches, contiguous or paged, in TFLOP/s.

Nothing here imports torch or matplotlib at module level: the report part runs on any machine
with matplotlib, and the module imports anywhere.
"""
import argparse
import copy
import json
import functools
import math
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import gpu_timing  # noqa: E402  (bench/, also when this file is loaded by path)

# Order in which implementations appear in tables and plots; unknown impls follow, sorted.
IMPL_ORDER = ["hopattn", "fa3", "fa4", "cudnn", "fa2", "efficient"]
IMPL_LABELS = {"hopattn": "hopattn", "fa3": "FlashAttention-3", "fa4": "FlashAttention-4",
               "cudnn": "cuDNN (SDPA)", "fa2": "FlashAttention-2 (SDPA)", "efficient": "mem-efficient (SDPA)"}
IMPL_COLORS = {"hopattn": "#d62728", "fa3": "#1f77b4", "fa4": "#9467bd", "cudnn": "#2ca02c",
               "fa2": "#ff7f0e", "efficient": "#8c564b"}

SWEEP_TOKENS = 16384
SWEEP_HIDDEN = 2048
SWEEP_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
# d96 and d192 take hidden // d heads (21 and 10): the same 16k tokens, hidden rounded down.
SWEEP_HEADDIMS = (64, 96, 128, 192, 256)
# (query heads, KV heads) of the GQA rows at d128: a group of 8, 8 groups of 4, and MQA.
GQA_SHAPES, GQA_HDIM = ((64, 8), (32, 4), (32, 1)), 128
VARLEN_HEADS, VARLEN_HDIM = 16, 128


# --------------------------------------------------------------------------------------------
# Report part (no GPU, no torch)
# --------------------------------------------------------------------------------------------

# Fields that rows written before they existed lack, with what such rows mean by leaving them out
# (hdim_v, also absent there, is hdim).
ROW_DEFAULTS = {"window_left": -1, "window_right": -1, "softcap": 0, "sinks": False}


def field(row, name):
    """A row's field, or its default for result files written before the field existed."""
    if name == "hdim_v":
        return row.get("hdim_v", row["hdim"])
    return row.get(name, ROW_DEFAULTS[name])


# The end of kind_of's kind for rows whose V has its own head dim.
HDIM_V_KIND = "hdim_v {}"


def kind_of(row):
    """'varlen', 'gqa H/HKV' or '' (plain multi-head attention), followed by 'hdim_v V' when V's
    head dim differs from hdim ('hdim_v 128', 'gqa 64/8 hdim_v 128'). hdim_v is part of the kind,
    not a panel field of its own, so that such rows get panels and figures of their own (a d192
    panel holds the d192 kernel's rows only) while every panel and figure of rows with one head dim
    keeps the fields and names it had."""
    if row.get("varlen"):
        kind = "varlen"
    else:
        heads, heads_kv = row["heads"], row.get("heads_kv", row["heads"])
        kind = f"gqa {heads}/{heads_kv}" if heads_kv != heads else ""
    hdim_v = field(row, "hdim_v")
    return kind if hdim_v == row["hdim"] else f"{kind} {HDIM_V_KIND.format(hdim_v)}".lstrip()


def row_key(row):
    """Identity of a problem: rows of different impls with equal keys were timed on the same problem.
    The fields added later (hdim_v, softcap, sinks) come last, so that the positions of the others
    stay what bench/ab_table.py reads (a distinct hdim_v also shows in the kind, kind_of)."""
    return (row["direction"], bool(row.get("deterministic", False)), row["dtype"], kind_of(row), row["hdim"],
            bool(row["causal"]), field(row, "window_left"), field(row, "window_right"), row["batch"],
            row["heads"], row.get("heads_kv", row["heads"]), row["seqlen_q"], row["seqlen_k"],
            row.get("total_q"), row.get("total_k"), field(row, "hdim_v"), field(row, "softcap"),
            bool(field(row, "sinks")))


def without_sinks(key):
    """The key of the same problem without attention sinks."""
    return key[:17] + (False,)


def as_bf16(key):
    """The key of the same problem with bf16 inputs (an e4m3 row's baseline)."""
    return key[:2] + ("bf16",) + key[3:]


def without_softcap(key):
    """The key of the same problem without the score cap (softcap 0)."""
    return key[:16] + (0,) + key[17:]


def same_head_dims(key):
    """The key of the same problem with V's head dim equal to hdim: what hopattn's kernel of head
    dim hdim runs (the problem itself when it has one head dim)."""
    hdim, hdim_v = key[4], key[15]
    if hdim_v == hdim:
        return key
    kind = key[3][:-len(HDIM_V_KIND.format(hdim_v))].rstrip()
    return key[:3] + (kind,) + key[4:15] + (hdim,) + key[16:]


def dims_text(hdim, hdim_v):
    """'192' for one head dim, '192x128' (QK x V, as --hdim-pairs writes it) for two."""
    return str(hdim) if hdim_v == hdim else f"{hdim}x{hdim_v}"


def panel_of(key):
    """(direction label, dtype, kind, hdim, causal, window, sinks, softcap) of a row key: one plot
    panel. The softcap comes last, so that code reading the first seven fields keeps working."""
    direction, det, dtype, kind, hdim, causal, wl, wr = key[:8]
    return (direction + (" det" if det else ""), dtype, kind, hdim, causal, (wl, wr), key[17], key[16])


def softcap_text(softcap):
    """A cap as the labels write it: 30 for 30.0, 12.5 for 12.5."""
    return f"{float(softcap):g}"


def _panel_softcap(panel):
    """The softcap of a panel tuple; 0 for the seven-field panels of callers from before it."""
    return panel[7] if len(panel) > 7 else 0


def load_rows(paths):
    """Rows and envs of JSON files of one run."""
    rows, envs = [], []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        envs.append(data.get("env", {}))
        rows += data["rows"]
    return rows, envs


def collect(rows):
    """{row key: {impl: row}}; a later row of the same impl and key replaces an earlier one."""
    by_key = defaultdict(dict)
    for row in rows:
        if row.get("tflops") is None:
            continue
        by_key[row_key(row)][row["impl"]] = row
    return by_key


def ordered_impls(impls):
    impls = set(impls)
    return [i for i in IMPL_ORDER if i in impls] + sorted(impls - set(IMPL_ORDER))


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def mask_label(causal, window):
    """'causal' or 'non-causal', with the window when it is bounded."""
    label = "causal" if causal else "non-causal"
    return label + (f" window ({window[0]},{window[1]})" if window != (-1, -1) else "")


def panel_label(panel):
    direction, dtype, kind, hdim, causal, window, sinks = panel[:7]
    softcap = _panel_softcap(panel)
    parts = [direction, dtype] + ([kind] if kind else []) + [f"d{hdim}", mask_label(causal, window)]
    return " ".join(parts + (["sinks"] if sinks else []) + ([f"softcap {softcap_text(softcap)}"] if softcap else []))


def sort_key(key):
    direction, det, dtype, kind, hdim, causal = key[:6]
    return ({"fwd": 0, "bwd": 1}.get(direction, 2), det, dtype, kind, hdim, causal, key[6:8], key[11], key[8:])


def problem_cells(key, row):
    """The cells that name a problem in the tables: dir, dtype, kind, d, causal, batch x seqlen."""
    direction, dtype, kind, hdim, causal, window, sinks, softcap = panel_of(key)
    mask = ("yes" if causal else "no") + (f", window ({window[0]},{window[1]})" if window != (-1, -1) else "")
    shape = f"{row['batch']} x {row['seqlen_q']}" + (" (varlen)" if row.get("varlen") else "")
    kind = (kind or "mha") + (" sinks" if sinks else "") + (f" softcap {softcap_text(softcap)}" if softcap else "")
    return [direction, dtype, kind, str(hdim), mask, shape]


def markdown_table(by_key, peers=None, long_from=2048):
    """Markdown: one row per problem that has a hopattn result (TFLOP/s per impl, hopattn / peer),
    then per panel and peer the geomean ratio over all rows and over rows with seqlen >= long_from."""
    impls = ordered_impls(i for v in by_key.values() for i in v)
    if peers is None:
        peers = [i for i in impls if i != "hopattn"]
    lines = []
    header = ["dir", "dtype", "kind", "d", "causal", "batch x seqlen", "hopattn"] + peers + [f"vs {p}" for p in peers]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    ratios = defaultdict(lambda: defaultdict(list))  # panel -> peer -> [(seqlen, ratio)]
    for key in sorted(by_key, key=sort_key):
        impl_rows = by_key[key]
        if "hopattn" not in impl_rows:
            continue
        panel = panel_of(key)
        ours = impl_rows["hopattn"]
        seqlen = ours["seqlen_q"]
        cells = problem_cells(key, ours) + [f"{ours['tflops']:.0f}"]
        cells += [f"{impl_rows[p]['tflops']:.0f}" if p in impl_rows else "" for p in peers]
        for p in peers:
            if p in impl_rows and impl_rows[p]["tflops"] > 0:
                r = ours["tflops"] / impl_rows[p]["tflops"]
                ratios[panel][p].append((seqlen, r))
                cells.append(f"{r:.3f}")
            else:
                cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"| panel | peer | rows | geomean hopattn/peer | rows seqlen >= {long_from} | geomean (seqlen >= {long_from}) "
                 f"| min (seqlen >= {long_from}) |")
    lines.append("|---|---|---|---|---|---|---|")
    for panel in sorted(ratios, key=lambda p: ({"fwd": 0}.get(p[0], 1), p[0], p[1:])):
        for p in peers:
            values = ratios[panel].get(p)
            if not values:
                continue
            long = [r for s, r in values if s >= long_from]
            lines.append(f"| {panel_label(panel)} | {p} | {len(values)} | {geomean([r for _, r in values]):.3f} | {len(long)} | "
                         + (f"{geomean(long):.3f} | {min(long):.3f} |" if long else " | |"))
    return "\n".join(lines) + "\n"


def _ratio_order(direction):
    """Forward first, then the backward directions by name ('bwd', 'bwd det')."""
    return ({"fwd": 0}.get(direction, 1), direction)


def ratio_summary(ratios, what, tag_header=None, tag_text=str, tag_order=lambda tag: tag):
    """The summary under a table that puts problems beside others: from ratios {(panel, tag):
    [ratio]}, per panel and tag the number of ratios, their geomean and the least, then the same per
    direction and tag over every panel ('fwd, every panel'). The tag (None throughout for none) is
    what the ratios of one panel differ in, written as a column `tag_header`: the softcap value, or
    what hopattn is compared with."""
    tag_column = [tag_header] if tag_header else []
    lines = ["| " + " | ".join(["panel"] + tag_column + ["rows", f"geomean {what}", "min"]) + " |",
             "|" + "---|" * (4 + len(tag_column))]

    def line(label, tag, values):
        tag_cell = [tag_text(tag)] if tag_header else []
        return "| " + " | ".join([label] + tag_cell + [str(len(values)), f"{geomean(values):.3f}",
                                                        f"{min(values):.3f}"]) + " |"

    directions = defaultdict(list)
    for panel, tag in sorted(ratios, key=lambda k: (_ratio_order(k[0][0]), k[0][1:], tag_order(k[1]))):
        values = ratios[(panel, tag)]
        directions[(panel[0], tag)] += values
        lines.append(line(panel_label(panel), tag, values))
    for direction, tag in sorted(directions, key=lambda d: (_ratio_order(d[0]), tag_order(d[1]))):
        lines.append(line(f"{direction}, every panel", tag, directions[(direction, tag)]))
    return lines


def sinks_table(by_key):
    """Markdown for the attention-sinks bar ('' when no row has sinks): per problem timed with sinks,
    hopattn's TFLOP/s without and with them and the ratio sinks / no sinks (both rows of one run, on
    the same q, k, v and dout), the same ratio for each peer that took the sinks; then per panel and
    per direction the geomean and the least of hopattn's ratios. The FLOPs do not count the sink, so
    the ratio is time without / time with sinks."""
    impls = ordered_impls(i for key, v in by_key.items() if key[17] for i in v)
    peers = [i for i in impls if i != "hopattn"]
    header = (["dir", "dtype", "kind", "d", "causal", "batch x seqlen", "hopattn", "hopattn sinks", "sinks / no sinks"]
              + [f"{p} sinks / no sinks" for p in peers])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ratios = defaultdict(list)  # (panel without sinks, None) -> [hopattn sinks / no sinks]
    for key in sorted(by_key, key=sort_key):
        plain = by_key.get(without_sinks(key), {})
        with_sinks = by_key[key]
        if not key[17] or "hopattn" not in with_sinks or "hopattn" not in plain:
            continue
        ours = with_sinks["hopattn"]["tflops"] / plain["hopattn"]["tflops"]
        ratios[(panel_of(without_sinks(key)), None)].append(ours)
        cells = problem_cells(without_sinks(key), plain["hopattn"])
        cells += [f"{plain['hopattn']['tflops']:.0f}", f"{with_sinks['hopattn']['tflops']:.0f}", f"{ours:.3f}"]
        cells += [f"{with_sinks[p]['tflops'] / plain[p]['tflops']:.3f}" if p in with_sinks and p in plain else ""
                  for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    if not ratios:
        return ""
    lines += [""] + ratio_summary(ratios, "hopattn sinks / no sinks")
    return "\n".join(lines) + "\n"


def _passed(row):
    """Whether a timed row passed its check (or ran without one): a peer's row is timed even when its
    check failed, and a ratio from such a row says nothing about the cap."""
    return not str(row.get("check", "pass")).startswith(("FAIL", "error"))


def _compared(numerator, denominator):
    """(cell, ratio) of the TFLOP/s of two rows (either may be None): ('', None) when one is
    missing, ('check failed', None) when one failed its check, else the ratio written and its value."""
    if numerator is None or denominator is None:
        return "", None
    if not (_passed(numerator) and _passed(denominator)):
        return "check failed", None
    ratio = numerator["tflops"] / denominator["tflops"]
    return f"{ratio:.3f}", ratio


def fp8_table(by_key):
    """Markdown for the FP8 bar ('' when no e4m3 row has a bf16 row beside it): per problem timed
    with e4m3 inputs, hopattn's TFLOP/s with bf16 and with e4m3 inputs and the ratio e4m3 / bf16
    (both rows of one run, the e4m3 inputs being the bf16 ones rounded); then per panel and per
    direction the geomean and the least of the ratios."""
    header = ["dir", "dtype", "kind", "d", "causal", "batch x seqlen", "hopattn bf16", "hopattn e4m3", "e4m3 / bf16"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ratios = defaultdict(list)  # (panel of the bf16 problem, None) -> [e4m3 / bf16]
    for key in sorted(by_key, key=sort_key):
        low = by_key[key]
        base = by_key.get(as_bf16(key), {})
        if key[2] != "e4m3" or "hopattn" not in low or "hopattn" not in base:
            continue
        ours = low["hopattn"]["tflops"] / base["hopattn"]["tflops"]
        ratios[(panel_of(as_bf16(key)), None)].append(ours)
        cells = problem_cells(key, low["hopattn"])
        cells += [f"{base['hopattn']['tflops']:.0f}", f"{low['hopattn']['tflops']:.0f}", f"{ours:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if not ratios:
        return ""
    lines += [""] + ratio_summary(ratios, "hopattn e4m3 / bf16")
    return "\n".join(lines) + "\n"


def softcap_table(by_key):
    """Markdown for the softcap bar ('' when no row has a softcap): per problem timed with a softcap,
    hopattn's TFLOP/s without and with it and the ratio softcap / no softcap (both rows of one run, on
    the same q, k, v and dout; with sinks or a window, the same problem with them and without the
    cap), the same ratio for each peer that took the cap ('check failed' where either of its rows
    failed the check); then per panel and per direction the geomean and the least of hopattn's
    ratios. The FLOPs do not count the cap, so the ratio is time without / time with the cap."""
    impls = ordered_impls(i for key, v in by_key.items() if key[16] for i in v)
    peers = [i for i in impls if i != "hopattn"]
    header = (["dir", "dtype", "kind", "d", "causal", "batch x seqlen", "softcap", "hopattn", "hopattn softcap",
               "softcap / no softcap"] + [f"{p} softcap / no softcap" for p in peers])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ratios = defaultdict(list)  # (panel without the cap, softcap) -> [hopattn softcap / no softcap]
    for key in sorted(by_key, key=sort_key):
        plain = by_key.get(without_softcap(key), {})
        capped = by_key[key]
        if not key[16] or "hopattn" not in capped or "hopattn" not in plain:
            continue
        ours = capped["hopattn"]["tflops"] / plain["hopattn"]["tflops"]
        ratios[(panel_of(without_softcap(key)), key[16])].append(ours)
        cells = problem_cells(without_softcap(key), plain["hopattn"]) + [softcap_text(key[16])]
        cells += [f"{plain['hopattn']['tflops']:.0f}", f"{capped['hopattn']['tflops']:.0f}", f"{ours:.3f}"]
        cells += [_compared(capped.get(p), plain.get(p))[0] for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    if not ratios:
        return ""
    lines += [""] + ratio_summary(ratios, "hopattn softcap / no softcap", "softcap", softcap_text)
    return "\n".join(lines) + "\n"


# What hopattn's TFLOP/s on a problem with its own hdim_v is compared with, besides its peers: the
# same problem with hdim_v = hdim (hopattn's kernel of head dim hdim), in hdim_v_table.
SAME_DIMS = "hdim_v = d"


def hdim_v_table(by_key):
    """Markdown for V's own head dim ('' when no row with hdim_v != hdim has a hopattn result): per
    such problem, hopattn's TFLOP/s on the same problem with hdim_v = hdim (the kernel of head dim
    hdim, same run; empty when the run did not select it) and on the problem itself, each counted
    with its own FLOPs, their ratio, and hopattn / peer on the problem for each peer that ran it
    ('check failed' where either row failed the check: a peer's row is timed all the same); then per
    panel and per direction the geomean and least of each ratio. Each row's FLOPs count its own
    head dims (Problem.fwd_flops): a smaller V is less work, so the ratio to the same dims says
    whether the (192, 128) problem runs at the d192 kernel's rate per FLOP, not merely in less time."""
    keys = [key for key, impl_rows in by_key.items() if key[15] != key[4] and "hopattn" in impl_rows]
    if not keys:
        return ""
    peers = [i for i in ordered_impls(i for key in keys for i in by_key[key]) if i != "hopattn"]
    header = (["dir", "dtype", "kind", "d", "causal", "batch x seqlen", "hdim_v", f"hopattn {SAME_DIMS}", "hopattn",
               f"vs {SAME_DIMS}"] + [f"vs {p}" for p in peers])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ratios = defaultdict(list)  # (panel, what hopattn is compared with) -> [hopattn / it]
    for key in sorted(keys, key=sort_key):
        impl_rows = by_key[key]
        ours = impl_rows["hopattn"]
        same = by_key.get(same_head_dims(key), {}).get("hopattn")
        cells = problem_cells(same_head_dims(key), ours) + [str(key[15])]
        cells += [f"{same['tflops']:.0f}" if same else "", f"{ours['tflops']:.0f}"]
        for against, row in [(SAME_DIMS, same)] + [(p, impl_rows.get(p)) for p in peers]:
            cell, ratio = _compared(ours, row)
            cells.append(cell)
            if ratio is not None:
                ratios[(panel_of(key), against)].append(ratio)
        lines.append("| " + " | ".join(cells) + " |")
    if ratios:
        order = [SAME_DIMS] + peers
        lines += [""] + ratio_summary(ratios, "hopattn / against", "against", tag_order=order.index)
    return "\n".join(lines) + "\n"


def env_lines(envs):
    """Markdown bullet lines describing the environment of each input file."""
    lines = []
    for env in envs:
        fields = [f"{k}: {env[k]}" for k in ("gpu", "driver", "cuda", "torch", "cudnn", "hopattn", "commit", "date")
                  if env.get(k) not in (None, "", {})]
        if env.get("peers"):
            fields.append("peers: " + ", ".join(f"{k} {v}" for k, v in sorted(env["peers"].items())))
        if env.get("command"):
            fields.append(f"command: `{env['command']}`")
        lines.append("- " + "; ".join(str(f) for f in fields))
    return lines


def figure_groups(by_key):
    """{(direction label, dtype, kind, window, sinks, softcap): {(hdim, causal): {seqlen: {impl: tflops}}}}."""
    groups = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for key, impl_rows in by_key.items():
        direction, dtype, kind, hdim, causal, window, sinks, softcap = panel_of(key)
        group = groups[(direction, dtype, kind, window, sinks, softcap)]
        for impl, row in impl_rows.items():
            group[(hdim, causal)][row["seqlen_q"]][impl] = row["tflops"]
    return groups


def figure_name(name, group):
    """NAME-<direction>-<dtype>[-kind][-windowL_R][-sinks][-softcapC].png; group as figure_groups
    makes it (a group without the softcap field, from before it, reads as softcap 0)."""
    direction, dtype, kind, (wl, wr), sinks = group[:5]
    softcap = group[5] if len(group) > 5 else 0
    parts = [name, direction.replace(" ", "-"), dtype]
    if kind:  # 'varlen', 'gqa64-8' for 'gqa 64/8', 'gqa64-8-hdim_v128' for 'gqa 64/8 hdim_v 128'
        parts.append(re.sub(r" (?=\d)", "", kind).replace(" ", "-").replace("/", "-"))
    if (wl, wr) != (-1, -1):
        parts.append(f"window{wl}_{wr}")
    if sinks:
        parts.append("sinks")
    if softcap:
        parts.append(f"softcap{softcap_text(softcap)}")
    return "-".join(parts) + ".png"


def plot_group(path, title, panels, dpi=100):
    """One PNG: a grid of panels (rows: head dim, columns: non-causal / causal), grouped bars per
    seqlen, one bar per implementation, the TFLOP/s written on each bar (FlashAttention papers' style)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hdims = sorted({h for h, _ in panels})
    causals = sorted({c for _, c in panels})
    impls = ordered_impls(i for p in panels.values() for s in p.values() for i in s)
    fig, axes = plt.subplots(len(hdims), len(causals), figsize=(6.5 * len(causals), 3.2 * len(hdims)), squeeze=False)
    for r, hdim in enumerate(hdims):
        for c, causal in enumerate(causals):
            ax = axes[r][c]
            data = panels.get((hdim, causal), {})
            seqlens = sorted(data)
            width = 0.8 / max(1, len(impls))
            for i, impl in enumerate(impls):
                xs = [x + (i - (len(impls) - 1) / 2) * width for x in range(len(seqlens))]
                ys = [data[s].get(impl, 0.0) for s in seqlens]
                bars = ax.bar(xs, ys, width, label=IMPL_LABELS.get(impl, impl), color=IMPL_COLORS.get(impl))
                for bar, y in zip(bars, ys):
                    if y > 0:
                        ax.text(bar.get_x() + bar.get_width() / 2, y, f"{y:.0f}", ha="center", va="bottom",
                                fontsize=6, rotation=90 if len(impls) > 3 else 0)
            ax.set_xticks(range(len(seqlens)))
            ax.set_xticklabels([f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s) for s in seqlens])
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
            top = max([v for s in data.values() for v in s.values()] + [1.0])
            ax.set_ylim(0, top * 1.18)
            ax.set_title(f"head dim {hdim}, {'causal' if causal else 'non-causal'}", fontsize=10)
            ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(impls), fontsize=9, bbox_to_anchor=(0.5, 0.995))
    fig.suptitle(title, y=0.955, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def group_title(group, envs):
    direction, dtype, kind, (wl, wr), sinks = group[:5]
    softcap = group[5] if len(group) > 5 else 0
    gpu = next((e.get("gpu") for e in envs if e.get("gpu")), "GPU ?")
    what = {"fwd": "forward", "bwd": "backward", "bwd det": "deterministic backward"}.get(direction, direction)
    extra = f", {kind}" if kind else ""
    if (wl, wr) != (-1, -1):
        extra += f", window ({wl},{wr})"
    if sinks:
        extra += ", attention sinks"
    if softcap:
        extra += f", softcap {softcap_text(softcap)}"
    return f"Attention {what} speed, {dtype}{extra}, {gpu}"


def _untimed_note(rows, selected, what):
    """The bold line above a feature's table counting hopattn's rows of that feature that were not
    timed (their problems have no ratio there, and a bar read from the summary would miss them);
    none when there are none."""
    missing = [r for r in rows if r["impl"] == "hopattn" and selected(r) and r.get("tflops") is None]
    if not missing:
        return []
    return [f"**{len(missing)} hopattn {what} row(s) not timed** (check failed or error, listed below): their "
            "problems have no ratio here.", ""]


def write_report(paths, out_dir, name="report", peers=None, plots=True, long_from=2048, note=None):
    """Writes out_dir/name.md and (if plots) one PNG per figure group; returns the paths written."""
    rows, envs = load_rows(paths)
    by_key = collect(rows)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    pngs = []
    if plots:
        for group, panels in sorted(figure_groups(by_key).items(), key=lambda g: (g[0][0] != "fwd", g[0])):
            path = out_dir / figure_name(name, group)
            plot_group(path, group_title(group, envs), panels)
            pngs.append(path)
    md = [f"# hopattn and its peers: {name}", ""]
    if note:
        md += [note, ""]
    md += ["Inputs: " + ", ".join(f"`{Path(p).name}`" for p in paths) + ". Regenerate: `python3 bench/compare.py report "
           + " ".join(str(p) for p in paths) + f" --out {out_dir} --name {name}"
           + (f" --peers {','.join(peers)}" if peers else "") + "`" + (" with this paragraph as --note" if note else ""), ""]
    md += env_lines(envs)
    md += ["", "TFLOP/s = FLOPs / median time (forward 2 * batch * heads * seqlen_q * seqlen_k * (head dim + V's "
               "head dim), that is 4 * ... * head dim where they are equal, halved for causal, the visible query-key "
               "pairs counted exactly with a window; backward 2.5x); ratios are hopattn / peer from the same run.", ""]
    md += [f"![{p.stem}]({p.name})" for p in pngs]
    md += ["", markdown_table(by_key, peers=peers, long_from=long_from)]
    sinks = sinks_table(by_key)
    if sinks:
        md += ["## Attention sinks", "", "Each problem timed with attention sinks (`learnable_sink`, one logit per "
               "query head) beside the same problem without them in the same run: TFLOP/s and sinks / no sinks.", "",
               sinks]
    fp8 = fp8_table(by_key)
    if fp8:
        md += ["## FP8", "", "Each problem timed with float8 e4m3 inputs (the bf16 inputs rounded, no descale, O in "
               "bf16) beside the same problem with bf16 inputs in the same run: TFLOP/s and e4m3 / bf16.", "", fp8]
    softcap = softcap_table(by_key)
    if softcap:
        md += ["## Softcap", "", "Each problem timed with its scores capped (`softcap`, S = softcap * tanh(scale * "
               "q.k / softcap)) beside the same problem without the cap in the same run: TFLOP/s and softcap / no "
               "softcap (a peer's ratio only where both of its rows passed the check).", ""]
        md += _untimed_note(rows, lambda r: field(r, "softcap"), "softcap")
        md.append(softcap)
    hdim_v = hdim_v_table(by_key)
    if hdim_v:
        md += ["## V head dim", "", "Each problem timed with V's own head dim (`hdim_v`, which V, O, dO and dV "
               "have; Q and K keep `d`) beside the same problem with hdim_v = d (hopattn's kernel of head dim d) in "
               "the same run, each in TFLOP/s of its own FLOPs (both head dims counted: forward 2 * (d + hdim_v) per "
               f"visible query-key pair and head, backward 2 * (3 d + 2 hdim_v)): hopattn / hopattn {SAME_DIMS}, and hopattn / peer "
               "on the hdim_v problem where the peer ran it and both rows passed the check (SDPA's backends may "
               f"reject the shape: no row then). `hopattn {SAME_DIMS}` is empty where the run did not select that "
               "problem (`--hdims` without d).", ""]
        md += _untimed_note(rows, lambda r: field(r, "hdim_v") != r["hdim"], "hdim_v")
        md.append(hdim_v)
    untimed = [r for r in rows if r.get("tflops") is None]
    if untimed:
        md += ["Not timed (check failed or error):", ""]
        md += [f"- {r['impl']} {r['direction']}{' det' if r.get('deterministic') else ''} {r['dtype']} "
               f"d{dims_text(r['hdim'], field(r, 'hdim_v'))} "
               f"{mask_label(r['causal'], (field(r, 'window_left'), field(r, 'window_right')))}"
               f"{' sinks' if field(r, 'sinks') else ''}"
               f"{' softcap ' + softcap_text(field(r, 'softcap')) if field(r, 'softcap') else ''}"
               f" {r['batch']} x {r['seqlen_q']} h{r['heads']}/"
               f"{r.get('heads_kv', r['heads'])}{' varlen' if r.get('varlen') else ''}: {r.get('check', '?')}"
               for r in untimed]
        md.append("")
    md_path = out_dir / f"{name}.md"
    md_path.write_text("\n".join(md))
    written.append(md_path)
    return written + pngs


def report_main(argv):
    parser = argparse.ArgumentParser(prog="compare.py report", description="Markdown table and PNG plots from JSON "
                                     "files of one run (docs/benchmarking.md schema); no GPU needed.")
    parser.add_argument("json", nargs="+", help="result files of one run")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--name", default="report", help="file name stem (default: report)")
    parser.add_argument("--peers", default=None, help="peer impls for the ratio columns, comma separated "
                        "(default: every impl in the files)")
    parser.add_argument("--no-plots", action="store_true", help="markdown only (no matplotlib needed)")
    parser.add_argument("--long-from", type=int, default=2048, help="seqlen from which the 'long' geomean counts")
    parser.add_argument("--note", help="a paragraph to put under the title (markdown)")
    a = parser.parse_args(argv)
    peers = a.peers.split(",") if a.peers else None
    for path in write_report(a.json, a.out, a.name, peers, plots=not a.no_plots, long_from=a.long_from, note=a.note):
        print(path)


# --------------------------------------------------------------------------------------------
# Timing part (PyTorch, a Hopper GPU, the hopattn package)
# --------------------------------------------------------------------------------------------

def visible_pairs(seqlen, causal, window):
    """Query-key pairs a square (seqlen_q == seqlen_k) problem attends to: query i sees keys j with
    i - left <= j <= i + right, causal being right = 0 and -1 an unbounded side (docs/semantics.md)."""
    left, right = window
    if causal:
        right = 0
    left, right = (seqlen if left < 0 else left), (seqlen if right < 0 else right)
    return sum(min(seqlen - 1, i + right) - max(0, i - left) + 1 for i in range(seqlen))


class Problem:
    """One attention problem. Fixed length: q (batch, seqlen, heads, hdim). Varlen: lengths, packed.
    window: hopattn's window_size, (left, right) with -1 unbounded; sinks: with learnable_sink;
    softcap: the score cap (0: none), S = softcap * tanh(scale * q.k / softcap); hdim_v: the head
    dim of V, O, dO and dV (None: hdim), Q and K keeping hdim."""

    def __init__(self, dtype, hdim, causal, batch, seqlen, heads, heads_kv, lengths=None, window=(-1, -1),
                 sinks=False, softcap=0, hdim_v=None):
        self.dtype, self.hdim, self.causal = dtype, hdim, causal
        self.hdim_v = hdim if hdim_v is None else hdim_v
        self.batch, self.seqlen, self.heads, self.heads_kv = batch, seqlen, heads, heads_kv
        self.lengths = lengths  # varlen: per-sequence lengths (seqlen_q == seqlen_k), seqlen = nominal mean
        self.window, self.sinks, self.softcap = tuple(window), sinks, softcap

    def variant(self, **changes):
        """A copy with some attributes changed: the same problem with a window, sinks or a softcap."""
        other = copy.copy(self)
        other.__dict__.update(changes)
        return other

    @property
    def varlen(self):
        return self.lengths is not None

    @property
    def panel(self):
        """(dtype, kind, hdim, causal, hdim_v): --quick keeps one problem of each."""
        kind = "varlen" if self.varlen else (f"gqa {self.heads}/{self.heads_kv}" if self.heads != self.heads_kv else "")
        return (self.dtype, kind, self.hdim, self.causal, self.hdim_v)

    def fwd_flops(self):
        """2 * heads * (hdim + hdim_v) per visible query-key pair, the two matmuls S = Q K^T (hdim)
        and O = P V (hdim_v); 4 * heads * hdim where they are equal. Plain causal counts half the
        square (the FlashAttention convention), a window its pairs exactly (as hopattn-bench does).
        The sinks' few operations per row and the cap's tanh per score are not counted."""
        lens = self.lengths if self.varlen else [self.seqlen] * self.batch
        per_pair = 2 * self.heads * (self.hdim + self.hdim_v)
        if self.window == (-1, -1):
            return sum(per_pair * s * s for s in lens) / (2 if self.causal else 1)
        return sum(per_pair * visible_pairs(s, self.causal, self.window) for s in lens)

    def row(self, impl, direction, deterministic, ms, **extra):
        # The backward counts its five matmuls, 2 * (3 * hdim + 2 * hdim_v) per pair (S, dQ, dK in
        # hdim; dP, dV in hdim_v): 2.5x the forward for equal head dims (the FlashAttention
        # convention), 2.6x at (192, 128).
        backward_factor = (3 * self.hdim + 2 * self.hdim_v) / (self.hdim + self.hdim_v)
        flops = self.fwd_flops() * (backward_factor if direction == "bwd" else 1.0)
        row = {"impl": impl, "direction": direction, "dtype": self.dtype, "hdim": self.hdim, "hdim_v": self.hdim_v,
               "causal": self.causal, "window_left": self.window[0], "window_right": self.window[1],
               "softcap": self.softcap,
               "sinks": self.sinks, "batch": self.batch, "heads": self.heads, "heads_kv": self.heads_kv,
               "seqlen_q": self.seqlen, "seqlen_k": self.seqlen, "varlen": self.varlen,
               "deterministic": deterministic, "ms": ms, "tflops": flops / (ms * 1e9) if ms else None}
        if self.varlen:
            row["total_q"] = row["total_k"] = sum(self.lengths)
            row["max_seqlen"] = max(self.lengths)
        row.update(extra)
        return row

    def describe(self):
        kind = self.panel[1]
        mask = ("causal" if self.causal else "full") + (f" w{self.window[0]},{self.window[1]}"
                                                         if self.window != (-1, -1) else "")
        return (f"{self.dtype} d{dims_text(self.hdim, self.hdim_v)} {mask}{' sinks' if self.sinks else ''}"
                f"{' softcap' + softcap_text(self.softcap) if self.softcap else ''} {kind + ' ' if kind else ''}"
                f"b{self.batch} s{self.seqlen} h{self.heads}/{self.heads_kv}")


def varlen_lengths(seqlen, total, seed):
    """Random lengths in [seqlen/2, 3*seqlen/2], multiples of 8, summing to total (the last one clipped)."""
    import random

    rng = random.Random(seed)
    lengths, left = [], total
    while left > 0:
        s = min(left, 8 * rng.randint(max(1, seqlen // 16), max(1, 3 * seqlen // 16)))
        lengths.append(s)
        left -= s
    return lengths


def build_problems(a):
    # Head dims of the sweep: each of --hdims, then each QK head dim of --hdim-pairs that --hdims
    # lacks; for each, V's head dims: its own (when in --hdims), then those of its pairs. A pair's
    # problem comes right after the problem of equal head dims at the same seqlen, so that the rows
    # hdim_v_table divides are timed close together. Heads are hidden // hdim (QK's): the same heads,
    # batch and Q, K as that problem.
    hdims_v = {hdim: [hdim] for hdim in a.hdims}
    for hdim, hdim_v in a.hdim_pairs:
        hdims_v.setdefault(hdim, []).append(hdim_v)
    problems = []
    for dtype in a.dtype:
        for hdim, v_dims in hdims_v.items():
            for causal in a.causal:
                for s in a.seqlens:
                    problems += [Problem(dtype, hdim, causal, SWEEP_TOKENS // s, s, SWEEP_HIDDEN // hdim,
                                         SWEEP_HIDDEN // hdim, hdim_v=hdim_v) for hdim_v in v_dims]
        if "gqa" in a.extra and GQA_HDIM in a.hdims:
            for heads, heads_kv in GQA_SHAPES:
                for causal in a.causal:
                    for s in a.seqlens:
                        problems.append(Problem(dtype, GQA_HDIM, causal, SWEEP_TOKENS // s, s, heads, heads_kv))
        if "varlen" in a.extra and VARLEN_HDIM in a.hdims:
            for causal in a.causal:
                for s in a.seqlens:
                    if s > SWEEP_TOKENS // 2:  # one sequence: nothing variable about it
                        continue
                    lengths = varlen_lengths(s, SWEEP_TOKENS, seed=s)
                    problems.append(Problem(dtype, VARLEN_HDIM, causal, len(lengths), s, VARLEN_HEADS, VARLEN_HEADS,
                                            lengths))
    if a.quick:  # one row per panel: the seqlen nearest 4k among those selected
        best = {}
        for p in problems:
            if p.panel not in best or abs(math.log2(p.seqlen / 4096)) < abs(math.log2(best[p.panel].seqlen / 4096)):
                best[p.panel] = p
        problems = [p for p in problems if best[p.panel] is p]
    # The windowed, sink and softcap copies of each problem come right after it, so that the rows a
    # ratio divides are timed close together. Each option copies every problem the options before it
    # made: with all three, a causal problem runs as plain, window, sinks, window + sinks, and each of
    # those again with the cap.
    expanded = []
    for p in problems:
        variants = [p]
        if a.window is not None and p.causal:
            variants.append(p.variant(window=(a.window, 0)))
        if a.sinks:
            variants += [v.variant(sinks=True) for v in variants]
        if a.softcap:
            variants += [v.variant(softcap=a.softcap) for v in variants]
        expanded += variants
    return expanded


class Tensors:
    """Inputs of one problem, shared by every implementation: q, k, v, dout in hopattn's layout
    ((batch, seqlen, heads, d), or packed (total, heads, d) for varlen; v and dout with the last
    dim hdim_v), leaves requiring grad, and with sinks the float32 (heads,) sink logits, N(0, 1),
    also requiring grad."""

    def __init__(self, torch, p, seed=0, device="cuda"):
        # e4m3 inputs are the bf16 ones rounded (no descale), without grad: FP8 has a forward only.
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.bfloat16}[p.dtype]
        gen = torch.Generator(device=device).manual_seed(seed)
        lead = (sum(p.lengths),) if p.varlen else (p.batch, p.seqlen)

        def randn(heads, dim):
            return torch.randn(*lead, heads, dim, device=device, dtype=dt, generator=gen)

        # In this order, so that q and k of a problem with its own hdim_v equal those of the problem
        # with hdim_v = hdim.
        self.q = randn(p.heads, p.hdim).requires_grad_(True)
        self.k = randn(p.heads_kv, p.hdim).requires_grad_(True)
        self.v = randn(p.heads_kv, p.hdim_v).requires_grad_(True)
        self.dout = randn(p.heads, p.hdim_v)
        # Drawn after the others, so that q, k, v and dout equal those of the problem without sinks.
        self.sink = (torch.randn(p.heads, device=device, dtype=torch.float32, generator=gen).requires_grad_(True)
                     if p.sinks else None)
        if p.dtype == "e4m3":
            self.q, self.k, self.v = (x.detach().to(torch.float8_e4m3fn) for x in (self.q, self.k, self.v))
        self.cu = None
        if p.varlen:
            offsets = [0]
            for s in p.lengths:
                offsets.append(offsets[-1] + s)
            self.cu = torch.tensor(offsets, dtype=torch.int32, device=device)
            self.max_seqlen = max(p.lengths)

    def inputs(self):
        """The tensors the backward differentiates: q, k, v and the sinks when there are any."""
        return (self.q, self.k, self.v) + ((self.sink,) if self.sink is not None else ())


# Each peer: name -> function(torch, p, t, deterministic) returning a forward callable that gives
# the output in hopattn's layout, or raising Unsupported.

class Unsupported(Exception):
    pass


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def mask_options(p, t):
    """Keywords for the problem's window, sinks and softcap, in the names hopattn and FlashAttention-4
    share (window_size, learnable_sink, softcap; FlashAttention-3 takes window_size and softcap);
    none without them, so that a plain problem's call stays the same."""
    options = {}
    if p.window != (-1, -1):
        options["window_size"] = p.window
    if t.sink is not None:
        options["learnable_sink"] = t.sink
    if p.softcap:
        options["softcap"] = float(p.softcap)
    return options


def make_hopattn(torch, p, t, deterministic, **options):
    """hopattn's call on the problem's tensors; `options` are further keywords of hopattn.attention
    (window_size, learnable_sink and softcap from mask_options; num_splits, pack_gqa: the decode layout)."""
    import hopattn

    if p.varlen:
        return lambda: hopattn.attention_varlen(t.q, t.k, t.v, t.cu, t.cu, t.max_seqlen, t.max_seqlen, causal=p.causal,
                                                deterministic=deterministic, **options)
    return lambda: hopattn.attention(t.q, t.k, t.v, causal=p.causal, deterministic=deterministic, **options)


SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "fa2": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def _make_sdpa(backend_name):
    def make(torch, p, t, deterministic):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if deterministic:
            raise Unsupported("no deterministic flag")
        if p.sinks or p.window != (-1, -1) or p.softcap:
            raise Unsupported("SDPA has no attention sinks, sliding window or softcap")
        backend = getattr(SDPBackend, SDPA_BACKENDS[backend_name])
        sdpa = torch.nn.functional.scaled_dot_product_attention
        gqa = {"enable_gqa": True} if p.heads != p.heads_kv else {}
        if p.varlen:  # nested jagged tensors: (batch, j, heads, d) -> (batch, heads, j, d)
            offsets = t.cu.long()

            def nt(x):
                return torch.nested.nested_tensor_from_jagged(x, offsets, max_seqlen=t.max_seqlen).transpose(1, 2)

            def fwd():
                with sdpa_kernel(backend):
                    return sdpa(nt(t.q), nt(t.k), nt(t.v), is_causal=p.causal, **gqa).transpose(1, 2).values()
        else:
            def fwd():
                with sdpa_kernel(backend):
                    out = sdpa(t.q.transpose(1, 2), t.k.transpose(1, 2), t.v.transpose(1, 2), is_causal=p.causal, **gqa)
                return out.transpose(1, 2)
        return fwd
    return make


def make_fa3(torch, p, t, deterministic):
    import flash_attn_interface as fa3

    if p.sinks:
        raise Unsupported("FlashAttention-3 takes no attention sinks")
    # window_size (with -1 for an unbounded side, as in hopattn) and softcap, both flash_attn_func's
    # and flash_attn_varlen_func's keywords, forward and backward.
    window = mask_options(p, t)
    if p.varlen:
        return lambda: _first(fa3.flash_attn_varlen_func(t.q, t.k, t.v, t.cu, t.cu, t.max_seqlen, t.max_seqlen,
                                                          causal=p.causal, deterministic=deterministic, **window))
    return lambda: _first(fa3.flash_attn_func(t.q, t.k, t.v, causal=p.causal, deterministic=deterministic, **window))


def make_fa4(torch, p, t, deterministic):
    """FlashAttention-4 (flash-attn-4 4.0.0b36): its flash_attn_func and flash_attn_varlen_func take
    window_size and a float32 learnable_sink, and their Hopper backward returns the sink's gradient.
    They take softcap too; the backward with a cap may be unsupported (an error, logged) or ignore
    the cap, which the check reports (the softcap table then shows no ratio for it)."""
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    options = mask_options(p, t)
    if deterministic:
        options["deterministic"] = True
    if p.varlen:
        return lambda: _first(flash_attn_varlen_func(t.q, t.k, t.v, cu_seqlens_q=t.cu, cu_seqlens_k=t.cu,
                                                     max_seqlen_q=t.max_seqlen, max_seqlen_k=t.max_seqlen,
                                                     causal=p.causal, **options))
    return lambda: _first(flash_attn_func(t.q, t.k, t.v, causal=p.causal, **options))


PEERS = {"cudnn": _make_sdpa("cudnn"), "fa2": _make_sdpa("fa2"), "efficient": _make_sdpa("efficient"),
         "fa3": make_fa3, "fa4": make_fa4}


def peer_available(name):
    try:
        if name == "fa3":
            import flash_attn_interface  # noqa: F401
        elif name == "fa4":
            import flash_attn.cute  # noqa: F401
    except Exception:
        return False
    return True


# ---- correctness: FA3's rule on one batch element and one KV-head group, float64 reference ----

def _sequence_takes(p, t):
    """For each sequence of the batch, take(x, heads): its rows of x at those heads, (s, ...)."""
    if p.varlen:
        cu = t.cu.tolist()
        return [(lambda x, h, a=a, b=b: x[a:b, h]) for a, b in zip(cu[:-1], cu[1:])]
    return [(lambda x, h, b=b: x[b, :, h]) for b in range(p.batch)]


def _subset(p, t):
    """Index helpers for the checked slice: the last sequence and the last KV-head group."""
    group = p.heads // p.heads_kv
    kvh = p.heads_kv - 1
    qh = slice(kvh * group, (kvh + 1) * group)
    return _sequence_takes(p, t)[-1], qh, kvh


def _visible(torch, rows, seqlen, causal, window):
    """(len(rows), seqlen) bool: the keys each query row in `rows` (an index tensor) sees in a square
    problem (seqlen_q == seqlen_k, no bottom-right shift): i - left <= j <= i + right, causal being
    right = 0 and -1 an unbounded side; None when nothing is masked."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    offset = torch.arange(seqlen, device=rows.device)[None, :] - rows[:, None]  # j - i
    visible = torch.ones_like(offset, dtype=torch.bool)
    if right >= 0:
        visible &= offset <= right
    if left >= 0:
        visible &= offset >= -left
    return visible


def _cap(torch, scores, softcap):
    """The capped scores softcap * tanh(scores / softcap) (docs/semantics.md), in scores' dtype: in
    float64 for the reference; for the naive computation the bf16/fp16 score is capped in float32
    and rounded once to its dtype, as hopattn's GPU reference rounds the capped score when it
    computes the naive error (hopattn-bench), so the cap adds one rounding of the score to the naive
    error, forward and, through autograd, backward. softcap 0: the scores unchanged."""
    if not softcap:
        return scores
    wide = torch.float64 if scores.dtype == torch.float64 else torch.float32
    return (softcap * torch.tanh(scores.to(wide) / softcap)).to(scores.dtype)


def _attention_slice(torch, q, k, v, dout, causal, dtype, window=(-1, -1), sink=None, softcap=0, p_dtype=None):
    """q: (s, G, d), k: (s, d), v: (s, dv), dout: (s, G, dv) in `dtype` (float64: the reference, else
    the naive low-precision computation); window: hopattn's window_size; sink: None or the G heads'
    logits, one more column of every row's softmax whose probability is then dropped (the sink has
    no value, docs/semantics.md); softcap: the score cap (0: none), applied to scale * q.k before the
    mask (_cap). The scale is 1 / sqrt(d), Q's head dim whatever V's, as hopattn's, FlashAttention's
    and SDPA's default. Returns out (s, G, dv) and dq, dk, dv, computed one query head at a time.
    p_dtype: P's rounding before P V where it is not `dtype`'s (FP8's naive computation, as
    FlashAttention-3's tests: the scores in O's dtype, P in e4m3); then the forward only (None
    gradients)."""
    q, k, v, dout = (x.detach().to(dtype) for x in (q, k, v, dout))
    s, heads, d = q.shape
    scale = 1.0 / math.sqrt(d)  # Q's head dim, not V's
    mask = _visible(torch, torch.arange(s, device=q.device), k.shape[0], causal, window)
    softmax_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # naive: as FA3's tests, in float32
    kk, vv = k.clone().requires_grad_(True), v.clone().requires_grad_(True)
    outs, dqs = [], []
    for h in range(heads):
        qq = q[:, h].clone().requires_grad_(True)
        scores = _cap(torch, (qq @ kk.transpose(0, 1)) * scale, softcap)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        scores = scores.to(softmax_dtype)
        if sink is not None:
            column = sink[h].detach().to(softmax_dtype).expand(s, 1)
            probs = torch.softmax(torch.cat([scores, column], dim=1), dim=-1)[:, :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        if p_dtype is not None:
            outs.append(probs.detach().to(p_dtype).to(dtype) @ vv.detach())
            continue
        out = probs.to(dtype) @ vv
        out.backward(dout[:, h])
        outs.append(out.detach())
        dqs.append(qq.grad)
        del scores, probs, out
    if p_dtype is not None:
        return torch.stack(outs, 1), None, None, None
    return torch.stack(outs, 1), torch.stack(dqs, 1), kk.grad, vv.grad


# Query rows per block of the sink gradient's float64 reference: 2048 x 16k scores are 256 MiB.
SINK_CHECK_ROWS = 2048


def _sink_gradient(torch, p, t, qh, kvh, out=None):
    """(exact, naive, slack): d loss / d sink of the query heads qh (one KV-head group) by the closed
    form of docs/semantics.md, dsink_h = -sum_i exp(sink_h - LSE_i) * D_i, D_i = rowsum(dO_i * O_i), over
    every row of every sequence: unlike dq, dk and dv, the sink's gradient sums over the whole batch,
    so the checked slice alone cannot give it. LSE from the problem's scores (softcap, mask, the
    scale from Q's head dim); O is `out`, an implementation's forward output in hopattn's layout, or
    with None the exact output. exact: in float64; naive: O rounded to the inputs' dtype, the rest
    (scores, LSE, shares, D, sums) in float32, dsink's dtype; slack: float32's rounding of the terms'
    magnitudes summed, 8 * eps * sum_i |share_i * D_i| per head, which the float32 sums of an
    implementation in its own order (per tile, then across tiles) may add: the float32 formula alone,
    summed by torch, was 4x closer to the exact one than a correct kernel on the H100 (d64 causal,
    128-key window, 8 x 2k), 9.5e-7 on a dsink of 2.2.

    Checker.check takes either definition (_dsink_pair): FlashAttention's backward computes D from the
    O its forward stored, so its dsink is the float32 formula on that O (checked tightly, O itself by
    the forward rule), while an implementation that differentiates its output exactly (autograd of a
    float32 computation) is closest to the formula on the exact O. A bound from the exact O alone, the
    earlier rule, failed a correct kernel on 6 of 24 sink rows by 1.0-2.8x (H100): the kernel's O
    errors, from P rounded to bf16 in P V, do not cancel over thousands of rows as independent
    roundings of O do."""
    sink64 = t.sink.detach()[qh].double()
    sink32 = sink64.float()
    exact = torch.zeros_like(sink64)
    naive = torch.zeros_like(sink32)
    mass = torch.zeros_like(sink64)
    for take in _sequence_takes(p, t):
        q, dout = (take(x, qh).detach().double() for x in (t.q, t.dout))
        k, v = (take(x, kvh).detach().double() for x in (t.k, t.v))
        stored = take(out, qh).detach().double() if out is not None else None
        s, group, d = q.shape
        for start in range(0, s, SINK_CHECK_ROWS):
            stop = min(s, start + SINK_CHECK_ROWS)
            mask = _visible(torch, torch.arange(start, stop, device=q.device), s, p.causal, p.window)
            for g in range(group):
                for wide, total, sink in ((torch.float64, exact, sink64), (torch.float32, naive, sink32)):
                    scores = _cap(torch, (q[start:stop, g].to(wide) @ k.to(wide).transpose(0, 1)) / math.sqrt(d),
                                  p.softcap)
                    if mask is not None:
                        scores = scores.masked_fill(~mask, float("-inf"))
                    lse = torch.logaddexp(torch.logsumexp(scores, dim=-1), sink[g])
                    o = stored[start:stop, g] if stored is not None else torch.exp(scores - lse[:, None]).double() @ v
                    if wide != torch.float64:
                        o = o.to(t.q.dtype)
                    share = torch.exp(sink[g] - lse)  # the sink's probability in each row
                    terms = share * (dout[start:stop, g].to(wide) * o.to(wide)).sum(-1)
                    total[g] -= terms.sum()
                    if wide == torch.float64:
                        mass[g] += terms.abs().sum()
                    del scores, o
    return exact, naive, 8 * torch.finfo(torch.float32).eps * mass.max().item()


def _rule(torch, got, exact, naive, slack=0.0):
    """(ok, error, bound) of FA3's rule: max|got - exact| <= 2 * max|naive - exact| + atol, atol =
    2 * the rounding error of adding and removing 0.3 in the low-precision dtype, plus `slack`."""
    got64 = got.double()
    if not torch.isfinite(got64).all():
        return False, float("inf"), 0.0
    lo = naive.dtype
    atol = 2 * ((exact.to(lo) + 0.3 - 0.3).double() - exact).abs().max().item()
    error = (got64 - exact).abs().max().item()
    bound = 2 * (naive.double() - exact).abs().max().item() + atol + slack
    return error <= bound, error, bound


class Checker:
    """The float64 reference and naive low-precision results of one problem's checked slice (and,
    with sinks, of the sink's gradient), with the problem's window, sinks and softcap."""

    def __init__(self, torch, p, t):
        self.torch, self.p, self.t = torch, p, t
        take, self.qh, self.kvh = _subset(p, t)
        self.take = take
        args = (take(t.q, self.qh), take(t.k, self.kvh), take(t.v, self.kvh), take(t.dout, self.qh))
        sink = t.sink.detach()[self.qh] if t.sink is not None else None
        self.exact = _attention_slice(torch, *args, p.causal, torch.float64, p.window, sink, p.softcap)
        if p.dtype == "e4m3":  # FP8's naive computation: e4m3 inputs (exact in bf16), S in bf16, P in e4m3
            self.naive = _attention_slice(torch, *args, p.causal, torch.bfloat16, p.window, sink, p.softcap,
                                          p_dtype=torch.float8_e4m3fn)
        else:
            self.naive = _attention_slice(torch, *args, p.causal, t.q.dtype, p.window, sink, p.softcap)
        self.dsink = None  # (exact, naive) from the exact O, at the first backward check with sinks

    def _dsink_pair(self, got, out):
        """The (exact, naive) dsink that `got` is checked against: from the stored output `out` when
        FA3's rule holds there, else from the exact O (_sink_gradient says why either)."""
        torch = self.torch
        stored = _sink_gradient(torch, self.p, self.t, self.qh, self.kvh, out)
        if _rule(torch, got, *stored)[0]:
            return stored
        if self.dsink is None:
            self.dsink = _sink_gradient(torch, self.p, self.t, self.qh, self.kvh)
        return self.dsink

    def check(self, direction, out=None, grads=None):
        """'pass' or a message; out: forward output, grads: (dq, dk, dv[, dsink]) in hopattn's layout."""
        torch, take = self.torch, self.take
        if direction == "fwd":
            pairs = [("out", take(out, self.qh), self.exact[0], self.naive[0])]
        else:
            dq, dk, dv = grads[:3]
            pairs = [("dq", take(dq, self.qh), self.exact[1], self.naive[1]),
                     ("dk", take(dk, self.kvh), self.exact[2], self.naive[2]),
                     ("dv", take(dv, self.kvh), self.exact[3], self.naive[3])]
            if self.p.sinks:  # dsink may be checked on the stored O, so O is checked with it
                pairs.append(("out", take(out, self.qh), self.exact[0], self.naive[0]))
                pairs.append(("dsink", grads[3][self.qh], *self._dsink_pair(grads[3][self.qh], out)))
        failures = []
        for name, got, *reference in pairs:
            ok, error, bound = _rule(torch, got, *reference)
            if not ok:
                failures.append(f"{name} error {error:.3g} > bound {bound:.3g}")
        return "pass" if not failures else "FAIL: " + "; ".join(failures)


# ---- timing ----

def run_problem(torch, p, a, impls, log, device="cuda"):
    """Rows of every impl and direction of one problem (device: "cpu" in the tests, with stand-ins)."""
    t = Tensors(torch, p, seed=a.seed, device=device)
    checker = Checker(torch, p, t) if not a.no_check else None
    rows = []
    variants = []  # (direction, deterministic)
    if "fwd" in a.direction:
        variants.append(("fwd", False))
    if "bwd" in a.direction:
        variants.append(("bwd", False))
        if not a.no_deterministic:
            variants.append(("bwd", True))
    for impl in impls:
        for direction, det in variants:
            if det and impl not in ("hopattn", "fa3", "fa4"):
                continue
            if p.dtype == "e4m3" and direction == "bwd":  # FP8 has a forward only
                continue
            if impl == "cudnn" and p.varlen and direction == "bwd":
                # SDPA's cuDNN backward on nested (jagged) tensors returned inf gradients and then an
                # illegal memory access, which poisons the CUDA context for every later row (torch
                # 2.11, cuDNN 9.19, H200, 2026-12-02); varlen backward rows compare with FA2/FA3.
                log(f"  {impl} {direction}: skipped (cuDNN nested-tensor backward is broken in this setup)")
                continue
            try:
                if impl == "hopattn":
                    fwd = make_hopattn(torch, p, t, det, **mask_options(p, t))
                else:
                    fwd = PEERS[impl](torch, p, t, det)
                out = fwd()
                if direction == "fwd":
                    fn, grads = fwd, None
                else:
                    inputs = t.inputs()  # with sinks, their gradient is part of the timed backward
                    grads = torch.autograd.grad(out, inputs, t.dout, retain_graph=True)
                    fn = functools.partial(torch.autograd.grad, out, inputs, t.dout, retain_graph=True)
                check = checker.check(direction, out=out, grads=grads) if checker else "skipped"
                del grads
            except Unsupported as e:
                log(f"  {impl} {direction}{' det' if det else ''}: not supported ({e})")
                continue
            except Exception as e:  # a peer that rejects the problem (shape, GQA, varlen, dtype)
                log(f"  {impl} {direction}{' det' if det else ''}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                if impl == "hopattn":
                    rows.append(p.row(impl, direction, det, None, check=f"error: {type(e).__name__}: {e}"[:500]))
                continue
            if check != "pass" and check != "skipped":
                log(f"  {impl} {direction}{' det' if det else ''} {p.describe()}: {check}")
                if impl == "hopattn":  # a mismatch is reported and not timed
                    rows.append(p.row(impl, direction, det, None, check=check))
                    continue
            ms, reps = gpu_timing.median_ms(torch, fn, a.warmup, a.reps, a.budget_s)
            rows.append(p.row(impl, direction, det, ms, check=check, reps=reps))
            del out, fn, fwd
    del checker, t
    torch.cuda.empty_cache()
    return rows


def _git_commit():
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except Exception:
        return None


def _driver():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.splitlines()[0].strip()
    except Exception:
        return None


def _version(dist_names, module=None):
    from importlib import metadata

    for name in dist_names:
        try:
            return metadata.version(name)
        except Exception:
            pass
    if module is not None:
        try:
            mod = __import__(module, fromlist=["__version__"])
            return getattr(mod, "__version__", "importable, version unknown")
        except Exception:
            pass
    return None


def environment(torch, impls):
    import datetime

    import hopattn

    peers = {}
    if "fa3" in impls:
        peers["fa3"] = _version(["flash_attn_3", "flash-attn-3", "flash_attn_interface"], "flash_attn_interface")
    if "fa4" in impls:
        peers["fa4"] = _version(["flash-attn-4", "flash_attn_4", "flash-attn-cute"], "flash_attn")
    try:
        from hopattn import _capi

        library, library_commit = _capi.library_version(), _capi.library_commit()
    except Exception:
        library = library_commit = None
    return {"date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(), "driver": _driver(),
            "cuda": torch.version.cuda, "torch": torch.__version__, "cudnn": str(torch.backends.cudnn.version()),
            "hopattn": getattr(hopattn, "__version__", None), "hopattn_library": library,
            "hopattn_library_commit": library_commit, "peers": peers,
            "commit": _git_commit(), "command": "python3 bench/compare.py " + " ".join(sys.argv[1:])}


def progress(items, desc):
    try:
        from tqdm import tqdm

        return tqdm(items, desc=desc, dynamic_ncols=True), (lambda msg: tqdm.write(msg, file=sys.stderr))
    except ImportError:
        def simple():
            for i, item in enumerate(items):
                print(f"[{i + 1}/{len(items)}] {desc}: {getattr(item, 'describe', lambda: item)()}", file=sys.stderr,
                      flush=True)
                yield item
        return simple(), (lambda msg: print(msg, file=sys.stderr, flush=True))


def measure_all(problems, desc, env, json_path, measure):
    """The rows of every problem (measure(problem, log) -> rows), with a progress bar. The JSON
    {"env", "rows"} is rewritten after every problem, so that a crash keeps what was measured;
    env gains "seconds"."""
    rows = []
    bar, log = progress(problems, desc)
    started = time.time()

    def save():
        with open(json_path, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)

    for p in bar:
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(p.describe())
        rows += measure(p, log)
        save()
    env["seconds"] = round(time.time() - started, 1)
    save()
    return rows


def _ints(text):
    return [int(x) for x in text.split(",") if x]


def _words(choices):
    def parse(text):
        words = [x for x in text.split(",") if x]
        bad = [w for w in words if w not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{','.join(bad)} not among {','.join(choices)}")
        return words
    return parse


def _causal(text):
    mapping = {"yes": True, "no": False, "true": True, "false": False, "1": True, "0": False, "both": None}
    values = []
    for word in text.split(","):
        if word.lower() not in mapping:
            raise argparse.ArgumentTypeError(f"--causal takes yes, no or both, not {word}")
        v = mapping[word.lower()]
        values += [False, True] if v is None else [v]
    return sorted(set(values))


def _softcap_value(text):
    """--softcap's cap: a positive finite number (0 would be no cap: leave the option out)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--softcap takes a positive number, not {text}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"--softcap takes a positive finite cap (leave it out for none), "
                                         f"not {text}")
    return value


def _hdim_pairs(text):
    """--hdim-pairs: QKxV head-dim pairs, comma separated ('192x128,128x64'), V's differing from QK's
    (equal ones are the sweep's own problems: --hdims)."""
    pairs = []
    for word in (w for w in text.split(",") if w):
        match = re.fullmatch(r"(\d+)x(\d+)", word.strip())
        if not match or 0 in (int(match[1]), int(match[2])):
            raise argparse.ArgumentTypeError(f"--hdim-pairs takes QKxV head dims such as 192x128, not {word}")
        pair = (int(match[1]), int(match[2]))
        if pair[0] == pair[1]:
            raise argparse.ArgumentTypeError(f"--hdim-pairs {word}: equal head dims are the sweep's problems "
                                             f"(--hdims {pair[0]})")
        if pair not in pairs:
            pairs.append(pair)
    return pairs


def _window_left(text):
    left = int(text)
    if left < 0:
        raise argparse.ArgumentTypeError(f"--window takes the window's left size, >= 0, not {text}")
    return left


def run_parser():
    parser = argparse.ArgumentParser(prog="compare.py run", description="Time hopattn and its peers on the same "
                                     "tensors (needs PyTorch, a Hopper GPU and the hopattn package).")
    parser.add_argument("--json", required=True, help="output JSON (docs/benchmarking.md schema)")
    parser.add_argument("--report-dir", help="also write the report (markdown + PNGs) there")
    parser.add_argument("--report-name", default=None, help="report file stem (default: the JSON's stem)")
    parser.add_argument("--hdims", type=_ints, default=list(SWEEP_HEADDIMS), help="default 64,96,128,192,256")
    parser.add_argument("--seqlens", type=_ints, default=list(SWEEP_SEQLENS), help="default 512,...,16384")
    parser.add_argument("--causal", type=_causal, default=[False, True], help="yes, no or both (default)")
    parser.add_argument("--direction", type=_words(["fwd", "bwd"]), default=["fwd", "bwd"], help="fwd,bwd (default)")
    parser.add_argument("--dtype", type=_words(["bf16", "fp16", "e4m3"]), default=["bf16", "fp16"],
                        help="bf16,fp16 (default); e4m3: FP8 inputs, forward only, beside bf16 in the FP8 table")
    parser.add_argument("--peers", type=_words(list(PEERS)), default=list(PEERS),
                        help="cudnn,fa2,efficient,fa3,fa4 (default: all; fa3/fa4 only when importable)")
    parser.add_argument("--extra", type=_words(["gqa", "varlen"]), default=["gqa", "varlen"],
                        help="extra row families beyond the standard sweep: gqa,varlen (default both; '' for none)")
    parser.add_argument("--no-deterministic", action="store_true", help="skip the deterministic backward rows")
    parser.add_argument("--sinks", action="store_true", help="also time every problem with attention sinks "
                        "(learnable_sink: N(0,1) logits per query head; hopattn and FA4, the others have none)")
    parser.add_argument("--window", type=_window_left, default=None, metavar="LEFT",
                        help="also time every causal problem with the sliding window (LEFT, 0)")
    parser.add_argument("--softcap", type=_softcap_value, default=None, metavar="VALUE",
                        help="also time every problem (window and sink copies included) with the scores capped, "
                        "softcap * tanh(scale * q.k / softcap) (hopattn, FA3 and FA4; SDPA has no cap)")
    parser.add_argument("--hdim-pairs", type=_hdim_pairs, default=[], metavar="QKxV[,...]",
                        help="also time sweep problems whose V, O, dO and dV have their own head dim: 192x128 is "
                        "hdim 192 (Q, K, and the heads: hidden // 192) with hdim_v 128; with --hdims 192 too, the "
                        "report puts each beside the d192 problem (default: none)")
    parser.add_argument("--no-check", action="store_true", help="time without the float64 check (not for reports)")
    parser.add_argument("--quick", action="store_true", help="one row per panel (seqlen nearest 4k), fewer reps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--budget-s", type=float, default=3.0, help="stop timing one measurement after this many "
                        "seconds (at least 3 reps): the reference backward kernels are slow")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def torch_with_hopattn(command):
    """PyTorch on a Hopper GPU with the hopattn package importable (an installed package wins, else
    the source tree with $HOPATTN_LIBRARY); otherwise exits saying what `command` is missing."""
    try:
        import torch
    except ImportError:
        sys.exit(f"{command}: needs PyTorch (and a Hopper GPU and the hopattn package)")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        sys.exit(f"{command}: needs an NVIDIA Hopper GPU (sm_90)")
    try:
        import hopattn  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "python"))
        try:
            import hopattn  # noqa: F401
        except ImportError as e:
            sys.exit(f"{command}: the hopattn package is not importable ({e}); `pip install .` first")
    return torch


def parse_run_args(argv):
    parser = run_parser()
    a = parser.parse_args(argv)
    if a.window is not None and True not in a.causal:
        parser.error("--window adds windowed copies of the causal problems: select some with --causal yes or both")
    return a


def run_main(argv):
    a = parse_run_args(argv)
    if a.quick:
        a.warmup, a.reps, a.budget_s = min(a.warmup, 1), min(a.reps, 5), min(a.budget_s, 0.5)
    torch = torch_with_hopattn("compare.py run")

    impls = ["hopattn"] + [p for p in a.peers if peer_available(p)]
    skipped = [p for p in a.peers if p not in impls]
    if skipped:
        print(f"compare.py: not importable, skipped: {', '.join(skipped)}", file=sys.stderr)
    problems = build_problems(a)
    env = environment(torch, impls)
    rows = measure_all(problems, "problems", env, a.json, lambda p, log: run_problem(torch, p, a, impls, log))
    failed = [r for r in rows if r["impl"] == "hopattn" and r.get("check") not in ("pass", "skipped")]
    print(f"compare.py: {len(rows)} rows in {env['seconds']} s -> {a.json}; hopattn mismatches/errors: {len(failed)}",
          file=sys.stderr)
    if a.report_dir:
        name = a.report_name or Path(a.json).stem
        for path in write_report([a.json], a.report_dir, name):
            print(path)
    return 1 if failed else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("run", "report", "decode", "chunked_prefill"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "report":
        report_main(argv[1:])
        return 0
    if argv[0] == "decode":
        import decode  # bench/; imported here, not at the top, because it imports this module

        return decode.main(argv[1:])
    if argv[0] == "chunked_prefill":
        import chunked_prefill  # bench/, imported here for the same reason

        return chunked_prefill.main(argv[1:])
    return run_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
