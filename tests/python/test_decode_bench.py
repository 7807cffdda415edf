"""bench/decode.py's parts that need neither PyTorch nor a GPU: the command line, the problem list
(contiguous, paged, append), byte counts and memory estimates, rows, the markdown tables and report,
and compare.py's `decode` subcommand. With PyTorch installed, the tensor helpers, the checks and a
whole problem's rows run on CPU tensors, hopattn replaced by a plain PyTorch stand-in."""

import json
import subprocess
import sys
import types

import pytest

from bench_scripts import REPO, import_without, load, table_rows

GIB = 1 << 30

decode = load("decode")


def args(*argv):
    return decode.parser().parse_args(["--json", "out.json", *argv])


def problems(*argv):
    return decode.build_problems(args(*argv))


def test_imports_without_torch():
    out = import_without("decode", ["torch"], "decode.PEERS")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "('cudnn', 'fa2')"


def test_defaults():
    a = args()
    assert (a.seqlens_q, a.seqlens_k, a.batches) == ([1, 4, 16], [8192, 32768, 131072], [1, 4, 16, 64])
    assert a.heads == [(32, 8), (64, 8), (32, 1)] and a.hdims == [128, 64, 256]
    assert (a.dtype, a.causal, a.peers) == (["bf16"], [True], ["cudnn", "fa2"])
    assert a.page_sizes == [0, 1, 16, 64, 256] and not a.no_append
    shapes = 3 * 3 * 3 * 3 * 4  # head dims, head pairs, query lengths, cache lengths, batches
    # Page sizes 0, 16, 64, 256 at every shape; page 1 at the smallest cache (8k) alone.
    assert len(problems()) == 4 * shapes + shapes // 3
    first = problems()[:6]
    head = first[0]
    assert (head.dtype, head.hdim, head.causal, head.heads, head.heads_kv) == ("bf16", 128, True, 32, 8)
    # Each shape is followed by its paged problems.
    assert [(p.seqlen_k, p.batch, p.page_size) for p in first] == [
        (8192, 1, 0), (8192, 1, 1), (8192, 1, 16), (8192, 1, 64), (8192, 1, 256), (8192, 4, 0)]
    assert {p.seqlen_k for p in problems() if p.page_size == 1} == {8192}


def test_options():
    a = args("--causal", "both", "--dtype", "bf16,fp16", "--heads", "16/16,8/2", "--seqlens-k", "4096",
             "--peers", "fa2", "--page-sizes", "64,0,64,16", "--no-append")
    assert a.causal == [False, True] and a.dtype == ["bf16", "fp16"] and a.heads == [(16, 16), (8, 2)]
    assert a.seqlens_k == [4096] and a.peers == ["fa2"] and a.page_sizes == [0, 16, 64] and a.no_append
    assert args("--page-sizes", "0").page_sizes == [0] and args("--peers", "").peers == []
    for bad in (["--heads", "32/5"], ["--heads", "32"], ["--peers", "fa3"], ["--causal", "maybe"],
                ["--page-sizes", "-16"], ["--page-sizes", "x"]):
        with pytest.raises(SystemExit):
            args(*bad)
    with pytest.raises(SystemExit):
        decode.parser().parse_args([])  # --json is required


def test_page_one_at_the_smallest_selected_cache():
    selected = problems("--seqlens-k", "32768,131072", "--page-sizes", "1,64", "--batches", "4", "--hdims", "128",
                        "--heads", "32/8", "--seqlens-q", "1")
    assert [(p.seqlen_k, p.page_size) for p in selected] == [(32768, 1), (32768, 64), (131072, 64)]
    # Contiguous rows only: today's rows, nothing else.
    assert {p.page_size for p in problems("--page-sizes", "0")} == {0}


def test_decode_layout_options_reach_hopattn():
    assert decode.hopattn_options(args()) == {"num_splits": 0, "pack_gqa": None}  # the library's choice
    a = args("--num-splits", "7", "--pack-gqa", "off")
    assert decode.hopattn_options(a) == {"num_splits": 7, "pack_gqa": False}
    with pytest.raises(SystemExit):
        args("--pack-gqa", "maybe")


