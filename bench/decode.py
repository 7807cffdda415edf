"""Decode attention: a few query rows per sequence against a long KV cache, hopattn beside PyTorch
SDPA's cuDNN and FlashAttention-2 backends on the same tensors, in one process.

    python3 bench/compare.py decode --json OUT.json [--report-dir DIR] [--quick] [subset options]

Decode reads the whole KV cache to produce a few rows of output: it is bound by memory, so the
metric is K+V bytes / GPU time in TB/s. Each call is captured in a CUDA graph and timed over many
replays (bench/gpu_timing.py), so that host overhead does not count. Rows: query length 1 (and 4,
16: speculative decoding), cache length 8k/32k/128k, batch 1/4/16/64, query / KV heads 32/8, 64/8
and 32/1, head dim 128, 64 and 256, bf16 (`--dtype e4m3`: FP8 caches, hopattn only), causal
(bottom-right aligned: every query row sees the cache up to its own position). Every output is
checked with FA3's rule against a float64 reference before it is timed; a hopattn mismatch is
reported and not timed. The JSON is compare.py's file layout with decode rows
(docs/benchmarking.md).

Each shape also runs on paged caches (page sizes 16, 64, 256, and 1 at the smallest cache length
only) through hopattn.attention_with_kvcache, whose TB/s the report sets beside hopattn's
contiguous row of the shape; and, at query length 1, as "append" rows: the decode step that also
writes one new key and value with rotary embedding, beside the same step without them.

Nothing here imports torch at module level: the problem list, byte counts, rows and the tables are
usable (and tested) without PyTorch or a GPU. bench/chunked_prefill.py uses the paged-cache, check
and timing helpers of this file.
"""
import argparse
import functools
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  (bench/, beside this file)
import gpu_timing  # noqa: E402

PEERS = ("cudnn", "fa2")
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "e4m3": 1}
DEFAULT_SEQLENS_Q = (1, 4, 16)
DEFAULT_SEQLENS_K = (8192, 32768, 131072)
DEFAULT_BATCHES = (1, 4, 16, 64)
DEFAULT_HEADS = ((32, 8), (64, 8), (32, 1))
DEFAULT_HDIMS = (128, 64, 256)
# 0 is the contiguous cache. Page 1 (every key on its own page, the worst case for gathering) runs
# only at the smallest selected cache length: its page table has one entry per key, and one size
# says whether it works and what it costs.
DEFAULT_PAGE_SIZES = (0, 1, 16, 64, 256)
# --quick keeps, of each selected list, the values nearest these.
QUICK_TARGETS = {"seqlens_q": (1, 4), "seqlens_k": (32768,), "batches": (1, 16), "hdims": (128,)}

# impl names of hopattn's calls: "hopattn" is hopattn.attention on a contiguous cache (the call of
# the first decode results, kept so that they stay comparable) and hopattn.attention_with_kvcache on
# a paged one (the only call that takes pages); "hopattn_kvcache" is attention_with_kvcache on the
# contiguous cache, which tells a paged row's cost of paging from that of the kvcache call.
OURS = ("hopattn", "hopattn_kvcache")
# Rotary tables: GPT-NeoX / Llama layout (rotary_interleaved=False) over the whole head dim.
ROTARY_BASE = 10000.0
# The paged table's summary gives the least TB/s of the rows with at least this much K+V: calls
# that stream enough bytes to reach full HBM speed, which a paged cache should keep.
LARGE_KV_BYTES = 256 << 20

# Replays cycle through copies of the inputs adding up to this much, several times the H200's L2, so
# that a replay reads its KV cache from HBM as a decode step does (between two steps of one layer,
# every other layer's cache goes through the L2); a small cache replayed alone would stay in the L2.
COLD_BYTES = 256 << 20
MEASUREMENTS = 5
# Of the free device memory, what a problem's tensors may take; the rest is for the implementations'
# workspaces, cuDNN's plans and the allocator's rounding.
MEMORY_SHARE = 0.85


# --------------------------------------------------------------------------------------------
# Problems, rows and the tables (no torch)
# --------------------------------------------------------------------------------------------

