"""Decode attention: a few query rows per sequence against a long KV cache, hopattn beside PyTorch
SDPA's cuDNN and FlashAttention-2 backends on the same tensors, in one process.

    python3 bench/compare.py decode --json OUT.json [--report-dir DIR] [--quick] [subset options]

Decode reads the whole KV cache to produce a few rows of output: it is bound by memory, so the
metric is K+V bytes / GPU time in TB/s. Each call is captured in a CUDA graph and timed over many
replays (bench/gpu_timing.py), so that host overhead does not count. Rows: query length 1 (and 4,
16: speculative decoding), cache length 8k/32k/128k, batch 1/4/16/64, query / KV heads 32/8, 64/8
and 32/1, head dim 128, 64 and 256, bf16, causal (bottom-right aligned: every query row sees the
cache up to its own position). Every output is checked with FA3's rule against a float64 reference
before it is timed; a hopattn mismatch is reported and not timed. The JSON is compare.py's file
layout with decode rows (docs/benchmarking.md).

Nothing here imports torch at module level: the problem list, byte counts, rows and the table are
usable (and tested) without PyTorch or a GPU.
"""
import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  (bench/, beside this file)
import gpu_timing  # noqa: E402

PEERS = ("cudnn", "fa2")
ELEMENT_BYTES = {"bf16": 2, "fp16": 2}
DEFAULT_SEQLENS_Q = (1, 4, 16)
DEFAULT_SEQLENS_K = (8192, 32768, 131072)
DEFAULT_BATCHES = (1, 4, 16, 64)
DEFAULT_HEADS = ((32, 8), (64, 8), (32, 1))
DEFAULT_HDIMS = (128, 64, 256)
# --quick keeps, of each selected list, the values nearest these.
QUICK_TARGETS = {"seqlens_q": (1, 4), "seqlens_k": (32768,), "batches": (1, 16), "hdims": (128,)}

# Replays cycle through copies of the inputs adding up to this much, several times the H200's L2, so
# that a replay reads its KV cache from HBM as a decode step does (between two steps of one layer,
# every other layer's cache goes through the L2); a small cache replayed alone would stay in the L2.
COLD_BYTES = 256 << 20
MEASUREMENTS = 5
# Of the free device memory, what a problem's tensors may take; the rest is for the implementations'
# workspaces, cuDNN's plans and the allocator's rounding.
MEMORY_SHARE = 0.85


# --------------------------------------------------------------------------------------------
# Problems, rows and the table (no torch)
# --------------------------------------------------------------------------------------------

class Problem:
    """One decode problem: q (batch, seqlen_q, heads, hdim) against a KV cache (batch, seqlen_k,
    heads_kv, hdim), contiguous (page_size 0)."""

    varlen = False  # fixed-length tensors, for compare.make_hopattn

    def __init__(self, dtype, hdim, causal, batch, heads, heads_kv, seqlen_q, seqlen_k):
        self.dtype, self.hdim, self.causal, self.batch = dtype, hdim, causal, batch
        self.heads, self.heads_kv, self.seqlen_q, self.seqlen_k = heads, heads_kv, seqlen_q, seqlen_k

    def kv_bytes(self):
        """What one call must read at least: the K and V caches."""
        return 2 * self.batch * self.seqlen_k * self.heads_kv * self.hdim * ELEMENT_BYTES[self.dtype]

    def q_bytes(self):
        """Bytes of q, and of each output."""
        return self.batch * self.seqlen_q * self.heads * self.hdim * ELEMENT_BYTES[self.dtype]

    def copies(self):
        """How many copies of the inputs the replays cycle through (COLD_BYTES)."""
        return max(1, math.ceil(COLD_BYTES / (self.kv_bytes() + self.q_bytes())))

    def check_bytes(self):
        """The float64 reference of one batch element and KV-head group: K, V and a few score matrices."""
        group = self.heads // self.heads_kv
        return 8 * (2 * self.seqlen_k * self.hdim + 4 * self.seqlen_q * group * self.seqlen_k)

    def memory_needed(self, impls):
        """Device bytes the problem holds at its peak: every copy's inputs, one output per copy and
        implementation (a captured graph keeps its own), and the check."""
        copies = self.copies()
        return copies * (self.kv_bytes() + self.q_bytes()) + len(impls) * copies * self.q_bytes() + self.check_bytes()

    def fits(self, impls, free_bytes):
        return self.memory_needed(impls) <= MEMORY_SHARE * free_bytes

    @classmethod
    def of_row(cls, row):
        return cls(row["dtype"], row["hdim"], row["causal"], row["batch"], row["heads"], row["heads_kv"],
                   row["seqlen_q"], row["seqlen_k"])

    def row(self, impl, ms, check, reps=None):
        return {"mode": "decode", "page_size": 0, "impl": impl, "direction": "fwd", "dtype": self.dtype,
                "hdim": self.hdim, "causal": self.causal, "batch": self.batch, "heads": self.heads,
                "heads_kv": self.heads_kv, "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k, "ms": ms,
                "tb_per_s": self.kv_bytes() / (ms * 1e9) if ms else None, "check": check, "reps": reps}

    def describe(self):
        return (f"{self.dtype} d{self.hdim} {'causal' if self.causal else 'full'} h{self.heads}/{self.heads_kv} "
                f"b{self.batch} q{self.seqlen_q} k{self.seqlen_k}")