def test_quick_is_a_handful():
    quick = problems("--quick")
    shapes = [p for p in quick if p.page_size == 0]
    assert len(shapes) == 12
    assert {p.seqlen_q for p in quick} == {1, 4} and {p.seqlen_k for p in quick} == {32768}
    assert {p.batch for p in quick} == {1, 16} and {p.hdim for p in quick} == {128}
    assert {(p.heads, p.heads_kv) for p in quick} == {(32, 8), (64, 8), (32, 1)}
    # Every quick shape at every page size (its one cache length is the smallest).
    assert len(quick) == 12 * 5
    # Nearest among what was selected.
    assert {(p.seqlen_k, p.batch) for p in problems("--quick", "--seqlens-k", "8192,131072", "--batches", "2,64")} \
        == {(8192, 2), (8192, 64)}


def test_calls():
    contiguous = decode.Problem("bf16", 128, True, 16, 32, 8, 1, 32768)
    paged = decode.Problem("bf16", 128, True, 16, 32, 8, 1, 32768, page_size=64)
    assert decode.calls_of(contiguous, ["cudnn", "fa2"], append=True) == [
        ("hopattn", False), ("hopattn_kvcache", False), ("cudnn", False), ("fa2", False), ("hopattn_kvcache", True)]
    # The peers take no paged cache; the paged kvcache call is "hopattn".
    assert decode.calls_of(paged, ["cudnn", "fa2"], append=True) == [("hopattn", False), ("hopattn", True)]
    assert decode.calls_of(paged, ["fa2"], append=False) == [("hopattn", False)]
    # Append rows are decode steps of one new token: query length 1 only.
    speculative = decode.Problem("bf16", 128, True, 16, 32, 8, 4, 32768, page_size=16)
    assert decode.calls_of(speculative, [], append=True) == [("hopattn", False)]


def test_bytes_and_memory():
    big = decode.Problem("bf16", 128, True, 64, 64, 8, 16, 131072)
    calls = [("hopattn", False), ("hopattn_kvcache", False), ("cudnn", False), ("fa2", False)]
    assert big.kv_bytes() == big.cache_bytes() == 32 * GIB
    assert big.q_bytes() == 64 * 16 * 64 * 128 * 2
    assert big.copies() == 1
    assert 32 * GIB < big.memory_needed(calls) < 33 * GIB
    assert big.fits(calls, 139 * GIB) and not big.fits(calls[:1], 32 * GIB)
    d256 = decode.Problem("fp16", 256, True, 64, 32, 8, 16, 131072)
    assert d256.kv_bytes() == 64 * GIB and d256.fits(calls, 139 * GIB)
    # A cache smaller than the L2 is timed on copies adding up to COLD_BYTES.
    small = decode.Problem("bf16", 128, True, 1, 32, 1, 1, 8192)
    assert small.kv_bytes() == 4 << 20
    assert small.copies() == 64 and small.copies() * (small.kv_bytes() + small.q_bytes()) >= decode.COLD_BYTES
    assert small.memory_needed(calls[:1]) < decode.COLD_BYTES + (64 << 20)


def test_paged_bytes():
    # Pages are whole: 1000 keys on pages of 64 take 16 pages; the page table takes 4 bytes a page.
    p = decode.Problem("bf16", 128, True, 2, 32, 8, 1, 1000, page_size=64)
    per_key = 2 * 8 * 128 * 2  # K and V of one position
    assert p.kv_bytes() == 2 * 1000 * per_key  # TB/s counts the keys read, as contiguous
    assert p.cache_bytes() == 2 * 16 * 64 * per_key + 4 * 2 * 16
    page1 = decode.Problem("bf16", 128, True, 64, 32, 8, 1, 8192, page_size=1)
    assert page1.cache_bytes() == page1.kv_bytes() + 4 * 64 * 8192
    assert page1.copies() == 1  # 256 MiB of K+V (and a 2 MiB table) is cold already