class Problem:
    """One decode problem: q (batch, seqlen_q, heads, hdim) against a KV cache of seqlen_k keys per
    sequence, contiguous (page_size 0: (batch, seqlen_k, heads_kv, hdim)) or paged ((num_pages,
    page_size, heads_kv, hdim) with a page table)."""

    varlen = False  # fixed-length tensors, for compare.make_hopattn

    def __init__(self, dtype, hdim, causal, batch, heads, heads_kv, seqlen_q, seqlen_k, page_size=0):
        self.dtype, self.hdim, self.causal, self.batch = dtype, hdim, causal, batch
        self.heads, self.heads_kv, self.seqlen_q, self.seqlen_k = heads, heads_kv, seqlen_q, seqlen_k
        self.page_size = page_size

    def kv_bytes(self):
        """What one call must read at least: the K and V caches."""
        return 2 * self.batch * self.seqlen_k * self.heads_kv * self.hdim * ELEMENT_BYTES[self.dtype]

    def cache_bytes(self):
        """What the K and V caches (and the page table) take in memory: whole pages."""
        if not self.page_size:
            return self.kv_bytes()
        pages = self.batch * math.ceil(self.seqlen_k / self.page_size)
        return 2 * pages * self.page_size * self.heads_kv * self.hdim * ELEMENT_BYTES[self.dtype] + 4 * pages

    def q_bytes(self):
        """Bytes of q, and of each output."""
        return self.batch * self.seqlen_q * self.heads * self.hdim * ELEMENT_BYTES[self.dtype]

    def copies(self):
        """How many copies of the inputs the replays cycle through (COLD_BYTES)."""
        return max(1, math.ceil(COLD_BYTES / (self.cache_bytes() + self.q_bytes())))

    def check_bytes(self):
        """The float64 reference of one batch element and KV-head group: K, V and a few score matrices."""
        group = self.heads // self.heads_kv
        return 8 * (2 * self.seqlen_k * self.hdim + 4 * self.seqlen_q * group * self.seqlen_k)

    def memory_needed(self, calls):
        """Device bytes the problem holds at its peak: every copy's inputs, one output per copy and
        timed call (a captured graph keeps its own), the rotary tables of the append rows, and the
        check."""
        copies = self.copies()
        rotary = self.seqlen_k * self.hdim * ELEMENT_BYTES[self.dtype]
        return (copies * (self.cache_bytes() + self.q_bytes()) + len(calls) * copies * self.q_bytes() + rotary
                + self.check_bytes())

    def fits(self, calls, free_bytes):
        return self.memory_needed(calls) <= MEMORY_SHARE * free_bytes

    @classmethod
    def of_row(cls, row):
        return cls(row["dtype"], row["hdim"], row["causal"], row["batch"], row["heads"], row["heads_kv"],
                   row["seqlen_q"], row["seqlen_k"], row.get("page_size", 0))

    def row(self, impl, ms, check, reps=None, append=False):
        """append: the step also wrote one new key and value, with rotary embedding (seqlen_k counts
        the new key: the step attends to seqlen_k keys either way)."""
        return {"mode": "decode", "page_size": self.page_size, "impl": impl, "direction": "fwd",
                "dtype": self.dtype, "hdim": self.hdim, "causal": self.causal, "batch": self.batch,
                "heads": self.heads, "heads_kv": self.heads_kv, "seqlen_q": self.seqlen_q,
                "seqlen_k": self.seqlen_k, "seqlen_new": 1 if append else 0, "rotary": append, "ms": ms,
                "tb_per_s": self.kv_bytes() / (ms * 1e9) if ms else None, "check": check, "reps": reps}

    def describe(self):
        paged = f" page{self.page_size}" if self.page_size else ""
        return (f"{self.dtype} d{self.hdim} {'causal' if self.causal else 'full'} h{self.heads}/{self.heads_kv} "
                f"b{self.batch} q{self.seqlen_q} k{self.seqlen_k}{paged}")


def kvcache_impl(p):
    """The impl name of hopattn.attention_with_kvcache on this problem's cache (see OURS)."""
    return "hopattn" if p.page_size else "hopattn_kvcache"


def calls_of(p, peers, append):
    """(impl, append) of every call timed on one problem's tensors, in order: on a contiguous cache
    hopattn's two calls and the peers (which take no paged cache), on a paged one hopattn's kvcache
    call; then, at query length 1, the kvcache call that appends a key with rotary embedding."""
    impls = ["hopattn", "hopattn_kvcache", *peers] if not p.page_size else ["hopattn"]
    calls = [(impl, False) for impl in impls]
    # FP8 caches take no rotary embedding yet: no append row for them.
    if append and p.seqlen_q == 1 and p.dtype != "e4m3":
        calls.append((kvcache_impl(p), True))
    return calls


def describe_row(row):
    text = f"{row['impl']} {Problem.of_row(row).describe()}"
    return text + (" +1 key, rotary" if row.get("seqlen_new") else "")


def nearest(values, targets):
    """Of `values` (in their order), those nearest in ratio to one of `targets`."""
    keep = {min(values, key=lambda v: abs(math.log2(v / t))) for t in targets}
    return [v for v in values if v in keep]


def build_problems(a):
    """Every selected shape, each followed by its paged problems (a.page_sizes, sorted: 0 first)."""
    lists = {name: getattr(a, name) for name in ("seqlens_q", "seqlens_k", "batches", "hdims")}
    if a.quick:
        lists = {name: nearest(values, QUICK_TARGETS[name]) for name, values in lists.items()}
    smallest_cache = min(lists["seqlens_k"])
    return [Problem(dtype, hdim, causal, batch, heads, heads_kv, seqlen_q, seqlen_k, page_size)
            for dtype in a.dtype for hdim in lists["hdims"] for causal in a.causal for heads, heads_kv in a.heads
            for seqlen_q in lists["seqlens_q"] for seqlen_k in lists["seqlens_k"] for batch in lists["batches"]
            for page_size in a.page_sizes if page_size != 1 or seqlen_k == smallest_cache]