def nearest(values, targets):
    """Of `values` (in their order), those nearest in ratio to one of `targets`."""
    keep = {min(values, key=lambda v: abs(math.log2(v / t))) for t in targets}
    return [v for v in values if v in keep]


def build_problems(a):
    lists = {name: getattr(a, name) for name in ("seqlens_q", "seqlens_k", "batches", "hdims")}
    if a.quick:
        lists = {name: nearest(values, QUICK_TARGETS[name]) for name, values in lists.items()}
    return [Problem(dtype, hdim, causal, batch, heads, heads_kv, seqlen_q, seqlen_k)
            for dtype in a.dtype for hdim in lists["hdims"] for causal in a.causal for heads, heads_kv in a.heads
            for seqlen_q in lists["seqlens_q"] for seqlen_k in lists["seqlens_k"] for batch in lists["batches"]]


def problem_key(row):
    """Identity of a problem: rows of different impls with equal keys were timed on the same tensors."""
    return (row["dtype"], row["hdim"], bool(row["causal"]), row["heads"], row["heads_kv"], row["seqlen_q"],
            row["seqlen_k"], row["batch"], row.get("page_size", 0))


def _passed(row):
    return row.get("check") in ("pass", "skipped")


def markdown_table(rows, peers=PEERS):
    """Markdown: one line per problem with a hopattn row (TB/s per impl, hopattn / the better peer that
    passed its check), the geomean of that ratio, and the rows that were not timed."""
    by_key = {}
    for row in rows:
        by_key.setdefault(problem_key(row), {})[row["impl"]] = row
    header = ["dtype", "d", "causal", "heads", "batch", "seqlen_q", "seqlen_k", "hopattn"] + list(peers)
    header += ["best peer", "hopattn / best"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ratios, untimed = [], []
    for key in sorted(by_key):
        impl_rows = by_key[key]
        ours = impl_rows.get("hopattn")
        if ours is None:
            continue
        dtype, hdim, causal, heads, heads_kv, seqlen_q, seqlen_k, batch, _ = key
        cells = [dtype, str(hdim), "yes" if causal else "no", f"{heads}/{heads_kv}", str(batch), str(seqlen_q),
                 str(seqlen_k), f"{ours['tb_per_s']:.2f}" if ours.get("tb_per_s") else "not timed"]
        if not ours.get("tb_per_s"):
            untimed.append(ours)
        best = None
        for peer in peers:
            row = impl_rows.get(peer)
            if row is None or not row.get("tb_per_s"):
                cells.append("")
                continue
            cells.append(f"{row['tb_per_s']:.2f}" + ("" if _passed(row) else " (check failed)"))
            if _passed(row) and (best is None or row["tb_per_s"] > best["tb_per_s"]):
                best = row
        if best is not None and ours.get("tb_per_s"):
            ratio = ours["tb_per_s"] / best["tb_per_s"]
            ratios.append(ratio)
            cells += [best["impl"], f"{ratio:.3f}"]
        else:
            cells += ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if ratios:
        lines += [f"Geomean of hopattn / best peer over {len(ratios)} rows: {compare.geomean(ratios):.3f}", ""]
    if untimed:
        lines += ["Not timed (check failed or error):", ""]
        lines += [f"- {Problem.of_row(r).describe()}: {r.get('check', '?')}" for r in untimed]
        lines.append("")
    return "\n".join(lines)


def write_report(json_path, out_dir, name):
    """Writes out_dir/name.md from one result file of `compare.py decode`; returns its path."""
    rows, envs = compare.load_rows([json_path])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = [f"# hopattn decode: {name}", "", f"Input: `{Path(json_path).name}`.", ""]
    md += compare.env_lines(envs)
    md += ["", "TB/s = K+V bytes (2 * batch * seqlen_k * heads_kv * head dim * element size) / GPU time of one "
               "call, from CUDA-graph replays; ratios are hopattn / the faster of the peers from the same run.", ""]
    md.append(markdown_table(rows))
    path = out_dir / f"{name}.md"
    path.write_text("\n".join(md))
    return path


# --------------------------------------------------------------------------------------------
# Timing part (PyTorch, a Hopper GPU, the hopattn package)
# --------------------------------------------------------------------------------------------

class Tensors:
    """One copy of a problem's inputs in hopattn's layout, (batch, seqlen, heads, d), without grad."""

    def __init__(self, torch, p, seed, device="cuda"):
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[p.dtype]
        gen = torch.Generator(device=device).manual_seed(seed)

        def randn(seqlen, heads):
            return torch.randn(p.batch, seqlen, heads, p.hdim, device=device, dtype=dt, generator=gen)

        self.q = randn(p.seqlen_q, p.heads)
        self.k = randn(p.seqlen_k, p.heads_kv)
        self.v = randn(p.seqlen_k, p.heads_kv)


def reference_out(torch, q, k, v, causal, dtype):
    """q: (seqlen_q, G, d), k, v: (seqlen_k, d) of one batch element and KV head, computed in `dtype`
    (float64: the reference; else the naive low-precision computation of compare._attention_slice,
    which bounds the error). causal is bottom-right aligned: query i sees keys up to
    i + seqlen_k - seqlen_q. Returns out (seqlen_q, G, d)."""
    q, k, v = (x.to(dtype) for x in (q, k, v))
    seqlen_q, group, d = q.shape
    seqlen_k = k.shape[0]
    scores = (q.reshape(seqlen_q * group, d) @ k.transpose(0, 1)) * (1.0 / math.sqrt(d))
    scores = scores.view(seqlen_q, group, seqlen_k)
    if causal:
        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device).tril_(seqlen_k - seqlen_q)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    probs = torch.softmax(scores if dtype == torch.float64 else scores.float(), dim=-1).to(dtype)
    return probs @ v