def test_row():
    p = decode.Problem("bf16", 128, True, 16, 32, 8, 4, 32768)
    row = p.row("hopattn", 2.0, check="pass", reps=50)
    assert row == {"mode": "decode", "page_size": 0, "impl": "hopattn", "direction": "fwd", "dtype": "bf16",
                   "hdim": 128, "causal": True, "batch": 16, "heads": 32, "heads_kv": 8, "seqlen_q": 4,
                   "seqlen_k": 32768, "seqlen_new": 0, "rotary": False, "ms": 2.0, "tb_per_s": p.kv_bytes() / 2e9,
                   "check": "pass", "reps": 50}
    assert row["tb_per_s"] == pytest.approx(2 * 16 * 32768 * 8 * 128 * 2 / 2e-3 / 1e12)
    untimed = p.row("hopattn", None, check="FAIL: x")
    assert (untimed["ms"], untimed["tb_per_s"], untimed["reps"], untimed["check"]) == (None, None, None, "FAIL: x")
    assert decode.Problem.of_row(row).describe() == p.describe() == "bf16 d128 causal h32/8 b16 q4 k32768"
    paged = decode.Problem("bf16", 128, True, 16, 32, 8, 1, 32768, page_size=16)
    appended = paged.row("hopattn", 1.0, check="pass", reps=50, append=True)
    assert (appended["page_size"], appended["seqlen_new"], appended["rotary"]) == (16, 1, True)
    assert appended["tb_per_s"] == paged.kv_bytes() / 1e9  # the step attends to seqlen_k keys all the same
    assert decode.describe_row(appended) == "hopattn bf16 d128 causal h32/8 b16 q1 k32768 page16 +1 key, rotary"
    # Rows of files from before paging have no page_size.
    old = {k: v for k, v in row.items() if k not in ("page_size", "seqlen_new", "rotary")}
    assert decode.Problem.of_row(old).page_size == 0 and decode.problem_key(old) == decode.problem_key(row)


def decode_row(impl, batch, ms, check="pass", seqlen_q=1, page_size=0, append=False):
    p = decode.Problem("bf16", 128, True, batch, 32, 8, seqlen_q, 32768, page_size)
    return p.row(impl, ms, check=check, reps=50, append=append)


def canned_rows():
    return [decode_row("hopattn", 16, 1.0), decode_row("cudnn", 16, 1.25), decode_row("fa2", 16, 1.1),
            decode_row("hopattn", 1, 0.1), decode_row("fa2", 1, 0.05, check="FAIL: out error 1 > bound 0.01"),
            decode_row("hopattn", 4, None, check="FAIL: out error 2 > bound 0.01"), decode_row("cudnn", 4, 0.5),
            decode_row("cudnn", 64, 3.0),  # no hopattn row: not a table row
            decode_row("hopattn", 16, 1.0, seqlen_q=4), decode_row("fa2", 16, 0.8, seqlen_q=4)]


def paged_rows():
    """Batch 16 (K+V 2 GiB) at every page size and appended; batch 1 (128 MiB) at page 1 and 16."""
    return [decode_row("hopattn_kvcache", 16, 1.02), decode_row("hopattn_kvcache", 16, 1.05, append=True),
            decode_row("hopattn", 16, 1.25, page_size=16), decode_row("hopattn", 16, 1.04, page_size=64),
            decode_row("hopattn", 16, 1.0, page_size=256), decode_row("hopattn", 16, 1.1, page_size=64, append=True),
            decode_row("hopattn", 1, 0.4, page_size=1),
            decode_row("hopattn", 1, None, check="FAIL: out error 3 > bound 0.01", page_size=16)]