def shape_key(row):
    """The problem's shape, whatever its cache layout."""
    return (row["dtype"], row["hdim"], bool(row["causal"]), row["heads"], row["heads_kv"], row["seqlen_q"],
            row["seqlen_k"], row["batch"])


def problem_key(row):
    """Identity of a problem: rows of different impls with equal keys were timed on the same tensors."""
    return shape_key(row) + (row.get("page_size", 0),)


def passed(row):
    return row.get("check") in ("pass", "skipped")


def _plain(row):
    """A row of the step that attends only (rows of files from before paging have no seqlen_new)."""
    return not row.get("seqlen_new")


def _tb(row):
    return f"{row['tb_per_s']:.2f}" if row and row.get("tb_per_s") else ""


def table_lines(header, lines):
    """A markdown table's lines: the header, its rule, one line per list of cells."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(c) + " |" for c in lines]


def _shape_cells(key):
    dtype, hdim, causal, heads, heads_kv, seqlen_q, seqlen_k, batch = key
    return [dtype, str(hdim), "yes" if causal else "no", f"{heads}/{heads_kv}", str(batch), str(seqlen_q),
            str(seqlen_k)]


def markdown_table(rows, peers=PEERS):
    """Markdown: one line per contiguous problem with a hopattn row (TB/s per impl, hopattn / the
    better peer that passed its check) and the geomean of that ratio."""
    by_key = {}
    for row in rows:
        if row.get("page_size", 0) == 0 and _plain(row):
            by_key.setdefault(shape_key(row), {})[row["impl"]] = row
    header = ["dtype", "d", "causal", "heads", "batch", "seqlen_q", "seqlen_k", "hopattn"] + list(peers)
    header += ["best peer", "hopattn / best"]
    lines, ratios = [], []
    for key in sorted(by_key):
        impl_rows = by_key[key]
        ours = impl_rows.get("hopattn")
        if ours is None:
            continue
        cells = _shape_cells(key) + [_tb(ours) or "not timed"]
        best = None
        for peer in peers:
            row = impl_rows.get(peer)
            if row is None or not row.get("tb_per_s"):
                cells.append("")
                continue
            cells.append(_tb(row) + ("" if passed(row) else " (check failed)"))
            if passed(row) and (best is None or row["tb_per_s"] > best["tb_per_s"]):
                best = row
        if best is not None and ours.get("tb_per_s"):
            ratio = ours["tb_per_s"] / best["tb_per_s"]
            ratios.append(ratio)
            cells += [best["impl"], f"{ratio:.3f}"]
        else:
            cells += ["", ""]
        lines.append(cells)
    out = table_lines(header, lines) + [""]
    if ratios:
        out += [f"Geomean of hopattn / best peer over {len(ratios)} rows: {compare.geomean(ratios):.3f}", ""]
    return "\n".join(out)


def paged_table(rows):
    """Markdown: one line per shape with a paged row: hopattn's contiguous TB/s (hopattn.attention and
    the kvcache call), each page size's TB/s and its ratio to the contiguous hopattn row; then per
    page size the geomean and least ratio, and the least TB/s of the rows with K+V >= 256 MiB."""
    by_shape = {}
    for row in rows:
        if _plain(row) and row["impl"] in OURS:
            by_shape.setdefault(shape_key(row), {})[(row["impl"], row.get("page_size", 0))] = row
    by_shape = {k: v for k, v in by_shape.items() if any(page for _, page in v)}
    if not by_shape:
        return ""
    pages = sorted({page for v in by_shape.values() for _, page in v if page})
    header = ["dtype", "d", "causal", "heads", "batch", "seqlen_q", "seqlen_k", "K+V MiB", "contiguous",
              "kvcache contiguous"]
    for page in pages:
        header += [f"page {page}", f"page {page} / contiguous"]
    lines = []
    ratios = {page: [] for page in pages}
    large_tb = {page: [] for page in pages}
    for key in sorted(by_shape):
        impl_rows = by_shape[key]
        contiguous = impl_rows.get(("hopattn", 0))
        kv_bytes = Problem.of_row(next(iter(impl_rows.values()))).kv_bytes()
        cells = _shape_cells(key) + [f"{kv_bytes / 2**20:.0f}", _tb(contiguous),
                                     _tb(impl_rows.get(("hopattn_kvcache", 0)))]
        for page in pages:
            row = impl_rows.get(("hopattn", page))
            if row is None:
                cells += ["", ""]
                continue
            if not row.get("tb_per_s"):
                cells += ["not timed", ""]
                continue
            cells.append(_tb(row))
            if kv_bytes >= LARGE_KV_BYTES:
                large_tb[page].append(row["tb_per_s"])
            if contiguous and contiguous.get("tb_per_s"):
                ratio = row["tb_per_s"] / contiguous["tb_per_s"]
                ratios[page].append(ratio)
                cells.append(f"{ratio:.3f}")
            else:
                cells.append("")
        lines.append(cells)
    out = table_lines(header, lines) + [""]
    summary = []
    for page in pages:
        r, tb = ratios[page], large_tb[page]
        summary.append([str(page), str(len(r)), f"{compare.geomean(r):.3f}" if r else "", f"{min(r):.3f}" if r else "",
                        str(len(tb)), f"{min(tb):.2f}" if tb else ""])
    out += table_lines(["page size", "rows", "geomean paged / contiguous", "min paged / contiguous",
                        f"rows with K+V >= {LARGE_KV_BYTES >> 20} MiB", "min TB/s there"], summary)
    return "\n".join(out + [""])


def append_table(rows):
    """Markdown: one line per problem with an append row: the kvcache call's TB/s without new keys,
    with one new key and rotary embedding, and their ratio; then the geomean and the least ratio."""
    by_key = {}
    for row in rows:
        if row["impl"] == kvcache_impl(Problem.of_row(row)):
            by_key.setdefault(problem_key(row), {})[bool(row.get("seqlen_new"))] = row
    lines, ratios = [], []
    for key in sorted(by_key):
        plain, appended = by_key[key].get(False), by_key[key].get(True)
        if appended is None:
            continue
        cells = _shape_cells(key[:-1]) + [str(key[-1]), _tb(plain), _tb(appended) or "not timed"]
        if plain and plain.get("tb_per_s") and appended.get("tb_per_s"):
            ratios.append(appended["tb_per_s"] / plain["tb_per_s"])
            cells.append(f"{ratios[-1]:.3f}")
        else:
            cells.append("")
        lines.append(cells)
    if not lines:
        return ""
    out = table_lines(["dtype", "d", "causal", "heads", "batch", "seqlen_q", "seqlen_k", "page size",
                       "attend only", "+1 key, rotary", "ratio"], lines) + [""]
    if ratios:
        out += [f"Append / attend only over {len(ratios)} rows: geomean {compare.geomean(ratios):.3f}, "
                f"min {min(ratios):.3f}", ""]
    return "\n".join(out)


def untimed_lines(rows):
    """Markdown list of hopattn's rows that were not timed (check failed or error)."""
    untimed = [r for r in rows if r["impl"] in OURS and not r.get("tb_per_s")]
    if not untimed:
        return ""
    return "\n".join(["Not timed (check failed or error):", ""]
                     + [f"- {describe_row(r)}: {r.get('check', '?')}" for r in untimed] + [""])