class Checker:
    """FA3's rule (compare._rule) on the output of the last batch element's last KV-head group, all
    query rows."""

    def __init__(self, torch, p, t):
        self.torch = torch
        group = p.heads // p.heads_kv
        self.group_heads = slice(p.heads - group, p.heads)
        args = (t.q[-1, :, self.group_heads], t.k[-1, :, -1], t.v[-1, :, -1])
        self.exact = reference_out(torch, *args, p.causal, torch.float64)
        self.naive = reference_out(torch, *args, p.causal, t.q.dtype)

    def check(self, out):
        ok, error, bound = compare._rule(self.torch, out[-1, :, self.group_heads], self.exact, self.naive)
        return "pass" if ok else f"FAIL: out error {error:.3g} > bound {bound:.3g}"


def _make_sdpa(backend_name):
    def make(torch, p, t):
        from torch.nn.attention import SDPBackend, sdpa_kernel

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


def _error_line(e):
    first = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {first}"


def run_problem(torch, p, a, impls, log):
    """Rows of every impl of one problem: checked on the first copy of the inputs, timed on all."""
    copies = [Tensors(torch, p, seed=a.seed + i) for i in range(p.copies())]
    checker = Checker(torch, p, copies[0]) if not a.no_check else None
    rows = []
    for impl in impls:
        try:
            if impl == "hopattn":
                calls = [compare.make_hopattn(torch, p, t, False, **hopattn_options(a)) for t in copies]
            else:
                calls = [SDPA_PEERS[impl](torch, p, t) for t in copies]
            out = calls[0]()
            check = checker.check(out) if checker else "skipped"
        except compare.Unsupported as e:
            log(f"  {impl}: not supported ({e})")
            continue
        except Exception as e:  # a peer that rejects the shape (GQA, head dim, query length)
            log(f"  {impl}: {_error_line(e)}")
            if impl == "hopattn":
                rows.append(p.row(impl, None, check=f"error: {type(e).__name__}: {e}"[:500]))
            continue
        if check not in ("pass", "skipped"):
            log(f"  {impl} {p.describe()}: {check}")
            if impl == "hopattn":  # a mismatch is reported and not timed
                rows.append(p.row(impl, None, check=check))
                continue
        try:
            ms, reps = gpu_timing.graph_replay_ms(torch, calls, a.warmup, a.reps, MEASUREMENTS)
        except Exception as e:  # a call that cannot be captured in a graph
            log(f"  {impl} graph capture or replay: {_error_line(e)}")
            if impl == "hopattn":
                rows.append(p.row(impl, None, check=f"graph error: {type(e).__name__}: {e}"[:500]))
            continue
        rows.append(p.row(impl, ms, check=check, reps=reps))
    del checker, copies
    torch.cuda.empty_cache()
    return rows


