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
the implementations that have one (hopattn, FA3, FA4). Forward and backward are timed with autograd
on (inputs require grad), the backward as torch.autograd.grad of one retained forward output, GPU
time only (bench/gpu_timing.py). Before timing, every output
(hopattn's and each peer's) is checked with FA3's rule against a float64 reference on one batch
element and one KV-head group of the same tensors: error <= 2 * the naive low-precision error +
atol. A hopattn mismatch is reported and not timed. The JSON follows docs/benchmarking.md.

`report` reads JSON files of one run (e.g. hopattn-bench --json plus bench/peers_sdpa.py --json, or
one file of `run`) and writes NAME.md (TFLOP/s per implementation and hopattn/peer ratios per row,
geomean per panel) and NAME-<direction>-<dtype>[-gqaH-HKV|-varlen].png plots in the style of the
FlashAttention papers (grouped bars per seqlen, one panel per head dim x causal).

`decode` (bench/decode.py) times decode attention, a few query rows against a long KV cache
(contiguous or paged, and the step that appends a key with rotary embedding), in TB/s.

`chunked_prefill` (bench/chunked_prefill.py) times varlen query chunks attending causally to their
KV caches, contiguous or paged, in TFLOP/s.

Nothing here imports torch or matplotlib at module level: the report part runs on any machine
with matplotlib, and the module imports anywhere.
"""
import argparse
import json
import functools
import math
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

def kind_of(row):
    """'varlen', 'gqa H/HKV' or '' (plain multi-head attention)."""
    if row.get("varlen"):
        return "varlen"
    heads, heads_kv = row["heads"], row.get("heads_kv", row["heads"])
    return f"gqa {heads}/{heads_kv}" if heads_kv != heads else ""


def row_key(row):
    """Identity of a problem: rows of different impls with equal keys were timed on the same problem."""
    return (row["direction"], bool(row.get("deterministic", False)), row["dtype"], kind_of(row), row["hdim"],
            bool(row["causal"]), row.get("window_left", -1), row.get("window_right", -1), row["batch"],
            row["heads"], row.get("heads_kv", row["heads"]), row["seqlen_q"], row["seqlen_k"],
            row.get("total_q"), row.get("total_k"))


def panel_of(key):
    """(direction label, dtype, kind, hdim, causal, window) of a row key: one plot panel."""
    direction, det, dtype, kind, hdim, causal, wl, wr = key[:8]
    return (direction + (" det" if det else ""), dtype, kind, hdim, causal, (wl, wr))


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


def panel_label(panel):
    direction, dtype, kind, hdim, causal, (wl, wr) = panel
    parts = [direction, dtype]
    if kind:
        parts.append(kind)
    parts.append(f"d{hdim}")
    parts.append("causal" if causal else "non-causal")
    if (wl, wr) != (-1, -1):
        parts.append(f"window ({wl},{wr})")
    return " ".join(parts)


def sort_key(key):
    direction, det, dtype, kind, hdim, causal = key[:6]
    return ({"fwd": 0, "bwd": 1}.get(direction, 2), det, dtype, kind, hdim, causal, key[6:8], key[11], key[8:])


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
        shape = f"{ours['batch']} x {seqlen}" + (" (varlen)" if ours.get("varlen") else "")
        cells = [panel[0], panel[1], panel[2] or "mha", str(panel[3]), "yes" if panel[4] else "no", shape,
                 f"{ours['tflops']:.0f}"]
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
    """{(direction label, dtype, kind, window): {(hdim, causal): {seqlen: {impl: tflops}}}}."""
    groups = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for key, impl_rows in by_key.items():
        direction, dtype, kind, hdim, causal, window = panel_of(key)
        for impl, row in impl_rows.items():
            groups[(direction, dtype, kind, window)][(hdim, causal)][row["seqlen_q"]][impl] = row["tflops"]
    return groups


def figure_name(name, group):
    direction, dtype, kind, (wl, wr) = group
    parts = [name, direction.replace(" ", "-"), dtype]
    if kind:  # 'varlen', or 'gqa64-8' for 'gqa 64/8'
        parts.append(kind.replace(" ", "").replace("/", "-"))
    if (wl, wr) != (-1, -1):
        parts.append(f"window{wl}_{wr}")
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
    direction, dtype, kind, (wl, wr) = group
    gpu = next((e.get("gpu") for e in envs if e.get("gpu")), "GPU ?")
    what = {"fwd": "forward", "bwd": "backward", "bwd det": "deterministic backward"}.get(direction, direction)
    extra = f", {kind}" if kind else ""
    if (wl, wr) != (-1, -1):
        extra += f", window ({wl},{wr})"
    return f"Attention {what} speed, {dtype}{extra}, {gpu}"


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
    md += ["", "TFLOP/s = FLOPs / median time (forward 4 * batch * heads * seqlen_q * seqlen_k * head dim, halved "
               "for causal; backward 2.5x); ratios are hopattn / peer from the same run.", ""]
    md += [f"![{p.stem}]({p.name})" for p in pngs]
    md += ["", markdown_table(by_key, peers=peers, long_from=long_from)]
    untimed = [r for r in rows if r.get("tflops") is None]
    if untimed:
        md += ["Not timed (check failed or error):", ""]
        md += [f"- {r['impl']} {r['direction']}{' det' if r.get('deterministic') else ''} {r['dtype']} d{r['hdim']} "
               f"{'causal' if r['causal'] else 'non-causal'} {r['batch']} x {r['seqlen_q']} h{r['heads']}/"
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

class Problem:
    """One attention problem. Fixed length: q (batch, seqlen, heads, hdim). Varlen: lengths, packed."""

    def __init__(self, dtype, hdim, causal, batch, seqlen, heads, heads_kv, lengths=None):
        self.dtype, self.hdim, self.causal = dtype, hdim, causal
        self.batch, self.seqlen, self.heads, self.heads_kv = batch, seqlen, heads, heads_kv
        self.lengths = lengths  # varlen: per-sequence lengths (seqlen_q == seqlen_k), seqlen = nominal mean

    @property
    def varlen(self):
        return self.lengths is not None

    @property
    def panel(self):
        kind = "varlen" if self.varlen else (f"gqa {self.heads}/{self.heads_kv}" if self.heads != self.heads_kv else "")
        return (self.dtype, kind, self.hdim, self.causal)

    def fwd_flops(self):
        lens = self.lengths if self.varlen else [self.seqlen] * self.batch
        return sum(4 * self.heads * s * s * self.hdim for s in lens) / (2 if self.causal else 1)

    def row(self, impl, direction, deterministic, ms, **extra):
        flops = self.fwd_flops() * (2.5 if direction == "bwd" else 1.0)
        row = {"impl": impl, "direction": direction, "dtype": self.dtype, "hdim": self.hdim, "causal": self.causal,
               "window_left": -1, "window_right": -1, "batch": self.batch, "heads": self.heads,
               "heads_kv": self.heads_kv, "seqlen_q": self.seqlen, "seqlen_k": self.seqlen, "varlen": self.varlen,
               "deterministic": deterministic, "ms": ms, "tflops": flops / (ms * 1e9) if ms else None}
        if self.varlen:
            row["total_q"] = row["total_k"] = sum(self.lengths)
            row["max_seqlen"] = max(self.lengths)
        row.update(extra)
        return row

    def describe(self):
        kind = self.panel[1]
        return (f"{self.dtype} d{self.hdim} {'causal' if self.causal else 'full'} {kind + ' ' if kind else ''}"
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
    problems = []
    for dtype in a.dtype:
        for hdim in a.hdims:
            for causal in a.causal:
                for s in a.seqlens:
                    problems.append(Problem(dtype, hdim, causal, SWEEP_TOKENS // s, s, SWEEP_HIDDEN // hdim,
                                            SWEEP_HIDDEN // hdim))
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
    return problems


class Tensors:
    """Inputs of one problem, shared by every implementation: q, k, v, dout in hopattn's layout
    ((batch, seqlen, heads, d), or packed (total, heads, d) for varlen), leaves requiring grad."""

    def __init__(self, torch, p, seed=0, device="cuda"):
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[p.dtype]
        gen = torch.Generator(device=device).manual_seed(seed)
        lead = (sum(p.lengths),) if p.varlen else (p.batch, p.seqlen)

        def randn(heads):
            return torch.randn(*lead, heads, p.hdim, device=device, dtype=dt, generator=gen)

        self.q = randn(p.heads).requires_grad_(True)
        self.k = randn(p.heads_kv).requires_grad_(True)
        self.v = randn(p.heads_kv).requires_grad_(True)
        self.dout = randn(p.heads)
        self.cu = None
        if p.varlen:
            offsets = [0]
            for s in p.lengths:
                offsets.append(offsets[-1] + s)
            self.cu = torch.tensor(offsets, dtype=torch.int32, device=device)
            self.max_seqlen = max(p.lengths)


# Each peer: name -> function(torch, p, t, deterministic) returning a forward callable that gives
# the output in hopattn's layout, or raising Unsupported.

class Unsupported(Exception):
    pass


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def make_hopattn(torch, p, t, deterministic, **options):
    """hopattn's call on the problem's tensors; `options` are further keywords of hopattn.attention
    (num_splits, pack_gqa: the decode layout)."""
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

    if p.varlen:
        return lambda: _first(fa3.flash_attn_varlen_func(t.q, t.k, t.v, t.cu, t.cu, t.max_seqlen, t.max_seqlen,
                                                          causal=p.causal, deterministic=deterministic))
    return lambda: _first(fa3.flash_attn_func(t.q, t.k, t.v, causal=p.causal, deterministic=deterministic))


def make_fa4(torch, p, t, deterministic):
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    det = {"deterministic": True} if deterministic else {}
    if p.varlen:
        return lambda: _first(flash_attn_varlen_func(t.q, t.k, t.v, cu_seqlens_q=t.cu, cu_seqlens_k=t.cu,
                                                     max_seqlen_q=t.max_seqlen, max_seqlen_k=t.max_seqlen,
                                                     causal=p.causal, **det))
    return lambda: _first(flash_attn_func(t.q, t.k, t.v, causal=p.causal, **det))


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

def _subset(p, t):
    """Index helpers for the checked slice: the last sequence and the last KV-head group."""
    group = p.heads // p.heads_kv
    kvh = p.heads_kv - 1
    qh = slice(kvh * group, (kvh + 1) * group)
    if p.varlen:
        start, stop = int(t.cu[-2]), int(t.cu[-1])
        return (lambda x, h: x[start:stop, h]), qh, kvh
    return (lambda x, h: x[-1, :, h]), qh, kvh


def _attention_slice(torch, q, k, v, dout, causal, dtype):
    """q: (s, G, d), k, v: (s, d) in `dtype` (float64: the reference, else the naive low-precision
    computation); returns out (s, G, d) and dq, dk, dv, computed one query head at a time."""
    q, k, v, dout = (x.detach().to(dtype) for x in (q, k, v, dout))
    s, heads, d = q.shape
    scale = 1.0 / math.sqrt(d)
    mask = torch.ones(s, k.shape[0], dtype=torch.bool, device=q.device).tril_() if causal else None
    kk, vv = k.clone().requires_grad_(True), v.clone().requires_grad_(True)
    outs, dqs = [], []
    for h in range(heads):
        qq = q[:, h].clone().requires_grad_(True)
        scores = (qq @ kk.transpose(0, 1)) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores.float() if dtype != torch.float64 else scores, dim=-1).to(dtype) @ vv
        out.backward(dout[:, h])
        outs.append(out.detach())
        dqs.append(qq.grad)
        del scores, out
    return torch.stack(outs, 1), torch.stack(dqs, 1), kk.grad, vv.grad


def _rule(torch, got, exact, naive):
    """(ok, error, bound) of FA3's rule: max|got - exact| <= 2 * max|naive - exact| + atol, atol =
    2 * the rounding error of adding and removing 0.3 in the low-precision dtype."""
    got64 = got.double()
    if not torch.isfinite(got64).all():
        return False, float("inf"), 0.0
    lo = naive.dtype
    atol = 2 * ((exact.to(lo) + 0.3 - 0.3).double() - exact).abs().max().item()
    error = (got64 - exact).abs().max().item()
    bound = 2 * (naive.double() - exact).abs().max().item() + atol
    return error <= bound, error, bound


class Checker:
    """The float64 reference and naive low-precision results of one problem's checked slice."""

    def __init__(self, torch, p, t):
        self.torch, self.p, self.t = torch, p, t
        take, self.qh, self.kvh = _subset(p, t)
        self.take = take
        args = (take(t.q, self.qh), take(t.k, self.kvh), take(t.v, self.kvh), take(t.dout, self.qh))
        self.exact = _attention_slice(torch, *args, p.causal, torch.float64)
        self.naive = _attention_slice(torch, *args, p.causal, t.q.dtype)

    def check(self, direction, out=None, grads=None):
        """'pass' or a message; out: forward output, grads: (dq, dk, dv) in hopattn's layout."""
        torch, take = self.torch, self.take
        if direction == "fwd":
            pairs = [("out", take(out, self.qh), 0)]
        else:
            dq, dk, dv = grads
            pairs = [("dq", take(dq, self.qh), 1), ("dk", take(dk, self.kvh), 2), ("dv", take(dv, self.kvh), 3)]
        failures = []
        for name, got, i in pairs:
            ok, error, bound = _rule(torch, got, self.exact[i], self.naive[i])
            if not ok:
                failures.append(f"{name} error {error:.3g} > bound {bound:.3g}")
        return "pass" if not failures else "FAIL: " + "; ".join(failures)