def report_markdown(rows, peers=PEERS):
    """Every table that has rows: contiguous decode against the peers, paged, append; then the rows
    not timed."""
    sections = [("", markdown_table(rows, peers)),
                ("## Paged KV cache\n\nhopattn.attention_with_kvcache on a paged cache (shuffled page table) "
                 "beside hopattn's contiguous rows of the same shape; ratios are paged TB/s / the contiguous "
                 "hopattn (hopattn.attention) TB/s.\n", paged_table(rows)),
                ("## Append: decode step with one new key and rotary embedding\n\nThe kvcache call that writes "
                 "one key and value per sequence (rotary over the whole head dim, GPT-NeoX layout) and attends, "
                 "beside the same call on the same cache that only attends; both attend to seqlen_k keys.\n",
                 append_table(rows)),
                ("", untimed_lines(rows))]
    return "\n".join(title + "\n" + body if title else body for title, body in sections if body)


def write_mode_report(json_path, out_dir, name, title, units, body):
    """Writes out_dir/name.md from one result file of a compare.py mode: a title, the runs'
    environment, what the units mean, then body(rows); returns its path."""
    rows, envs = compare.load_rows([json_path])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = [f"# hopattn {title}: {name}", "", f"Input: `{Path(json_path).name}`.", ""]
    md += compare.env_lines(envs)
    md += ["", units, "", body(rows)]
    path = out_dir / f"{name}.md"
    path.write_text("\n".join(md))
    return path


def write_report(json_path, out_dir, name):
    """Writes out_dir/name.md from one result file of `compare.py decode`; returns its path."""
    return write_mode_report(
        json_path, out_dir, name, "decode",
        "TB/s = K+V bytes (2 * batch * seqlen_k * heads_kv * head dim * element size) / GPU time of one call, "
        "from CUDA-graph replays; ratios are hopattn / the faster of the peers from the same run.", report_markdown)


# --------------------------------------------------------------------------------------------
# Timing part (PyTorch, a Hopper GPU, the hopattn package)
# --------------------------------------------------------------------------------------------

def paged_cache(torch, lengths, page_size, heads_kv, hdim, dtype, gen, device):
    """Random K and V pages (num_pages, page_size, heads_kv, hdim) holding sequences of `lengths`
    keys, and their page table (batch, max_pages) int32: a random permutation of the pages, so that
    a sequence's pages are scattered over the cache as an inference engine's become. Rows of a
    sequence's table past its pages hold page 0 (valid, never read); positions past a sequence's
    length in its last page hold random values too (finite, as the kernels ask)."""
    pages_of = [math.ceil(n / page_size) for n in lengths]
    num_pages = sum(pages_of)
    k, v = (torch.randn(num_pages, page_size, heads_kv, hdim, device=device, dtype=dtype, generator=gen)
            for _ in range(2))
    order = torch.randperm(num_pages, device=device, generator=gen).to(torch.int32)
    table = torch.zeros(len(lengths), max(pages_of), dtype=torch.int32, device=device)
    start = 0
    for b, n in enumerate(pages_of):
        table[b, :n] = order[start:start + n]
        start += n
    return k, v, table