def test_markdown_table():
    text = decode.markdown_table(canned_rows() + paged_rows())  # paged and append rows stay out of this table
    rows = table_rows(text)
    header = rows[0]
    assert header == ["dtype", "d", "causal", "heads", "batch", "seqlen_q", "seqlen_k", "hopattn", "cudnn", "fa2",
                      "best peer", "hopattn / best"]
    by_shape = {(r[4], r[5]): dict(zip(header, r)) for r in rows[1:]}
    assert set(by_shape) == {("1", "1"), ("4", "1"), ("16", "1"), ("16", "4")}
    tb = decode.Problem("bf16", 128, True, 16, 32, 8, 1, 32768).kv_bytes() / 1e9  # TB/s at 1 ms
    row = by_shape[("16", "1")]
    assert (row["hopattn"], row["cudnn"], row["fa2"]) == (f"{tb:.2f}", f"{tb / 1.25:.2f}", f"{tb / 1.1:.2f}")
    assert (row["best peer"], row["hopattn / best"]) == ("fa2", "1.100")
    # A peer that failed its check is shown but not compared with.
    row = by_shape[("1", "1")]
    assert row["fa2"].endswith("(check failed)") and row["best peer"] == "" and row["hopattn / best"] == ""
    row = by_shape[("4", "1")]
    assert row["hopattn"] == "not timed" and row["cudnn"] != "" and row["hopattn / best"] == ""
    assert by_shape[("16", "4")]["hopattn / best"] == "0.800"
    assert "Geomean of hopattn / best peer over 2 rows: 0.938" in text


def test_paged_table():
    text = decode.paged_table(canned_rows() + paged_rows())
    tables = text.split("\n\n")
    rows = table_rows(tables[0])
    header = rows[0]
    assert header == ["dtype", "d", "causal", "heads", "batch", "seqlen_q", "seqlen_k", "K+V MiB", "contiguous",
                      "kvcache contiguous", "page 1", "page 1 / contiguous", "page 16", "page 16 / contiguous",
                      "page 64", "page 64 / contiguous", "page 256", "page 256 / contiguous"]
    by_batch = {r[4]: dict(zip(header, r)) for r in rows[1:]}
    assert set(by_batch) == {"1", "16"}  # shapes with a paged row only
    tb = decode.Problem("bf16", 128, True, 16, 32, 8, 1, 32768).kv_bytes() / 1e9  # TB/s at 1 ms, batch 16
    big = by_batch["16"]
    assert (big["K+V MiB"], big["contiguous"], big["kvcache contiguous"]) == ("2048", f"{tb:.2f}", f"{tb / 1.02:.2f}")
    assert (big["page 16"], big["page 16 / contiguous"]) == (f"{tb / 1.25:.2f}", "0.800")
    assert (big["page 64 / contiguous"], big["page 256 / contiguous"]) == (f"{1 / 1.04:.3f}", "1.000")
    assert (big["page 1"], big["page 1 / contiguous"]) == ("", "")
    small = by_batch["1"]
    assert (small["K+V MiB"], small["page 1"], small["page 1 / contiguous"]) == ("128", f"{tb / 16 / 0.4:.2f}", "0.250")
    assert (small["page 16"], small["page 16 / contiguous"]) == ("not timed", "")
    summary = table_rows(tables[1])
    assert summary[0] == ["page size", "rows", "geomean paged / contiguous", "min paged / contiguous",
                          "rows with K+V >= 256 MiB", "min TB/s there"]
    by_page = {r[0]: r for r in summary[1:]}
    assert by_page["1"] == ["1", "1", "0.250", "0.250", "0", ""]  # 128 MiB: not a large row
    assert by_page["16"] == ["16", "1", "0.800", "0.800", "1", f"{tb / 1.25:.2f}"]
    assert by_page["64"][1:4] == ["1", f"{1 / 1.04:.3f}", f"{1 / 1.04:.3f}"]
    assert decode.paged_table(canned_rows()) == ""  # nothing paged, no table


