"""Chunked prefill: each sequence of a batch brings a chunk of new query tokens (512 to 4k) that
attends, causally, to its whole KV cache (8k to 32k keys, the chunk's own keys last), hopattn on a
contiguous and on a paged cache, beside FlashAttention-2 (PyTorch SDPA) on the contiguous one.

    python3 bench/compare.py chunked_prefill --json OUT.json [--report-dir DIR] [--quick] [subset options]

A problem is a batch of sequences (default 4), query / KV heads 32/8, head dim 128, bf16: sequence
b has q_b query tokens, drawn from [seqlen_q / 2, seqlen_q], which are the last of its k_b keys,
drawn from [max(q_b, seqlen_k / 2), seqlen_k] (seeded: the same lengths for every page size of a
shape). Defaults: seqlen_q 1024 and 4096, seqlen_k 16384 and 32768, so the chunks span 512-4k
tokens and the caches 8k-32k. The causal mask is bottom-right aligned per sequence (query i of a
chunk sees keys up to i + k_b - q_b). hopattn is called as

    hopattn.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True)

on packed contiguous K/V (page size 0) and with cu_seqlens_k None, seqused_k = the k_b and
page_table= on pages of 16, 64 and 256 keys (a shuffled page table). SDPA has no varlen call with a
bottom-right mask, so FA2 runs one call per sequence (causal_lower_right), all in one CUDA graph,
their outputs concatenated; it takes no paged cache. TFLOP/s = 4 * head dim * heads * the causally
visible (query, key) pairs, counted exactly, / GPU time from CUDA-graph replays. Every output is
checked first with FA3's rule against a float64 reference of the last sequence's last KV-head
group, which reads the paged cache through its page table; a hopattn mismatch is reported and not
timed. The JSON is compare.py's file layout with rows of "mode": "chunked_prefill"
(docs/benchmarking.md).

Nothing here imports torch at module level: the problem list, FLOP counts, rows and the table are
usable (and tested) without PyTorch or a GPU.
"""
import argparse
import functools
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  (bench/, beside this file)
import decode  # noqa: E402

PEERS = ("fa2",)
DEFAULT_SEQLENS_Q = (1024, 4096)
DEFAULT_SEQLENS_K = (16384, 32768)
DEFAULT_BATCHES = (4,)
DEFAULT_HEADS = ((32, 8),)
DEFAULT_HDIMS = (128,)
DEFAULT_PAGE_SIZES = (0, 16, 64, 256)
# --quick keeps, of each selected list, the values nearest these: the longest chunks and caches.
QUICK_TARGETS = {"seqlens_q": (4096,), "seqlens_k": (32768,)}
# Query rows per block of the reference: a block's float64 scores against 32k keys take
# 512 * group * 32k * 8 bytes (512 MiB at a group of 4) instead of 4 GiB for a 4k chunk at once.
CHECK_ROWS = 512


# --------------------------------------------------------------------------------------------
# Problems, rows and the table (no torch)
# --------------------------------------------------------------------------------------------

def visible_pairs(seqlen_q, seqlen_k):
    """(query, key) pairs a bottom-right causal mask lets through, seqlen_q <= seqlen_k: query i
    sees keys 0 .. i + seqlen_k - seqlen_q."""
    return seqlen_q * seqlen_k - seqlen_q * (seqlen_q - 1) // 2


def _offsets(lengths):
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return offsets