# ---- timing ----

def run_problem(torch, p, a, impls, log):
    """Rows of every impl and direction of one problem."""
    t = Tensors(torch, p, seed=a.seed)
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
            if impl == "cudnn" and p.varlen and direction == "bwd":
                # SDPA's cuDNN backward on nested (jagged) tensors returned inf gradients and then an
                # illegal memory access, which poisons the CUDA context for every later row (torch
                # 2.11, cuDNN 9.19, H200, 2026-12-02); varlen backward rows compare with FA2/FA3.
                log(f"  {impl} {direction}: skipped (cuDNN nested-tensor backward is broken in this setup)")
                continue
            try:
                fwd = (make_hopattn if impl == "hopattn" else PEERS[impl])(torch, p, t, det)
                out = fwd()
                if direction == "fwd":
                    fn, grads = fwd, None
                else:
                    inputs = (t.q, t.k, t.v)
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
    parser.add_argument("--dtype", type=_words(["bf16", "fp16"]), default=["bf16", "fp16"], help="bf16,fp16 (default)")
    parser.add_argument("--peers", type=_words(list(PEERS)), default=list(PEERS),
                        help="cudnn,fa2,efficient,fa3,fa4 (default: all; fa3/fa4 only when importable)")
    parser.add_argument("--extra", type=_words(["gqa", "varlen"]), default=["gqa", "varlen"],
                        help="extra row families beyond the standard sweep: gqa,varlen (default both; '' for none)")
    parser.add_argument("--no-deterministic", action="store_true", help="skip the deterministic backward rows")
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


def run_main(argv):
    a = run_parser().parse_args(argv)
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