def test_append_table():
    text = decode.append_table(canned_rows() + paged_rows())
    rows = table_rows(text)
    header = rows[0]
    assert header == ["dtype", "d", "causal", "heads", "batch", "seqlen_q", "seqlen_k", "page size", "attend only",
                      "+1 key, rotary", "ratio"]
    by_page = {r[7]: dict(zip(header, r)) for r in rows[1:]}
    assert set(by_page) == {"0", "64"}
    tb = decode.Problem("bf16", 128, True, 16, 32, 8, 1, 32768).kv_bytes() / 1e9
    # Page 0 compares the kvcache call with itself, not with hopattn.attention.
    assert (by_page["0"]["attend only"], by_page["0"]["+1 key, rotary"]) == (f"{tb / 1.02:.2f}", f"{tb / 1.05:.2f}")
    assert by_page["0"]["ratio"] == f"{1.02 / 1.05:.3f}"
    assert by_page["64"]["ratio"] == f"{1.04 / 1.1:.3f}"
    assert "Append / attend only over 2 rows: geomean" in text
    assert decode.append_table(canned_rows()) == ""


def test_untimed_lines():
    text = decode.untimed_lines(canned_rows() + paged_rows())
    assert text.splitlines()[0] == "Not timed (check failed or error):"
    assert "- hopattn bf16 d128 causal h32/8 b4 q1 k32768: FAIL: out error 2 > bound 0.01" in text
    assert "- hopattn bf16 d128 causal h32/8 b1 q1 k32768 page16: FAIL: out error 3 > bound 0.01" in text
    assert "cudnn" not in text and decode.untimed_lines(canned_rows()[:3]) == ""


def test_report(tmp_path):
    path = tmp_path / "decode-run.json"
    env = {"gpu": "NVIDIA H200 (canned)", "torch": "2.9.0", "command": "python3 bench/compare.py decode --quick"}
    path.write_text(json.dumps({"env": env, "rows": canned_rows() + paged_rows()}))
    md_path = decode.write_report(path, tmp_path / "report", "decode-run")
    assert md_path == tmp_path / "report" / "decode-run.md"
    text = md_path.read_text()
    assert "NVIDIA H200 (canned)" in text and "`python3 bench/compare.py decode --quick`" in text
    assert table_rows(text)[0][-1] == "hopattn / best"
    assert "## Paged KV cache" in text and "## Append: decode step with one new key and rotary embedding" in text
    assert text.index("## Paged KV cache") < text.index("## Append") < text.index("Not timed")
    # Without paged or append rows, the report is the contiguous table alone.
    assert "##" not in decode.report_markdown(canned_rows())


