"""bench/chunked_prefill.py's parts that need neither PyTorch nor a GPU: the command line, the
problem list and its lengths, visible-pair and FLOP counts, byte counts, rows, the markdown table
and report, and compare.py's `chunked_prefill` subcommand. With PyTorch installed, the tensors, the
blocked reference and a whole problem's rows run on CPU tensors, hopattn replaced by a plain
PyTorch stand-in."""

import json
import subprocess
import sys
import types

import pytest

from bench_scripts import REPO, import_without, load, table_rows

chunked = load("chunked_prefill")


def args(*argv):
    return chunked.parser().parse_args(["--json", "out.json", *argv])


def problems(*argv):
    return chunked.build_problems(args(*argv))


def test_imports_without_torch():
    out = import_without("chunked_prefill", ["torch"], "chunked_prefill.PEERS")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "('fa2',)"


def test_defaults():
    a = args()
    assert (a.seqlens_q, a.seqlens_k, a.batches, a.heads, a.hdims) == ([1024, 4096], [16384, 32768], [4], [(32, 8)],
                                                                       [128])
    assert (a.page_sizes, a.dtype, a.peers, a.reps) == ([0, 16, 64, 256], ["bf16"], ["fa2"], 20)
    selected = problems()
    assert len(selected) == 2 * 2 * 4  # query chunks, caches, page sizes
    assert [(p.seqlen_q, p.seqlen_k, p.page_size) for p in selected[:5]] == [
        (1024, 16384, 0), (1024, 16384, 16), (1024, 16384, 64), (1024, 16384, 256), (1024, 32768, 0)]
    # The ranges: chunks of 512-4k tokens against caches of 8k-32k, each chunk among its keys.
    for p in selected:
        assert p.batch == 4 and (p.heads, p.heads_kv, p.hdim, p.dtype) == (32, 8, 128, "bf16")
        assert all(p.seqlen_q // 2 <= q <= p.seqlen_q for q in p.lengths_q)
        assert all(max(q, p.seqlen_k // 2) <= k <= p.seqlen_k for q, k in zip(p.lengths_q, p.lengths_k))
    chunks = [q for p in selected for q in p.lengths_q]
    caches = [k for p in selected for k in p.lengths_k]
    assert 512 <= min(chunks) and max(chunks) <= 4096 and 8192 <= min(caches) and max(caches) <= 32768
    # Every page size of a shape has the same sequences; the lengths vary within a batch.
    by_shape = {}
    for p in selected:
        by_shape.setdefault((p.seqlen_q, p.seqlen_k), set()).add((tuple(p.lengths_q), tuple(p.lengths_k)))
    assert all(len(lengths) == 1 for lengths in by_shape.values())
    assert all(len(set(p.lengths_q)) > 1 for p in selected)
    # The seed picks other lengths; the same seed the same ones.
    assert problems("--seed", "1")[0].lengths_q != selected[0].lengths_q
    assert problems()[0].lengths_k == selected[0].lengths_k


def test_options():
    a = args("--seqlens-q", "512", "--seqlens-k", "8192", "--batches", "2,8", "--heads", "64/8", "--hdims", "64,128",
             "--page-sizes", "256,0", "--dtype", "fp16", "--peers", "", "--reps", "5")
    assert (a.seqlens_q, a.seqlens_k, a.batches, a.heads, a.hdims) == ([512], [8192], [2, 8], [(64, 8)], [64, 128])
    assert (a.page_sizes, a.dtype, a.peers, a.reps) == ([0, 256], ["fp16"], [], 5)
    assert len(chunked.build_problems(a)) == 2 * 2 * 2  # head dims, batches, page sizes
    for bad in (["--heads", "32/3"], ["--peers", "cudnn"], ["--page-sizes", "-1"], ["--dtype", "fp8"]):
        with pytest.raises(SystemExit):
            args(*bad)
    with pytest.raises(SystemExit):
        chunked.parser().parse_args([])  # --json is required


def test_quick():
    quick = problems("--quick")
    assert [(p.seqlen_q, p.seqlen_k, p.page_size) for p in quick] == [(4096, 32768, s) for s in (0, 16, 64, 256)]


def test_visible_pairs():
    # Bottom-right causal: query i of q sees keys 0 .. i + k - q; counted one by one.
    for q, k in ((1, 1), (1, 9), (5, 5), (3, 10), (512, 8192), (4096, 32768)):
        assert chunked.visible_pairs(q, k) == sum(i + k - q + 1 for i in range(q))
    assert chunked.visible_pairs(4, 4) == 10  # square causal: half the square and the diagonal


def test_flops_and_bytes():
    p = chunked.Problem("bf16", 128, 32, 8, 4096, 32768, [3, 4096], [10, 20000], page_size=64)
    assert p.batch == 2
    assert p.flops() == 4 * 128 * 32 * (chunked.visible_pairs(3, 10) + chunked.visible_pairs(4096, 20000))
    per_key = 2 * 8 * 128 * 2  # K and V of one position
    assert p.cache_bytes() == (1 + 313) * 64 * per_key + 4 * 2 * 313  # whole pages, and the table
    contiguous = chunked.Problem("bf16", 128, 32, 8, 4096, 32768, [3, 4096], [10, 20000])
    assert contiguous.cache_bytes() == 20010 * per_key
    assert p.q_bytes() == 4099 * 32 * 128 * 2
    # About 110 MiB of inputs: the replays cycle through three copies (COLD_BYTES).
    assert p.copies() == contiguous.copies() == 3
    with pytest.raises(ValueError):
        chunked.Problem("bf16", 128, 32, 8, 4096, 32768, [30], [20])  # a chunk longer than its cache
    # At the defaults' largest problem, well under an H100's memory.
    largest = max(problems(), key=lambda p: p.cache_bytes())
    assert largest.memory_needed(chunked.calls_of(largest, ["fa2"])) < 8 << 30


def test_row():
    p = chunked.Problem("bf16", 128, 32, 8, 4096, 32768, [3000, 4096], [20000, 32768], page_size=16)
    row = p.row("hopattn", 2.0, check="pass", reps=20)
    assert row == {"mode": "chunked_prefill", "page_size": 16, "impl": "hopattn", "direction": "fwd", "dtype": "bf16",
                   "hdim": 128, "causal": True, "batch": 2, "heads": 32, "heads_kv": 8, "seqlen_q": 4096,
                   "seqlen_k": 32768, "seqlens_q": [3000, 4096], "seqlens_k": [20000, 32768], "total_q": 7096,
                   "total_k": 52768, "ms": 2.0, "tflops": p.flops() / 2e9, "check": "pass", "reps": 20}
    untimed = p.row("hopattn", None, check="FAIL: x")
    assert (untimed["ms"], untimed["tflops"], untimed["reps"]) == (None, None, None)
    again = chunked.Problem.of_row(json.loads(json.dumps(row)))
    assert again.describe() == p.describe() == "bf16 d128 h32/8 b2 q3000-4096 k20000-32768 page16"
    assert again.flops() == p.flops()
    assert chunked.calls_of(p, ["fa2"]) == ["hopattn"]  # the peer takes no paged cache
    assert chunked.calls_of(chunked.Problem.of_row({**row, "page_size": 0}), ["fa2"]) == ["hopattn", "fa2"]


def canned_rows():
    """One shape at every page size beside FA2; a second shape whose page-16 row failed its check."""
    big = chunked.Problem("bf16", 128, 32, 8, 4096, 32768, [3000, 4096], [20000, 32768])
    small = chunked.Problem("bf16", 128, 32, 8, 1024, 16384, [600, 1000], [9000, 16000])

    def row(p, impl, ms, page_size=0, check="pass"):
        return chunked.Problem.of_row({**p.row(impl, ms, check), "page_size": page_size}).row(impl, ms, check, 20)

    return [row(big, "hopattn", 10.0), row(big, "fa2", 12.0), row(big, "hopattn", 10.5, 16),
            row(big, "hopattn", 10.2, 64), row(big, "hopattn", 10.0, 256),
            row(small, "hopattn", 1.0), row(small, "fa2", 0.9, check="FAIL: out error 1 > bound 0.1"),
            row(small, "hopattn", None, 16, check="FAIL: out error 2 > bound 0.1"), row(small, "hopattn", 1.25, 64)]


def test_markdown_table():
    text = chunked.markdown_table(canned_rows())
    tables = text.split("\n\n")
    rows = table_rows(tables[0])
    header = rows[0]
    assert header == ["dtype", "d", "heads", "batch", "query tokens", "keys", "TFLOP", "hopattn", "fa2",
                      "hopattn / fa2", "page 16", "page 16 / contiguous", "page 64", "page 64 / contiguous",
                      "page 256", "page 256 / contiguous"]
    by_keys = {r[5]: dict(zip(header, r)) for r in rows[1:]}
    assert set(by_keys) == {"20000-32768", "9000-16000"}
    big = by_keys["20000-32768"]
    flops = chunked.Problem("bf16", 128, 32, 8, 4096, 32768, [3000, 4096], [20000, 32768]).flops()
    assert (big["query tokens"], big["TFLOP"]) == ("3000-4096", f"{flops / 1e12:.2f}")
    assert (big["hopattn"], big["fa2"], big["hopattn / fa2"]) == (f"{flops / 1e10:.0f}", f"{flops / 1.2e10:.0f}",
                                                                  "1.200")
    assert (big["page 16 / contiguous"], big["page 64 / contiguous"], big["page 256 / contiguous"]) == (
        f"{10 / 10.5:.3f}", f"{10 / 10.2:.3f}", "1.000")
    small = by_keys["9000-16000"]
    assert small["fa2"].endswith("(check failed)") and small["hopattn / fa2"] == ""  # not compared with
    assert (small["page 16"], small["page 16 / contiguous"]) == ("not timed", "")
    assert small["page 64 / contiguous"] == "0.800"
    assert (small["page 256"], small["page 256 / contiguous"]) == ("", "")
    summary = {r[0]: r for r in table_rows(tables[1])[1:]}
    assert summary["16"] == ["16", "1", f"{10 / 10.5:.3f}", f"{10 / 10.5:.3f}"]
    assert summary["64"][1:] == ["2", f"{(10 / 10.2 * 0.8) ** 0.5:.3f}", "0.800"]
    assert "- bf16 d128 h32/8 b2 q600-1000 k9000-16000 page16: FAIL: out error 2 > bound 0.1" in text


def test_report(tmp_path):
    path = tmp_path / "prefill.json"
    env = {"gpu": "NVIDIA H200 (canned)", "command": "python3 bench/compare.py chunked_prefill --quick"}
    path.write_text(json.dumps({"env": env, "rows": canned_rows()}))
    md_path = chunked.write_report(path, tmp_path / "report", "prefill")
    text = md_path.read_text()
    assert md_path == tmp_path / "report" / "prefill.md"
    assert text.startswith("# hopattn chunked prefill: prefill") and "NVIDIA H200 (canned)" in text
    assert table_rows(text)[0][:3] == ["dtype", "d", "heads"]


def test_compare_dispatches_chunked_prefill(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "bench" / "compare.py"), "chunked_prefill", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "--page-sizes" in out.stdout and "compare.py chunked_prefill" in out.stdout
    code = ("import sys; sys.modules['torch'] = None; "
            f"sys.path.insert(0, {str(REPO / 'bench')!r}); import compare; "
            f"sys.exit(compare.main(['chunked_prefill', '--json', {str(tmp_path / 'x.json')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1 and "compare.py chunked_prefill: needs PyTorch" in out.stderr
    assert not (tmp_path / "x.json").exists()


# --------------------------------------------------------------------------------------------
# On CPU tensors (PyTorch installed)
# --------------------------------------------------------------------------------------------

def cpu_torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed: chunked_prefill.py's tensor parts are "
                               "untested here")


def small_problem(page_size=0):
    # The checked (last) sequence's chunk is shorter than its cache: bottom-right is not top-left there.
    return chunked.Problem("bf16", 32, 4, 2, 40, 120, [7, 40, 23], [7, 120, 60], page_size)


@pytest.mark.parametrize("page_size", [0, 16, 25])
def test_tensors_on_cpu(page_size):
    torch = cpu_torch()
    p = small_problem(page_size)
    t = chunked.Tensors(torch, p, seed=1, device="cpu")
    assert t.q.shape == (70, 4, 32) and t.cu_seqlens_q.dtype == torch.int32
    assert t.cu_seqlens_q.tolist() == [0, 7, 47, 70]
    assert (t.max_seqlen_q, t.max_seqlen_k) == (40, 120)
    if page_size:
        assert t.cu_seqlens_k is None and t.seqused_k.tolist() == [7, 120, 60]
        assert t.page_table.shape == (3, -(-120 // page_size)) and t.k.shape[1] == page_size
    else:
        assert t.cu_seqlens_k.tolist() == [0, 7, 127, 187] and t.page_table is None and t.k.shape == (187, 2, 32)
    for b, n in enumerate(p.lengths_k):
        k, v = t.logical_kv(b, 1)
        assert k.shape == v.shape == (n, 32)
    if page_size:  # position j of sequence 1 is row j % page_size of its page j // page_size
        k, _ = t.logical_kv(1, 0)
        assert torch.equal(k[99], t.k[t.page_table[1, 99 // page_size], 99 % page_size, 0])


def test_blocked_reference_on_cpu(monkeypatch):
    # The reference in blocks of query rows equals the reference in one piece.
    torch = cpu_torch()
    q, k, v = torch.randn(37, 2, 16, dtype=torch.float64), torch.randn(90, 16, dtype=torch.float64), \
        torch.randn(90, 16, dtype=torch.float64)
    whole = chunked.decode.reference_out(torch, q, k, v, True, torch.float64)
    monkeypatch.setattr(chunked, "CHECK_ROWS", 8)
    assert torch.allclose(chunked.reference_out(torch, q, k, v, torch.float64), whole)


def per_sequence_attention(torch, t, p, bottom_right=True):
    """(total_q, heads, d): each sequence on its own, in float32, causal from the bottom right (or
    from the top left, SDPA's is_causal)."""
    outs = []
    for b in range(p.batch):
        keys, values = (torch.stack([t.logical_kv(b, h)[i] for h in range(p.heads_kv)], 1) for i in (0, 1))
        q = t.q[t.offsets_q[b]:t.offsets_q[b + 1]]
        mask = torch.ones(q.shape[0], keys.shape[0], dtype=torch.bool)
        mask = mask.tril_(keys.shape[0] - q.shape[0]) if bottom_right else mask.tril_()
        q, keys, values = (x.float().transpose(0, 1)[None] for x in (q, keys, values))
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        outs.append(out[0].transpose(0, 1))
    return torch.cat(outs).to(t.q.dtype)


@pytest.mark.parametrize("page_size", [0, 16])
def test_checker_on_cpu(monkeypatch, page_size):
    torch = cpu_torch()
    monkeypatch.setattr(chunked, "CHECK_ROWS", 16)
    p = small_problem(page_size)
    t = chunked.Tensors(torch, p, seed=3, device="cpu")
    checker = chunked.Checker(torch, p, t)
    assert checker.check(per_sequence_attention(torch, t, p)) == "pass"
    assert checker.check(per_sequence_attention(torch, t, p, bottom_right=False)).startswith("FAIL: out error")


def fake_hopattn(torch):
    """hopattn.attention_varlen on CPU: each sequence on its own, keys from cu_seqlens_k or read
    through the page table (seqused_k of them), bottom-right causal; the call's arguments are bound to
    the real function's signature when the package in this checkout has it."""
    import inspect

    import hopattn

    signature = inspect.signature(hopattn.attention_varlen) if hopattn.torch_available() else None

    def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                         seqused_k=None, page_table=None):
        if signature is not None:
            signature.bind(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                           seqused_k=seqused_k, page_table=page_table)
        assert (page_table is None) == (cu_seqlens_k is not None) == (seqused_k is None)
        outs = []
        for b in range(len(cu_seqlens_q) - 1):
            qb = q[int(cu_seqlens_q[b]):int(cu_seqlens_q[b + 1])]
            if page_table is None:
                keys = slice(int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]))
                kb, vb = k[keys], v[keys]
            else:
                n = int(seqused_k[b])
                pages = page_table[b, :-(-n // k.shape[1])].long()
                kb, vb = k[pages].flatten(0, 1)[:n], v[pages].flatten(0, 1)[:n]
            assert qb.shape[0] <= max_seqlen_q and kb.shape[0] <= max_seqlen_k
            mask = torch.ones(qb.shape[0], kb.shape[0], dtype=torch.bool).tril_(kb.shape[0] - qb.shape[0])
            qb, kb, vb = (x.float().transpose(0, 1)[None] for x in (qb, kb, vb))
            out = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask if causal else None,
                                                                   enable_gqa=True)
            outs.append(out[0].transpose(0, 1))
        return torch.cat(outs).to(q.dtype)

    return types.SimpleNamespace(attention_varlen=attention_varlen)


@pytest.mark.parametrize("page_size", [0, 16, 25])
def test_rows_of_a_problem_on_cpu(monkeypatch, page_size):
    # Every impl of a problem is made, checked and "timed" on its copies: hopattn through the
    # stand-in, FA2 through SDPA's CPU flash kernel, one call per sequence.
    torch = cpu_torch()
    monkeypatch.setitem(sys.modules, "hopattn", fake_hopattn(torch))
    timed = []

    def graph_replay_ms(torch, calls, warmup, replays, measurements):
        timed.append([call() for call in calls])
        return 2.0, replays

    monkeypatch.setattr(chunked.decode.gpu_timing, "graph_replay_ms", graph_replay_ms)
    p = small_problem(page_size)
    monkeypatch.setattr(chunked.decode, "COLD_BYTES", p.cache_bytes() + p.q_bytes() + 1)
    monkeypatch.setattr(chunked, "CHECK_ROWS", 16)
    a = args()
    log = []
    rows = chunked.run_problem(torch, p, a, chunked.calls_of(p, a.peers), log.append, device="cpu")
    assert [r["impl"] for r in rows] == (["hopattn"] if page_size else ["hopattn", "fa2"]), log
    assert all(r["check"] == "pass" and r["ms"] == 2.0 and r["page_size"] == page_size for r in rows), rows
    assert all(len(outs) == 2 and outs[0].shape == (70, 4, 32) for outs in timed)  # two copies
    assert rows[0]["tflops"] == p.flops() / 2e9