def gather_pages(pages, table_row, length, head):
    """Keys (or values) [0, length) of one sequence and KV head, (length, hdim), read through its
    page table row: what the oracle sees."""
    return pages[table_row.long(), :, head].flatten(0, 1)[:length]


class Tensors:
    """One copy of a problem's inputs in hopattn's layout, (batch, seqlen, heads, d), without grad;
    the cache contiguous (k, v: (batch, seqlen_k, heads_kv, d), page_table None) or paged (k, v:
    pages, page_table: (batch, max_pages) int32). cache_seqlens: seqlen_k per sequence (int32), for
    the kvcache call."""

    def __init__(self, torch, p, seed, device="cuda"):
        # e4m3 inputs are bf16 ones rounded to float8_e4m3fn (no descale; out in bf16).
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.bfloat16}[p.dtype]
        gen = torch.Generator(device=device).manual_seed(seed)

        def randn(seqlen, heads):
            return torch.randn(p.batch, seqlen, heads, p.hdim, device=device, dtype=dt, generator=gen)

        self.q = randn(p.seqlen_q, p.heads)
        if p.page_size:
            self.k, self.v, self.page_table = paged_cache(torch, [p.seqlen_k] * p.batch, p.page_size, p.heads_kv,
                                                          p.hdim, dt, gen, device)
        else:
            self.k, self.v, self.page_table = randn(p.seqlen_k, p.heads_kv), randn(p.seqlen_k, p.heads_kv), None
        if p.dtype == "e4m3":
            self.q, self.k, self.v = (x.to(torch.float8_e4m3fn) for x in (self.q, self.k, self.v))
        self.seqlen_k = p.seqlen_k
        self.cache_seqlens = torch.full((p.batch,), p.seqlen_k, dtype=torch.int32, device=device)

    def logical_kv(self, b, head):
        """K and V of sequence b and one KV head, (seqlen_k, d), in key order."""
        if self.page_table is None:
            return self.k[b, :, head], self.v[b, :, head]
        return tuple(gather_pages(x, self.page_table[b], self.seqlen_k, head) for x in (self.k, self.v))

    def kv_at(self, position):
        """K and V at one position of every sequence, (batch, heads_kv, d)."""
        if self.page_table is None:
            return self.k[:, position], self.v[:, position]
        page_size = self.k.shape[1]
        pages = self.page_table[:, position // page_size].long()
        return self.k[pages, position % page_size], self.v[pages, position % page_size]


def rotate(torch, x, cos, sin, dtype):
    """Rotary embedding of x (..., d) by cos, sin (..., d/2), GPT-NeoX layout (entries i and
    i + d/2 form a pair): in float64 for the reference; else in float32 rounded once to `dtype`, as
    the library computes it (docs/semantics.md, "KV caches")."""
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    x, cos, sin = (y.to(compute) for y in (x, cos, sin))
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(dtype)


class AppendStep:
    """The inputs of a decode step that appends one key and value per sequence at position
    seqlen_k - 1 (cache_seqlens), rotated there by the rotary tables cos, sin (seqlen_k, d/2), which
    the copies of a problem share (a model has one). Every replay of a captured step writes the
    same slot, which changes nothing for the timing."""

    def __init__(self, torch, p, cos, sin, seed, device="cuda"):
        dt = cos.dtype
        gen = torch.Generator(device=device).manual_seed(seed)
        self.k_new, self.v_new = (torch.randn(p.batch, 1, p.heads_kv, p.hdim, device=device, dtype=dt, generator=gen)
                                  for _ in range(2))
        self.cos, self.sin = cos, sin
        self.position = p.seqlen_k - 1
        self.cache_seqlens = torch.full((p.batch,), self.position, dtype=torch.int32, device=device)

    @staticmethod
    def tables(torch, p, device="cuda"):
        """cos and sin (seqlen_k, d/2) in the problem's dtype: angle position * ROTARY_BASE^(-2i/d)."""
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[p.dtype]
        inv_freq = ROTARY_BASE ** (-torch.arange(0, p.hdim, 2, device=device, dtype=torch.float64) / p.hdim)
        angles = torch.arange(p.seqlen_k, device=device, dtype=torch.float64)[:, None] * inv_freq
        return angles.cos().to(dt), angles.sin().to(dt)

    def attended(self, torch, q, k, v, dtype):
        """What the step attends with, given q (1, G, d), and k, v (seqlen_k, d) of the cache before the
        step, of the last batch element and KV head: q and the new key rotated at the new position,
        the new key and value in the cache's last position, in `dtype` (see rotate)."""
        cos, sin = self.cos[self.position], self.sin[self.position]
        k_new = rotate(torch, self.k_new[-1, :, -1], cos, sin, dtype)
        v_new = self.v_new[-1, :, -1].to(dtype)
        return (rotate(torch, q, cos, sin, dtype), torch.cat([k[:self.position].to(dtype), k_new]),
                torch.cat([v[:self.position].to(dtype), v_new]))

    def check_slot(self, torch, t):
        """'pass' or a message: after the step, every sequence's cache holds the rotated new key (within
        one rounding of the float64 rotation) and the new value (exactly) at the new position."""
        k, v = t.kv_at(self.position)
        exact = rotate(torch, self.k_new[:, 0], self.cos[self.position], self.sin[self.position], torch.float64)
        eps = torch.finfo(k.dtype).eps
        error = ((k.double() - exact).abs() - eps * exact.abs()).max().item()
        if error > 1e-6:
            return f"FAIL: appended key off its rotation by {error:.3g} more than one rounding"
        if not torch.equal(v, self.v_new[:, 0]):
            return "FAIL: appended value differs from v"
        return "pass"


def reference_out(torch, q, k, v, causal, dtype, p_dtype=None):
    """q: (seqlen_q, G, d), k, v: (seqlen_k, d) of one batch element and KV head, computed in `dtype`
    (float64: the reference; else the naive low-precision computation of compare._attention_slice,
    which bounds the error; p_dtype: P's rounding there, e4m3 for FP8 inputs, as compare's). causal
    is bottom-right aligned: query i sees keys up to i + seqlen_k - seqlen_q. Returns out
    (seqlen_q, G, d)."""
    q, k, v = (x.to(dtype) for x in (q, k, v))
    seqlen_q, group, d = q.shape
    seqlen_k = k.shape[0]
    scores = (q.reshape(seqlen_q * group, d) @ k.transpose(0, 1)) * (1.0 / math.sqrt(d))
    scores = scores.view(seqlen_q, group, seqlen_k)
    if causal:
        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device).tril_(seqlen_k - seqlen_q)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    probs = torch.softmax(scores if dtype == torch.float64 else scores.float(), dim=-1)
    if p_dtype is not None:
        probs = probs.to(p_dtype)
    return probs.to(dtype) @ v