PACK_GQA = {"auto": None, "on": True, "off": False}


def hopattn_options(a):
    """hopattn.attention's decode-layout keywords from the command line (the library's choice by
    default)."""
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


def _csv(values):
    return ",".join(map(str, values))


def parser():
    parser = argparse.ArgumentParser(prog="compare.py decode", description="Time decode attention (a few query "
                                     "rows against a long KV cache) of hopattn and its peers on the same tensors "
                                     "(needs PyTorch, a Hopper GPU and the hopattn package).")
    parser.add_argument("--json", required=True, help="output JSON (docs/benchmarking.md)")
    parser.add_argument("--report-dir", help="also write the markdown table there, as <the JSON's stem>.md")
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
    parser.add_argument("--dtype", type=compare._words(["bf16", "fp16"]), default=["bf16"], help="bf16 (default),fp16")
    parser.add_argument("--causal", type=compare._causal, default=[True], help="yes (default), no or both")
    parser.add_argument("--peers", type=compare._words(list(PEERS)), default=list(PEERS),
                        help=f"default {_csv(PEERS)}")
    parser.add_argument("--no-check", action="store_true", help="time without the float64 check (not for reports)")
    parser.add_argument("--quick", action="store_true", help="a handful of rows (query length 1 and 4, cache 32k, "
                        "batch 1 and 16, d128), fewer replays")
    parser.add_argument("--warmup", type=int, default=3, help="calls before the graph capture (default 3)")
    parser.add_argument("--reps", type=int, default=50, help=f"graph replays per measurement; the time is the "
                        f"median of {MEASUREMENTS} measurements (default 50)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-splits", type=int, default=0, help="hopattn's key splits per query tile: 0 "
                        "(default) lets the library choose, 1 never splits, n > 1 asks for n (A/B of its choice)")
    parser.add_argument("--pack-gqa", choices=sorted(PACK_GQA), default="auto",
                        help="hopattn's packed GQA heads: auto (default, the library's choice), on or off")
    return parser


def main(argv):
    a = parser().parse_args(argv)
    if a.quick:
        a.warmup, a.reps = min(a.warmup, 1), min(a.reps, 10)
    torch = compare.torch_with_hopattn("compare.py decode")
    impls = ["hopattn"] + a.peers
    problems = build_problems(a)
    env = compare.environment(torch, impls)
    env["command"] = "python3 bench/compare.py decode " + " ".join(argv)

    def measure(p, log):
        free, _ = torch.cuda.mem_get_info()
        if not p.fits(impls, free):
            log(f"  {p.describe()}: skipped, needs about {p.memory_needed(impls) / 2**30:.1f} GiB of the "
                f"{free / 2**30:.1f} GiB free")
            return []
        return run_problem(torch, p, a, impls, log)

    rows = compare.measure_all(problems, "decode problems", env, a.json, measure)
    failed = [r for r in rows if r["impl"] == "hopattn" and not _passed(r)]
    print(f"compare.py decode: {len(rows)} rows in {env['seconds']} s -> {a.json}; hopattn mismatches/errors: "
          f"{len(failed)}", file=sys.stderr)
    print(markdown_table(rows, peers=a.peers))
    if a.report_dir:
        print(write_report(a.json, a.report_dir, Path(a.json).stem))
    return 1 if failed else 0
