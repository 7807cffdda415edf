"""bench/decode.py's parts that need neither PyTorch nor a GPU: the command line, the problem list,
byte counts and memory estimates, rows, the markdown table and report, and compare.py's `decode`
subcommand. The reference check runs on CPU tensors when PyTorch is installed."""

import json
import subprocess
import sys

import pytest

from bench_scripts import REPO, import_without, load, table_rows

GIB = 1 << 30

decode = load("decode")


def problems(*argv):
    return decode.build_problems(decode.parser().parse_args(["--json", "out.json", *argv]))


def test_imports_without_torch():
    out = import_without("decode", ["torch"], "decode.PEERS")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "('cudnn', 'fa2')"


def test_defaults():
    a = decode.parser().parse_args(["--json", "out.json"])
    assert (a.seqlens_q, a.seqlens_k, a.batches) == ([1, 4, 16], [8192, 32768, 131072], [1, 4, 16, 64])
    assert a.heads == [(32, 8), (64, 8), (32, 1)] and a.hdims == [128, 64, 256]
    assert (a.dtype, a.causal, a.peers) == (["bf16"], [True], ["cudnn", "fa2"])
    assert len(problems()) == 3 * 3 * 3 * 3 * 4  # head dims, head pairs, query lengths, cache lengths, batches
    first = problems()[0]
    assert (first.dtype, first.hdim, first.causal, first.heads, first.heads_kv) == ("bf16", 128, True, 32, 8)


def test_options():
    a = decode.parser().parse_args(["--json", "x.json", "--causal", "both", "--dtype", "bf16,fp16", "--heads",
                                    "16/16,8/2", "--seqlens-k", "4096", "--peers", "fa2"])
    assert a.causal == [False, True] and a.dtype == ["bf16", "fp16"] and a.heads == [(16, 16), (8, 2)]
    assert a.seqlens_k == [4096] and a.peers == ["fa2"]
    for bad in (["--heads", "32/5"], ["--heads", "32"], ["--peers", "fa3"], ["--causal", "maybe"]):
        with pytest.raises(SystemExit):
            decode.parser().parse_args(["--json", "x.json", *bad])
    with pytest.raises(SystemExit):
        decode.parser().parse_args([])  # --json is required


def test_decode_layout_options_reach_hopattn():
    a = decode.parser().parse_args(["--json", "x.json"])
    assert decode.hopattn_options(a) == {"num_splits": 0, "pack_gqa": None}  # the library's choice
    a = decode.parser().parse_args(["--json", "x.json", "--num-splits", "7", "--pack-gqa", "off"])
    assert decode.hopattn_options(a) == {"num_splits": 7, "pack_gqa": False}
    with pytest.raises(SystemExit):
        decode.parser().parse_args(["--json", "x.json", "--pack-gqa", "maybe"])


def test_quick_is_a_handful():
    quick = problems("--quick")
    assert len(quick) == 12
    assert {p.seqlen_q for p in quick} == {1, 4} and {p.seqlen_k for p in quick} == {32768}
    assert {p.batch for p in quick} == {1, 16} and {p.hdim for p in quick} == {128}
    assert {(p.heads, p.heads_kv) for p in quick} == {(32, 8), (64, 8), (32, 1)}
    # Nearest among what was selected.
    assert {(p.seqlen_k, p.batch) for p in problems("--quick", "--seqlens-k", "8192,131072", "--batches", "2,64")} \
        == {(8192, 2), (8192, 64)}


def test_bytes_and_memory():
    big = decode.Problem("bf16", 128, True, 64, 64, 8, 16, 131072)
    assert big.kv_bytes() == 32 * GIB
    assert big.q_bytes() == 64 * 16 * 64 * 128 * 2
    assert big.copies() == 1
    assert 32 * GIB < big.memory_needed(["hopattn", "cudnn", "fa2"]) < 33 * GIB
    assert big.fits(["hopattn", "cudnn", "fa2"], 139 * GIB) and not big.fits(["hopattn"], 32 * GIB)
    d256 = decode.Problem("fp16", 256, True, 64, 32, 8, 16, 131072)
    assert d256.kv_bytes() == 64 * GIB and d256.fits(["hopattn", "cudnn", "fa2"], 139 * GIB)
    # A cache smaller than the L2 is timed on copies adding up to COLD_BYTES.
    small = decode.Problem("bf16", 128, True, 1, 32, 1, 1, 8192)
    assert small.kv_bytes() == 4 << 20
    assert small.copies() == 64 and small.copies() * (small.kv_bytes() + small.q_bytes()) >= decode.COLD_BYTES
    assert small.memory_needed(["hopattn"]) < decode.COLD_BYTES + (64 << 20)