class Checker:
    """FA3's rule (compare._rule) on the output of the last batch element's last KV-head group, all
    query rows, against the logical cache (read through the page table when paged). With an
    AppendStep, the reference attends as the step does (see AppendStep.attended); the step's check
    also looks at the appended slot."""

    def __init__(self, torch, p, t, step=None):
        self.torch, self.t, self.step = torch, t, step
        group = p.heads // p.heads_kv
        self.group_heads = slice(p.heads - group, p.heads)
        args = (t.q[-1, :, self.group_heads], *t.logical_kv(-1, p.heads_kv - 1))
        fp8 = t.q.dtype == torch.float8_e4m3fn  # FP8's naive computation: S and out in bf16, P in e4m3
        low = torch.bfloat16 if fp8 else t.q.dtype
        exact = step.attended(torch, *args, torch.float64) if step else args
        naive = step.attended(torch, *args, low) if step else args
        self.exact = reference_out(torch, *exact, p.causal, torch.float64)
        self.naive = reference_out(torch, *naive, p.causal, low, torch.float8_e4m3fn if fp8 else None)

    def check(self, out):
        ok, error, bound = compare._rule(self.torch, out[-1, :, self.group_heads], self.exact, self.naive)
        if not ok:
            return f"FAIL: out error {error:.3g} > bound {bound:.3g}"
        return self.step.check_slot(self.torch, self.t) if self.step else "pass"


def _make_sdpa(backend_name):
    def make(torch, p, t):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if p.dtype == "e4m3":
            raise compare.Unsupported("SDPA takes no FP8 inputs")
        backend = getattr(SDPBackend, compare.SDPA_BACKENDS[backend_name])
        # SDPA's is_causal is top-left aligned: a single query row would see key 0 alone. With one
        # query row, bottom-right causal is no mask at all.
        mask = {}
        if p.causal and p.seqlen_q > 1:
            # causal_lower_right reaches FlashAttention-2's bottom-right causal kernel when flash is the
            # enabled backend; for any other it materialises a dense mask, or calls the flash or
            # mem-efficient kernel itself whatever backend was asked for, which would time something
            # else under cuDNN's name.
            if backend_name != "fa2":
                raise compare.Unsupported("bottom-right causal mask with seqlen_q > 1")
            from torch.nn.attention.bias import causal_lower_right

            mask = {"attn_mask": causal_lower_right(p.seqlen_q, p.seqlen_k)}
        gqa = {"enable_gqa": True} if p.heads != p.heads_kv else {}
        q, k, v = (x.transpose(1, 2) for x in (t.q, t.k, t.v))
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def fwd():
            with sdpa_kernel(backend):
                return sdpa(q, k, v, **mask, **gqa).transpose(1, 2)
        return fwd
    return make


SDPA_PEERS = {name: _make_sdpa(name) for name in PEERS}


def make_kvcache(p, t, options, step=None):
    """hopattn.attention_with_kvcache on the problem's cache (paged or not); with an AppendStep, the
    step that writes its key and value first, rotating them and q."""
    import hopattn

    append = {}
    cache_seqlens = t.cache_seqlens
    if step is not None:
        append = {"k": step.k_new, "v": step.v_new, "rotary_cos": step.cos, "rotary_sin": step.sin,
                  "rotary_interleaved": False}
        cache_seqlens = step.cache_seqlens
    return lambda: hopattn.attention_with_kvcache(t.q, t.k, t.v, cache_seqlens=cache_seqlens,
                                                  page_table=t.page_table, causal=p.causal, **append, **options)