class Problem:
    """One chunked-prefill problem: sequence b has lengths_q[b] query tokens, the last of its
    lengths_k[b] keys; packed q (total_q, heads, hdim), the cache packed (total_k, heads_kv, hdim)
    (page_size 0) or paged ((num_pages, page_size, heads_kv, hdim) and a page table). seqlen_q and
    seqlen_k are the nominal (largest possible) lengths the lengths were drawn under."""

    def __init__(self, dtype, hdim, heads, heads_kv, seqlen_q, seqlen_k, lengths_q, lengths_k, page_size=0):
        if any(q > k for q, k in zip(lengths_q, lengths_k)):
            raise ValueError("a chunk's query tokens are among its keys: lengths_q <= lengths_k")
        self.dtype, self.hdim, self.heads, self.heads_kv = dtype, hdim, heads, heads_kv
        self.seqlen_q, self.seqlen_k, self.page_size = seqlen_q, seqlen_k, page_size
        self.lengths_q, self.lengths_k = list(lengths_q), list(lengths_k)
        self.batch = len(self.lengths_q)

    @classmethod
    def sampled(cls, dtype, hdim, heads, heads_kv, batch, seqlen_q, seqlen_k, page_size, seed):
        """Lengths drawn from a generator seeded by (seed, batch, seqlen_q, seqlen_k) alone, so that
        every page size, dtype and head shape of these lengths gets the same sequences."""
        rng = random.Random(f"{seed}/{batch}/{seqlen_q}/{seqlen_k}")
        lengths_q, lengths_k = [], []
        for _ in range(batch):
            q = min(rng.randint(max(1, seqlen_q // 2), seqlen_q), seqlen_k)
            lengths_q.append(q)
            lengths_k.append(rng.randint(max(q, seqlen_k // 2), seqlen_k))
        return cls(dtype, hdim, heads, heads_kv, seqlen_q, seqlen_k, lengths_q, lengths_k, page_size)

    def flops(self):
        return 4 * self.hdim * self.heads * sum(visible_pairs(q, k) for q, k in zip(self.lengths_q, self.lengths_k))

    def cache_bytes(self):
        """What the K and V caches (and the page table) take in memory: whole pages."""
        per_key = 2 * self.heads_kv * self.hdim * decode.ELEMENT_BYTES[self.dtype]
        if not self.page_size:
            return sum(self.lengths_k) * per_key
        pages = [math.ceil(k / self.page_size) for k in self.lengths_k]
        return sum(pages) * self.page_size * per_key + 4 * self.batch * max(pages)

    def q_bytes(self):
        """Bytes of q, and of each output."""
        return sum(self.lengths_q) * self.heads * self.hdim * decode.ELEMENT_BYTES[self.dtype]

    def copies(self):
        """How many copies of the inputs the replays cycle through (decode.COLD_BYTES)."""
        return max(1, math.ceil(decode.COLD_BYTES / (self.cache_bytes() + self.q_bytes())))

    def check_bytes(self):
        """The reference of one sequence and KV-head group, CHECK_ROWS query rows at a time: its K and
        V in float64, a few float64 score matrices of a block."""
        group = self.heads // self.heads_kv
        longest = max(self.lengths_k)
        return 8 * (2 * longest * self.hdim + 4 * CHECK_ROWS * group * longest)

    def memory_needed(self, calls):
        """Device bytes at the peak: every copy's inputs, one output per copy and timed call (FA2's
        per-sequence outputs and their concatenation: two), and the check."""
        copies = self.copies()
        return copies * (self.cache_bytes() + self.q_bytes()) + 2 * len(calls) * copies * self.q_bytes() \
            + self.check_bytes()

    def fits(self, calls, free_bytes):
        return self.memory_needed(calls) <= decode.MEMORY_SHARE * free_bytes

    @classmethod
    def of_row(cls, row):
        return cls(row["dtype"], row["hdim"], row["heads"], row["heads_kv"], row["seqlen_q"], row["seqlen_k"],
                   row["seqlens_q"], row["seqlens_k"], row["page_size"])

    def row(self, impl, ms, check, reps=None):
        return {"mode": "chunked_prefill", "page_size": self.page_size, "impl": impl, "direction": "fwd",
                "dtype": self.dtype, "hdim": self.hdim, "causal": True, "batch": self.batch, "heads": self.heads,
                "heads_kv": self.heads_kv, "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k,
                "seqlens_q": self.lengths_q, "seqlens_k": self.lengths_k, "total_q": sum(self.lengths_q),
                "total_k": sum(self.lengths_k), "ms": ms, "tflops": self.flops() / (ms * 1e9) if ms else None,
                "check": check, "reps": reps}

    def describe(self):
        paged = f" page{self.page_size}" if self.page_size else ""
        return (f"{self.dtype} d{self.hdim} h{self.heads}/{self.heads_kv} b{self.batch} "
                f"q{min(self.lengths_q)}-{max(self.lengths_q)} k{min(self.lengths_k)}-{max(self.lengths_k)}{paged}")


def calls_of(p, peers):
    """The impls timed on one problem: hopattn, and the peers on a contiguous cache."""
    return ["hopattn", *peers] if not p.page_size else ["hopattn"]


def build_problems(a):
    """Every selected shape, each followed by its paged problems (a.page_sizes, sorted: 0 first)."""
    lists = {name: getattr(a, name) for name in ("seqlens_q", "seqlens_k")}
    if a.quick:
        lists = {name: decode.nearest(values, QUICK_TARGETS[name]) for name, values in lists.items()}
    return [Problem.sampled(dtype, hdim, heads, heads_kv, batch, seqlen_q, seqlen_k, page_size, a.seed)
            for dtype in a.dtype for hdim in a.hdims for heads, heads_kv in a.heads for batch in a.batches
            for seqlen_q in lists["seqlens_q"] for seqlen_k in lists["seqlens_k"] for page_size in a.page_sizes]


def shape_key(row):
    """The problem's shape and lengths, whatever its cache layout."""
    return (row["dtype"], row["hdim"], row["heads"], row["heads_kv"], row["batch"], row["seqlen_q"],
            row["seqlen_k"], tuple(row["seqlens_q"]), tuple(row["seqlens_k"]))


def _tflops(row):
    return f"{row['tflops']:.0f}" if row and row.get("tflops") else ""


def markdown_table(rows, peers=PEERS):
    """Markdown: one line per shape with a hopattn row: TFLOP/s of hopattn on the contiguous cache,
    of the peers (and hopattn / each peer that passed its check), of hopattn at each page size and
    its ratio to the contiguous row; then per page size the geomean and least ratio, and the rows
    that were not timed."""
    by_shape = {}
    for row in rows:
        if row.get("mode") == "chunked_prefill":
            by_shape.setdefault(shape_key(row), {})[(row["impl"], row["page_size"])] = row
    by_shape = {k: v for k, v in by_shape.items() if any(impl == "hopattn" for impl, _ in v)}
    pages = sorted({page for v in by_shape.values() for _, page in v if page})
    header = ["dtype", "d", "heads", "batch", "query tokens", "keys", "TFLOP", "hopattn"] + list(peers)
    header += [f"hopattn / {peer}" for peer in peers]
    for page in pages:
        header += [f"page {page}", f"page {page} / contiguous"]
    lines = []
    ratios = {page: [] for page in pages}
    for key in sorted(by_shape):
        impl_rows = by_shape[key]
        dtype, hdim, heads, heads_kv, batch, _, _, lengths_q, lengths_k = key
        contiguous = impl_rows.get(("hopattn", 0))
        flops = Problem.of_row(next(iter(impl_rows.values()))).flops()
        cells = [dtype, str(hdim), f"{heads}/{heads_kv}", str(batch), f"{min(lengths_q)}-{max(lengths_q)}",
                 f"{min(lengths_k)}-{max(lengths_k)}", f"{flops / 1e12:.2f}",
                 _tflops(contiguous) or ("not timed" if contiguous else "")]
        peer_ratios = []
        for peer in peers:
            row = impl_rows.get((peer, 0))
            cells.append(_tflops(row) + ("" if row is None or decode.passed(row) else " (check failed)"))
            ok = row and row.get("tflops") and decode.passed(row) and contiguous and contiguous.get("tflops")
            peer_ratios.append(f"{contiguous['tflops'] / row['tflops']:.3f}" if ok else "")
        cells += peer_ratios
        for page in pages:
            row = impl_rows.get(("hopattn", page))
            if row is None or not row.get("tflops"):
                cells += ["not timed" if row else "", ""]
                continue
            cells.append(_tflops(row))
            if contiguous and contiguous.get("tflops"):
                ratios[page].append(row["tflops"] / contiguous["tflops"])
                cells.append(f"{ratios[page][-1]:.3f}")
            else:
                cells.append("")
        lines.append(cells)
    out = decode.table_lines(header, lines) + [""]
    summary = [[str(page), str(len(r)), f"{compare.geomean(r):.3f}", f"{min(r):.3f}"]
               for page, r in ratios.items() if r]
    if summary:
        out += decode.table_lines(["page size", "rows", "geomean paged / contiguous", "min paged / contiguous"],
                                  summary) + [""]
    untimed = [r for r in rows if r["impl"] == "hopattn" and not r.get("tflops")]
    if untimed:
        out += ["Not timed (check failed or error):", ""]
        out += [f"- {Problem.of_row(r).describe()}: {r.get('check', '?')}" for r in untimed] + [""]
    return "\n".join(out)


def write_report(json_path, out_dir, name):
    """Writes out_dir/name.md from one result file of `compare.py chunked_prefill`; returns its path."""
    return decode.write_mode_report(
        json_path, out_dir, name, "chunked prefill",
        "TFLOP/s = 4 * head dim * heads * the causally visible (query, key) pairs (bottom-right per sequence, "
        "counted exactly) / GPU time of one call, from CUDA-graph replays. TFLOP is one call's work; 'page P / "
        "contiguous' is hopattn on pages of P keys / hopattn on the packed cache.", markdown_table)


# --------------------------------------------------------------------------------------------
# Timing part (PyTorch, a Hopper GPU, the hopattn package)
# --------------------------------------------------------------------------------------------

class Tensors:
    """One copy of a problem's inputs, without grad: q (total_q, heads, d) packed with cu_seqlens_q;
    the cache packed (k, v: (total_k, heads_kv, d), cu_seqlens_k; page_table and seqused_k None) or
    paged (k, v: pages, page_table (batch, max_pages) and seqused_k int32; cu_seqlens_k None)."""

    def __init__(self, torch, p, seed, device="cuda"):
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[p.dtype]
        gen = torch.Generator(device=device).manual_seed(seed)

        def randn(tokens, heads):
            return torch.randn(tokens, heads, p.hdim, device=device, dtype=dt, generator=gen)

        def int32(values):
            return torch.tensor(values, dtype=torch.int32, device=device)

        self.lengths_k = p.lengths_k
        self.offsets_q, self.offsets_k = _offsets(p.lengths_q), _offsets(p.lengths_k)
        self.max_seqlen_q, self.max_seqlen_k = max(p.lengths_q), max(p.lengths_k)
        self.q = randn(self.offsets_q[-1], p.heads)
        self.cu_seqlens_q = int32(self.offsets_q)
        if p.page_size:
            self.k, self.v, self.page_table = decode.paged_cache(torch, p.lengths_k, p.page_size, p.heads_kv, p.hdim,
                                                                 dt, gen, device)
            self.cu_seqlens_k, self.seqused_k = None, int32(p.lengths_k)
        else:
            self.k, self.v = randn(self.offsets_k[-1], p.heads_kv), randn(self.offsets_k[-1], p.heads_kv)
            self.cu_seqlens_k, self.seqused_k, self.page_table = int32(self.offsets_k), None, None

    def logical_kv(self, b, head):
        """K and V of sequence b and one KV head, (k_b, d), in key order."""
        if self.page_table is None:
            keys = slice(self.offsets_k[b], self.offsets_k[b + 1])
            return self.k[keys, head], self.v[keys, head]
        return tuple(decode.gather_pages(x, self.page_table[b], self.lengths_k[b], head) for x in (self.k, self.v))


def reference_out(torch, q, k, v, dtype):
    """decode.reference_out of one chunk (q (q_b, G, d) the last of k_b keys, bottom-right causal),
    CHECK_ROWS query rows at a time: rows [start, stop) see keys up to stop - 1 + k_b - q_b, so a
    block is the bottom-right aligned problem of its rows against those keys."""
    shift = k.shape[0] - q.shape[0]
    return torch.cat([decode.reference_out(torch, q[start:start + CHECK_ROWS], k[:start + CHECK_ROWS + shift],
                                           v[:start + CHECK_ROWS + shift], True, dtype)
                      for start in range(0, q.shape[0], CHECK_ROWS)])


class Checker:
    """FA3's rule (compare._rule) on the output of the last sequence's last KV-head group, all its
    query rows, against the logical cache (read through the page table when paged)."""

    def __init__(self, torch, p, t):
        self.torch = torch
        group = p.heads // p.heads_kv
        self.heads = slice(p.heads - group, p.heads)
        self.rows = slice(t.offsets_q[-2], t.offsets_q[-1])
        args = (t.q[self.rows, self.heads], *t.logical_kv(p.batch - 1, p.heads_kv - 1))
        self.exact = reference_out(torch, *args, torch.float64)
        self.naive = reference_out(torch, *args, t.q.dtype)

    def check(self, out):
        ok, error, bound = compare._rule(self.torch, out[self.rows, self.heads], self.exact, self.naive)
        return "pass" if ok else f"FAIL: out error {error:.3g} > bound {bound:.3g}"


def make_hopattn(t):
    import hopattn

    if t.page_table is None:
        return lambda: hopattn.attention_varlen(t.q, t.k, t.v, t.cu_seqlens_q, t.cu_seqlens_k, t.max_seqlen_q,
                                                t.max_seqlen_k, causal=True)
    return lambda: hopattn.attention_varlen(t.q, t.k, t.v, t.cu_seqlens_q, None, t.max_seqlen_q, t.max_seqlen_k,
                                            causal=True, seqused_k=t.seqused_k, page_table=t.page_table)


def make_fa2(torch, p, t):
    """SDPA's FlashAttention-2 backend, one call per sequence with a bottom-right causal mask (SDPA's
    nested-tensor varlen path has only the top-left is_causal), on views of the packed tensors; the
    outputs are concatenated into hopattn's packed layout (a copy of q's size: well under 1% of the
    time of these problems)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    def view(x, offsets, b):  # (tokens, heads, d) -> (1, heads, tokens, d)
        return x[offsets[b]:offsets[b + 1]].unsqueeze(0).transpose(1, 2)

    pieces = [(view(t.q, t.offsets_q, b), view(t.k, t.offsets_k, b), view(t.v, t.offsets_k, b),
               causal_lower_right(p.lengths_q[b], p.lengths_k[b])) for b in range(p.batch)]
    gqa = {"enable_gqa": True} if p.heads != p.heads_kv else {}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            outs = [sdpa(q, k, v, attn_mask=mask, **gqa) for q, k, v, mask in pieces]
        return torch.cat([out[0].transpose(0, 1) for out in outs])
    return fwd


def _build(torch, p, impl, copies):
    if impl == "hopattn":
        return [make_hopattn(t) for t in copies]
    return [make_fa2(torch, p, t) for t in copies]


def _row(p, impl, ms, check, reps):
    return p.row(impl, ms, check=check, reps=reps)


def run_problem(torch, p, a, calls, log, device="cuda"):
    """Rows of every impl of one problem: checked on the first copy of the inputs, timed on all."""
    copies = [Tensors(torch, p, seed=a.seed + i, device=device) for i in range(p.copies())]
    checker = Checker(torch, p, copies[0]) if not a.no_check else None
    rows = []
    for impl in calls:
        result = decode.measure(torch, a, f"{impl} {p.describe()}", impl == "hopattn",
                                functools.partial(_build, torch, p, impl, copies),
                                checker.check if checker else decode.unchecked, functools.partial(_row, p, impl), log)
        if result is not None:
            rows.append(result)
    del checker, copies
    torch.cuda.empty_cache()
    return rows


def _csv(values):
    return ",".join(map(str, values))


def parser():
    parser = argparse.ArgumentParser(prog="compare.py chunked_prefill", description="Time chunked prefill (varlen "
                                     "query chunks attending causally to their KV caches) of hopattn on contiguous "
                                     "and paged caches, beside FlashAttention-2 (needs PyTorch, a Hopper GPU and the "
                                     "hopattn package).")
    parser.add_argument("--json", required=True, help="output JSON (docs/benchmarking.md)")
    parser.add_argument("--report-dir", help="also write the markdown table there, as <the JSON's stem>.md")
    parser.add_argument("--seqlens-q", type=compare._ints, default=list(DEFAULT_SEQLENS_Q),
                        help=f"longest query chunk; each sequence's is drawn from [n/2, n] (default "
                        f"{_csv(DEFAULT_SEQLENS_Q)})")
    parser.add_argument("--seqlens-k", type=compare._ints, default=list(DEFAULT_SEQLENS_K),
                        help=f"longest cache, chunk included; each sequence's is drawn from [n/2, n] (default "
                        f"{_csv(DEFAULT_SEQLENS_K)})")
    parser.add_argument("--batches", type=compare._ints, default=list(DEFAULT_BATCHES),
                        help=f"sequences per call (default {_csv(DEFAULT_BATCHES)})")
    parser.add_argument("--heads", type=decode._head_pairs, default=list(DEFAULT_HEADS),
                        help="query/KV head pairs (default " + ",".join(f"{h}/{kv}" for h, kv in DEFAULT_HEADS) + ")")
    parser.add_argument("--hdims", type=compare._ints, default=list(DEFAULT_HDIMS),
                        help=f"default {_csv(DEFAULT_HDIMS)}")
    parser.add_argument("--page-sizes", type=decode.page_sizes, default=list(DEFAULT_PAGE_SIZES),
                        help=f"KV cache layouts: 0 packed contiguous, n > 0 pages of n keys (default "
                        f"{_csv(DEFAULT_PAGE_SIZES)})")
    parser.add_argument("--dtype", type=compare._words(["bf16", "fp16"]), default=["bf16"], help="bf16 (default),fp16")
    parser.add_argument("--peers", type=compare._words(list(PEERS)), default=list(PEERS),
                        help=f"default {_csv(PEERS)} ('' for none)")
    parser.add_argument("--no-check", action="store_true", help="time without the float64 check (not for reports)")
    parser.add_argument("--quick", action="store_true", help="the longest chunks and caches only (seqlen_q nearest "
                        "4096, seqlen_k nearest 32768) at the selected page sizes, fewer replays")
    parser.add_argument("--warmup", type=int, default=3, help="calls before the graph capture (default 3)")
    parser.add_argument("--reps", type=int, default=20, help=f"graph replays per measurement; the time is the "
                        f"median of {decode.MEASUREMENTS} measurements (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the lengths and the tensors")
    return parser


def main(argv):
    a = parser().parse_args(argv)
    return decode.run_mode(a, argv, "chunked_prefill", build_problems, lambda p: calls_of(p, a.peers), run_problem,
                           ("hopattn",), markdown_table, write_report)