def test_compare_dispatches_decode(tmp_path):
    # compare.py hands `decode` to bench/decode.py: --help needs nothing, a run without PyTorch says so.
    out = subprocess.run([sys.executable, str(REPO / "bench" / "compare.py"), "decode", "--help"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert "--seqlens-k" in out.stdout and "--page-sizes" in out.stdout and "compare.py decode" in out.stdout
    code = ("import sys; sys.modules['torch'] = None; "
            f"sys.path.insert(0, {str(REPO / 'bench')!r}); import compare; "
            f"sys.exit(compare.main(['decode', '--json', {str(tmp_path / 'x.json')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1 and "compare.py decode: needs PyTorch" in out.stderr
    assert not (tmp_path / "x.json").exists()


# --------------------------------------------------------------------------------------------
# On CPU tensors (PyTorch installed)
# --------------------------------------------------------------------------------------------

def cpu_torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed: decode.py's tensor parts are untested here")


@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_checker_on_cpu(seqlen_q):
    # The check on tiny CPU tensors: PyTorch's math attention with a bottom-right causal mask passes
    # FA3's rule, SDPA's top-left is_causal (which hides the cache from a decode row) fails it.
    torch = cpu_torch()
    p = decode.Problem("bf16", 32, True, 2, 4, 2, seqlen_q, 64)
    t = decode.Tensors(torch, p, seed=1, device="cpu")
    checker = decode.Checker(torch, p, t)
    q, k, v = (x.float().transpose(1, 2) for x in (t.q, t.k, t.v))
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    visible = torch.ones(seqlen_q, 64, dtype=torch.bool).tril_(64 - seqlen_q)
    out = sdpa(q, k, v, attn_mask=visible).transpose(1, 2).to(t.q.dtype)
    assert checker.check(out) == "pass"
    top_left = sdpa(q, k, v, is_causal=True).transpose(1, 2).to(t.q.dtype)
    assert checker.check(top_left).startswith("FAIL: out error")


def test_paged_cache_on_cpu():
    # The page table is a permutation of the pages; gathering through it gives each position of each
    # sequence its own page row, and positions past a sequence's length are left out.
    torch = cpu_torch()
    gen = torch.Generator().manual_seed(3)
    lengths = [50, 17, 64]
    k, v, table = decode.paged_cache(torch, lengths, 16, 2, 8, torch.bfloat16, gen, "cpu")
    assert k.shape == v.shape == (4 + 2 + 4, 16, 2, 8) and table.shape == (3, 4) and table.dtype == torch.int32
    used = [table[b, :n].tolist() for b, n in enumerate((4, 2, 4))]
    assert sorted(sum(used, [])) == list(range(10))  # every page once
    assert table[1, 2:].tolist() == [0, 0]  # past a sequence's pages: a valid page, never read
    assert table.flatten()[:4].tolist() != [0, 1, 2, 3]  # shuffled
    for b, n in enumerate(lengths):
        keys = decode.gather_pages(k, table[b], n, 1)
        assert keys.shape == (n, 8)
        for j in (0, n // 2, n - 1):
            assert torch.equal(keys[j], k[table[b, j // 16], j % 16, 1])


@pytest.mark.parametrize("page_size", [1, 16, 24])
def test_paged_tensors_on_cpu(page_size):
    # A paged problem's logical cache, read through the table, is what kv_at and the checker see.
    torch = cpu_torch()
    p = decode.Problem("bf16", 32, True, 3, 4, 2, 1, 40, page_size)
    t = decode.Tensors(torch, p, seed=2, device="cpu")
    assert t.page_table.shape == (3, -(-40 // page_size)) and t.cache_seqlens.tolist() == [40] * 3
    k, v = t.logical_kv(2, 1)
    assert k.shape == v.shape == (40, 32)
    k_at, v_at = t.kv_at(37)
    assert torch.equal(k_at[2, 1], k[37]) and torch.equal(v_at[2, 1], v[37])
    # The contiguous reference on the gathered cache passes; the pages in storage order do not.
    checker = decode.Checker(torch, p, t)
    logical = torch.stack([torch.stack([t.logical_kv(b, h)[0] for h in range(2)], 1) for b in range(3)])
    values = torch.stack([torch.stack([t.logical_kv(b, h)[1] for h in range(2)], 1) for b in range(3)])
    contiguous = types.SimpleNamespace(q=t.q, k=logical, v=values)
    assert checker.check(plain_attention(torch, contiguous.q, contiguous.k, contiguous.v, causal=True)) == "pass"
    storage = t.k.flatten(0, 1)[:3 * 40].view(3, 40, 2, 32)
    assert checker.check(plain_attention(torch, t.q, storage, values, causal=True)).startswith("FAIL")


def test_rotary_tables_on_cpu():
    torch = cpu_torch()
    p = decode.Problem("bf16", 64, True, 1, 4, 2, 1, 128)
    cos, sin = decode.AppendStep.tables(torch, p, "cpu")
    assert cos.shape == sin.shape == (128, 32) and cos.dtype == torch.bfloat16
    assert torch.equal(cos[0], torch.ones(32, dtype=torch.bfloat16)) and torch.equal(sin[0], torch.zeros_like(sin[0]))
    # Pair i turns at ROTARY_BASE^(-2i/d) per position: the first pair by 1 radian.
    assert cos[1, 0].item() == pytest.approx(0.5403, abs=4e-3) and sin[1, 0].item() == pytest.approx(0.8415, abs=4e-3)
    # A rotation keeps the length of each pair (i, i + d/2), within the tables' bf16 rounding.
    x = torch.randn(5, 64, dtype=torch.float64)
    y = decode.rotate(torch, x, cos[100].double(), sin[100].double(), torch.float64)
    assert torch.allclose(x[:, :32] ** 2 + x[:, 32:] ** 2, y[:, :32] ** 2 + y[:, 32:] ** 2, rtol=2e-2)
    assert not torch.allclose(x, y, rtol=0.1)


# A stand-in for the hopattn package on CPU, written from docs/semantics.md ("KV caches") rather than
# from decode.py's helpers: plain PyTorch attention, the cache updated in place, rotary embedding
# in the rotate-half form, rotated in float32 and rounded once.

def plain_attention(torch, q, k, v, causal):
    """(batch, seqlen_q, heads, d) against (batch, seqlen_k, heads_kv, d), bottom-right causal."""
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool).tril_(seqlen_k - seqlen_q) if causal else None
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return out.transpose(1, 2)


def signature_checked(function, real):
    """function, after binding each call's arguments to the real hopattn function's signature (the
    package in this checkout, when it has the function): a keyword decode.py passes that the real
    function lacks fails here."""
    import inspect

    signature = inspect.signature(real) if real is not None else None

    def call(*args, **kwargs):
        if signature is not None:
            signature.bind(*args, **kwargs)
        return function(*args, **kwargs)
    return call


def fake_hopattn(torch, rotate_q=True):
    def rotary(x, cos, sin):  # x (..., d), cos/sin (d/2,): NeoX pairs (i, i + d/2), as x cos + rotate_half(x) sin
        half = x.shape[-1] // 2
        rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        cos, sin = (torch.cat([c, c]).float() for c in (cos, sin))
        return (x.float() * cos + rotated_half.float() * sin).to(x.dtype)

    def out_dtype(q):  # FP8 inputs give a bfloat16 out
        return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype

    def attention(q, k, v, *, causal=False, deterministic=False, num_splits=0, pack_gqa=None):
        return plain_attention(torch, q, k, v, causal).to(out_dtype(q))

    def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, rotary_cos=None, rotary_sin=None,
                               cache_seqlens=None, page_table=None, causal=False, rotary_interleaved=True,
                               num_splits=0, pack_gqa=None):
        assert rotary_cos is None or not rotary_interleaved, "decode.py asks for the GPT-NeoX layout"
        page_size = k_cache.shape[1]
        out = torch.empty_like(q, dtype=out_dtype(q))
        for b in range(q.shape[0]):
            start = int(cache_seqlens[b])
            new = 0 if k is None else k.shape[1]

            def slot(j):
                return (int(page_table[b, j // page_size]), j % page_size) if page_table is not None else (b, j)

            qb = q[b]
            for i in range(new):
                key = k[b, i] if rotary_cos is None else rotary(k[b, i], rotary_cos[start + i], rotary_sin[start + i])
                k_cache[slot(start + i)] = key
                v_cache[slot(start + i)] = v[b, i]
            if rotary_cos is not None and rotate_q:
                qb = torch.stack([rotary(qb[i], rotary_cos[start + i], rotary_sin[start + i])
                                  for i in range(qb.shape[0])])
            keys = torch.stack([k_cache[slot(j)] for j in range(start + new)])
            values = torch.stack([v_cache[slot(j)] for j in range(start + new)])
            out[b] = plain_attention(torch, qb[None], keys[None], values[None], causal)[0].to(out.dtype)
        return out

    import hopattn  # the real package (conftest.py), for its signatures

    real = {name: getattr(hopattn, name) if hopattn.torch_available() else None
            for name in ("attention", "attention_with_kvcache")}
    return types.SimpleNamespace(attention=signature_checked(attention, real["attention"]),
                                 attention_with_kvcache=signature_checked(attention_with_kvcache,
                                                                          real["attention_with_kvcache"]))


def fake_run(torch, monkeypatch, p, argv=(), rotate_q=True):
    """decode.run_problem on CPU with the stand-in hopattn and the timing replaced by one call of
    each copy; two copies of the inputs. Returns the rows and the calls the timing got."""
    monkeypatch.setitem(sys.modules, "hopattn", fake_hopattn(torch, rotate_q))
    timed = []

    def graph_replay_ms(torch, calls, warmup, replays, measurements):
        timed.append([call() for call in calls])
        return 0.5, replays

    monkeypatch.setattr(decode.gpu_timing, "graph_replay_ms", graph_replay_ms)
    monkeypatch.setattr(decode, "COLD_BYTES", p.cache_bytes() + p.q_bytes() + 1)
    a = args(*argv)
    log = []
    rows = decode.run_problem(torch, p, a, decode.calls_of(p, a.peers, not a.no_append), log.append, device="cpu")
    return rows, timed, log


@pytest.mark.parametrize("page_size", [0, 1, 16, 48])
def test_rows_of_a_problem_on_cpu(monkeypatch, page_size):
    # Every call of a problem is made, checked and "timed" on its copies; rows carry page_size,
    # seqlen_new and rotary, and every check passes against the stand-in.
    torch = cpu_torch()
    p = decode.Problem("bf16", 32, True, 2, 4, 2, 1, 100, page_size)
    assert p.copies() > 1
    rows, timed, log = fake_run(torch, monkeypatch, p, ["--peers", "fa2"])
    expected = [("hopattn", 0, False), ("hopattn_kvcache", 0, False), ("fa2", 0, False), ("hopattn_kvcache", 1, True)]
    if page_size:
        expected = [("hopattn", 0, False), ("hopattn", 1, True)]
    assert [(r["impl"], r["seqlen_new"], r["rotary"]) for r in rows] == expected, log
    assert all(r["check"] == "pass" and r["ms"] == 0.5 and r["page_size"] == page_size for r in rows), rows
    assert all(len(outs) == 2 for outs in timed)  # both copies


@pytest.mark.parametrize("page_size", [0, 64])
def test_fp8_rows_of_a_problem_on_cpu(monkeypatch, page_size):
    # e4m3 caches: hopattn's calls only (SDPA takes no FP8), no append row (FP8 caches take no
    # rotary yet), checked with FP8's naive bound, their K+V counted at one byte an element.
    torch = cpu_torch()
    p = decode.Problem("e4m3", 32, True, 2, 4, 2, 1, 100, page_size)
    rows, timed, log = fake_run(torch, monkeypatch, p, ["--peers", "fa2"])
    expected = ["hopattn"] if page_size else ["hopattn", "hopattn_kvcache"]
    assert [r["impl"] for r in rows] == expected, log
    assert all(r["check"] == "pass" and r["dtype"] == "e4m3" for r in rows), rows
    assert p.kv_bytes() == 2 * 2 * 100 * 2 * 32
    assert all(out.dtype == torch.bfloat16 for outs in timed for out in outs)


def test_append_check_on_cpu(monkeypatch):
    # The step's reference rotates q: a stand-in that leaves q alone fails the output check.
    torch = cpu_torch()
    p = decode.Problem("bf16", 32, True, 2, 4, 2, 1, 100, 16)
    rows, _, _ = fake_run(torch, monkeypatch, p, rotate_q=False)
    assert rows[0]["check"] == "pass" and rows[1]["check"].startswith("FAIL: out error")
    assert rows[1]["ms"] is None  # a hopattn mismatch is not timed


def test_append_slot_check_on_cpu():
    # The appended slot holds the new key rotated (within one rounding) and the new value; a key
    # written unrotated, or a value left out, fails.
    torch = cpu_torch()
    p = decode.Problem("bf16", 64, True, 3, 4, 2, 1, 40, 8)
    t = decode.Tensors(torch, p, seed=5, device="cpu")
    cos, sin = decode.AppendStep.tables(torch, p, "cpu")
    step = decode.AppendStep(torch, p, cos, sin, seed=6, device="cpu")
    pages = t.page_table[:, step.position // 8].long()
    rows = step.position % 8
    t.k[pages, rows] = step.k_new[:, 0]
    t.v[pages, rows] = step.v_new[:, 0]
    assert step.check_slot(torch, t).startswith("FAIL: appended key")
    t.k[pages, rows] = decode.rotate(torch, step.k_new[:, 0], cos[step.position], sin[step.position], torch.bfloat16)
    assert step.check_slot(torch, t) == "pass"
    t.v[pages[0], rows] = 0
    assert step.check_slot(torch, t) == "FAIL: appended value differs from v"