def _error_line(e):
    first = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {first}"


def measure(torch, a, label, ours, build, check, row, log):
    """One implementation's row: build() gives its calls (one per copy of the inputs), check(out) the
    verdict on the first call's output ('pass', 'skipped' or a message), row(ms, check, reps) the row.
    A hopattn call (ours) that fails its check or raises gets a row without a time; a peer that
    rejects the problem gets none, and one that fails its check is timed and shown as failed."""
    try:
        calls = build()
        verdict = check(calls[0]())
    except compare.Unsupported as e:
        log(f"  {label}: not supported ({e})")
        return None
    except Exception as e:  # a peer that rejects the shape (GQA, head dim, query length)
        log(f"  {label}: {_error_line(e)}")
        return row(None, f"error: {type(e).__name__}: {e}"[:500], None) if ours else None
    if verdict not in ("pass", "skipped"):
        log(f"  {label}: {verdict}")
        if ours:  # a mismatch is reported and not timed
            return row(None, verdict, None)
    try:
        ms, reps = gpu_timing.graph_replay_ms(torch, calls, a.warmup, a.reps, MEASUREMENTS)
    except Exception as e:  # a call that cannot be captured in a graph
        log(f"  {label} graph capture or replay: {_error_line(e)}")
        return row(None, f"graph error: {type(e).__name__}: {e}"[:500], None) if ours else None
    return row(ms, verdict, reps)


def _build(torch, p, impl, copies, options, steps=None):
    """The calls of one impl, one per copy of the inputs (with steps: the append step on each)."""
    if steps is not None:
        return [make_kvcache(p, t, options, step) for t, step in zip(copies, steps)]
    if impl == "hopattn" and not p.page_size:
        return [compare.make_hopattn(torch, p, t, False, **options) for t in copies]
    if impl in OURS:
        return [make_kvcache(p, t, options) for t in copies]
    return [SDPA_PEERS[impl](torch, p, t) for t in copies]


def unchecked(out):
    """The verdict of every output under --no-check."""
    return "skipped"


def run_problem(torch, p, a, calls, log, device="cuda"):
    """Rows of every (impl, append) call of one problem (calls_of): checked on the first copy of the
    inputs, timed on all. The append call comes last: it writes into the caches."""
    copies = [Tensors(torch, p, seed=a.seed + i, device=device) for i in range(p.copies())]
    checker = Checker(torch, p, copies[0]) if not a.no_check else None
    options = hopattn_options(a)
    rows = []
    for impl, append in calls:
        steps, check = None, checker.check if checker else unchecked
        if append:
            cos, sin = AppendStep.tables(torch, p, device)
            steps = [AppendStep(torch, p, cos, sin, seed=a.seed + 1000 + i, device=device) for i in range(len(copies))]
            # Made before the step runs: the reference reads the cache as it was.
            check = Checker(torch, p, copies[0], steps[0]).check if not a.no_check else unchecked
        result = measure(torch, a, f"{impl}{' append' if append else ''} {p.describe()}", impl in OURS,
                         functools.partial(_build, torch, p, impl, copies, options, steps), check,
                         functools.partial(_row, p, impl, append), log)
        if result is not None:
            rows.append(result)
    del checker, copies
    torch.cuda.empty_cache()
    return rows


def _row(p, impl, append, ms, check, reps):
    return p.row(impl, ms, check=check, reps=reps, append=append)


PACK_GQA = {"auto": None, "on": True, "off": False}


def hopattn_options(a):
    """hopattn.attention's decode-layout keywords from the command line (the library's choice by
    default); the kvcache call takes the same."""
    return {"num_splits": a.num_splits, "pack_gqa": PACK_GQA[a.pack_gqa]}