def test_row():
    p = decode.Problem("bf16", 128, True, 16, 32, 8, 4, 32768)
    row = p.row("hopattn", 2.0, check="pass", reps=50)
    assert row == {"mode": "decode", "page_size": 0, "impl": "hopattn", "direction": "fwd", "dtype": "bf16",
                   "hdim": 128, "causal": True, "batch": 16, "heads": 32, "heads_kv": 8, "seqlen_q": 4,
                   "seqlen_k": 32768, "ms": 2.0, "tb_per_s": p.kv_bytes() / 2e9, "check": "pass", "reps": 50}
    assert row["tb_per_s"] == pytest.approx(2 * 16 * 32768 * 8 * 128 * 2 / 2e-3 / 1e12)
    untimed = p.row("hopattn", None, check="FAIL: x")
    assert (untimed["ms"], untimed["tb_per_s"], untimed["reps"], untimed["check"]) == (None, None, None, "FAIL: x")
    assert decode.Problem.of_row(row).describe() == p.describe() == "bf16 d128 causal h32/8 b16 q4 k32768"


def canned_rows():
    def row(impl, batch, ms, check="pass", seqlen_q=1):
        return decode.Problem("bf16", 128, True, batch, 32, 8, seqlen_q, 32768).row(impl, ms, check=check, reps=50)

    return [row("hopattn", 16, 1.0), row("cudnn", 16, 1.25), row("fa2", 16, 1.1),
            row("hopattn", 1, 0.1), row("fa2", 1, 0.05, check="FAIL: out error 1 > bound 0.01"),
            row("hopattn", 4, None, check="FAIL: out error 2 > bound 0.01"), row("cudnn", 4, 0.5),
            row("cudnn", 64, 3.0),  # no hopattn row: not a table row
            row("hopattn", 16, 1.0, seqlen_q=4), row("fa2", 16, 0.8, seqlen_q=4)]


def test_markdown_table():
    text = decode.markdown_table(canned_rows())
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
    assert "- bf16 d128 causal h32/8 b4 q1 k32768: FAIL: out error 2 > bound 0.01" in text


def test_report(tmp_path):
    path = tmp_path / "decode-run.json"
    env = {"gpu": "NVIDIA H200 (canned)", "torch": "2.9.0", "command": "python3 bench/compare.py decode --quick"}
    path.write_text(json.dumps({"env": env, "rows": canned_rows()}))
    md_path = decode.write_report(path, tmp_path / "report", "decode-run")
    assert md_path == tmp_path / "report" / "decode-run.md"
    text = md_path.read_text()
    assert "NVIDIA H200 (canned)" in text and "`python3 bench/compare.py decode --quick`" in text
    assert table_rows(text)[0][-1] == "hopattn / best"


def test_compare_dispatches_decode(tmp_path):
    # compare.py hands `decode` to bench/decode.py: --help needs nothing, a run without PyTorch says so.
    out = subprocess.run([sys.executable, str(REPO / "bench" / "compare.py"), "decode", "--help"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert "--seqlens-k" in out.stdout and "compare.py decode" in out.stdout
    code = ("import sys; sys.modules['torch'] = None; "
            f"sys.path.insert(0, {str(REPO / 'bench')!r}); import compare; "
            f"sys.exit(compare.main(['decode', '--json', {str(tmp_path / 'x.json')!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1 and "compare.py decode: needs PyTorch" in out.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_checker_on_cpu(seqlen_q):
    # The check on tiny CPU tensors: PyTorch's math attention with a bottom-right causal mask passes
    # FA3's rule, SDPA's top-left is_causal (which hides the cache from a decode row) fails it.
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: decode.py's checker is untested here")
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