def _head_pairs(text):
    pairs = []
    for word in (w for w in text.split(",") if w):
        try:
            heads, heads_kv = (int(x) for x in word.split("/"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--heads takes query/KV head pairs such as 32/8, not {word}") from None
        if heads_kv < 1 or heads % heads_kv:
            raise argparse.ArgumentTypeError(f"--heads {word}: query heads must be a multiple of KV heads")
        pairs.append((heads, heads_kv))
    return pairs


def page_sizes(text):
    """--page-sizes: non-negative ints (0: the contiguous cache), sorted, each once."""
    try:
        sizes = compare._ints(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--page-sizes takes numbers such as 0,16,64, not {text}") from None
    if any(s < 0 for s in sizes):
        raise argparse.ArgumentTypeError("--page-sizes: page sizes are >= 0 (0: contiguous)")
    return sorted(set(sizes))


def _csv(values):
    return ",".join(map(str, values))


def parser():
    parser = argparse.ArgumentParser(prog="compare.py decode", description="Time decode attention (a few query "
                                     "rows against a long KV cache) of hopattn and its peers on the same tensors "
                                     "(needs PyTorch, a Hopper GPU and the hopattn package).")
    parser.add_argument("--json", required=True, help="output JSON (docs/benchmarking.md)")
    parser.add_argument("--report-dir", help="also write the markdown tables there, as <the JSON's stem>.md")
    parser.add_argument("--hdims", type=compare._ints, default=list(DEFAULT_HDIMS),
                        help=f"default {_csv(DEFAULT_HDIMS)}")
    parser.add_argument("--seqlens-k", type=compare._ints, default=list(DEFAULT_SEQLENS_K),
                        help=f"KV cache lengths (default {_csv(DEFAULT_SEQLENS_K)})")
    parser.add_argument("--seqlens-q", type=compare._ints, default=list(DEFAULT_SEQLENS_Q),
                        help=f"query rows per sequence (default {_csv(DEFAULT_SEQLENS_Q)})")
    parser.add_argument("--batches", type=compare._ints, default=list(DEFAULT_BATCHES),
                        help=f"default {_csv(DEFAULT_BATCHES)}")
    parser.add_argument("--heads", type=_head_pairs, default=list(DEFAULT_HEADS),
                        help="query/KV head pairs (default " + ",".join(f"{h}/{kv}" for h, kv in DEFAULT_HEADS) + ")")
    parser.add_argument("--page-sizes", type=page_sizes, default=list(DEFAULT_PAGE_SIZES),
                        help=f"KV cache layouts: 0 contiguous, n > 0 pages of n keys (default "
                        f"{_csv(DEFAULT_PAGE_SIZES)}; page size 1 only at the smallest cache length)")
    parser.add_argument("--no-append", action="store_true", help="leave out the append rows (query length 1: the "
                        "step that also writes one key with rotary embedding)")
    parser.add_argument("--dtype", type=compare._words(["bf16", "fp16", "e4m3"]), default=["bf16"],
                        help="bf16 (default),fp16,e4m3 (FP8 caches: the bf16 inputs rounded, no descale, out bf16; "
                        "TB/s of their 1-byte K+V; no append rows)")
    parser.add_argument("--causal", type=compare._causal, default=[True], help="yes (default), no or both")
    parser.add_argument("--peers", type=compare._words(list(PEERS)), default=list(PEERS),
                        help=f"default {_csv(PEERS)}")
    parser.add_argument("--no-check", action="store_true", help="time without the float64 check (not for reports)")
    parser.add_argument("--quick", action="store_true", help="a handful of shapes (query length 1 and 4, cache 32k, "
                        "batch 1 and 16, d128), each at the selected page sizes, fewer replays")
    parser.add_argument("--warmup", type=int, default=3, help="calls before the graph capture (default 3)")
    parser.add_argument("--reps", type=int, default=50, help=f"graph replays per measurement; the time is the "
                        f"median of {MEASUREMENTS} measurements (default 50)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-splits", type=int, default=0, help="hopattn's key splits per query tile: 0 "
                        "(default) lets the library choose, 1 never splits, n > 1 asks for n (A/B of its choice)")
    parser.add_argument("--pack-gqa", choices=sorted(PACK_GQA), default="auto",
                        help="hopattn's packed GQA heads: auto (default, the library's choice), on or off")
    return parser


def run_mode(a, argv, mode, build_problems, calls_for, run_problem, ours, table, write_report):
    """The body of a graph-replay mode of compare.py (decode, chunked_prefill): its problems, each
    skipped where the GPU lacks the memory, timed through `run_problem`, the rows written to a.json
    and `table` printed. Returns the exit code: 1 if one of `ours` failed its check."""
    if a.quick:
        a.warmup, a.reps = min(a.warmup, 1), min(a.reps, 10)
    torch = compare.torch_with_hopattn(f"compare.py {mode}")
    problems = build_problems(a)
    env = compare.environment(torch, ["hopattn"] + a.peers)
    env["command"] = f"python3 bench/compare.py {mode} " + " ".join(argv)

    def run(p, log):
        calls = calls_for(p)
        free, _ = torch.cuda.mem_get_info()
        if not p.fits(calls, free):
            log(f"  {p.describe()}: skipped, needs about {p.memory_needed(calls) / 2**30:.1f} GiB of the "
                f"{free / 2**30:.1f} GiB free")
            return []
        return run_problem(torch, p, a, calls, log)

    rows = compare.measure_all(problems, f"{mode.replace('_', ' ')} problems", env, a.json, run)
    failed = [r for r in rows if r["impl"] in ours and not passed(r)]
    print(f"compare.py {mode}: {len(rows)} rows in {env['seconds']} s -> {a.json}; hopattn mismatches/errors: "
          f"{len(failed)}", file=sys.stderr)
    print(table(rows, peers=a.peers))
    if a.report_dir:
        print(write_report(a.json, a.report_dir, Path(a.json).stem))
    return 1 if failed else 0


def main(argv):
    a = parser().parse_args(argv)
    return run_mode(a, argv, "decode", build_problems, lambda p: calls_of(p, a.peers, not a.no_append),
                    run_problem, OURS, report_markdown, write_report)
