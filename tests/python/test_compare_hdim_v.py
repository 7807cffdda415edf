"""bench/compare.py's problems with V's own head dim (--hdim-pairs): the option, the problems it adds
beside the sweep's, their FLOPs (both head dims), rows, keys and figure names, and the "V head dim"
section of the report from canned rows, all without a GPU or PyTorch; with PyTorch, the tensors, the
float64 reference with hdim_v != hdim against the formula and autograd, the checker on stand-in
implementations, and whole problems through run_problem on CPU tensors with stand-ins for hopattn
and FlashAttention-3 (SDPA's cuDNN backend, which has no CPU kernel, rejecting every shape there)."""

import json
import math
import sys
import types

import pytest

from bench_scripts import load, run_args as args, table_rows
from conftest import signature_bound_hopattn
from attention_formula import direct_attention, flat, spans_of
from test_compare_softcap import attend, section, write_canned


@pytest.fixture(scope="module")
def compare():
    return load("compare")


# ---- options and problems ----

def test_option_default_off(compare):
    assert args(compare).hdim_pairs == []
    problems = compare.build_problems(args(compare, "--dtype", "bf16"))
    assert all(p.hdim_v == p.hdim for p in problems)


@pytest.mark.parametrize("text, pairs", [("192x128", [(192, 128)]), ("192x128,128x64", [(192, 128), (128, 64)]),
                                         ("192x128, 192x128", [(192, 128)]), ("64x128", [(64, 128)])])
def test_option_parses(compare, text, pairs):
    assert args(compare, "--hdim-pairs", text).hdim_pairs == pairs


@pytest.mark.parametrize("text", ["192", "192x", "x128", "192x128x64", "0x128", "192x-1", "192*128", "192x192"])
def test_option_rejected(compare, text, capsys):
    # Not QKxV, a zero dim, and equal dims (the sweep's own problems: --hdims).
    with pytest.raises(SystemExit):
        args(compare, "--hdim-pairs", text)
    assert "--hdim-pairs" in capsys.readouterr().err


def test_pair_problems_beside_the_sweep(compare):
    # The run: d192 and (192, 128), seqlen 2k-16k, causal and not.
    a = args(compare, "--hdims", "192", "--hdim-pairs", "192x128", "--seqlens", "2048,4096,8192,16384",
             "--causal", "both", "--dtype", "bf16", "--extra", "")
    problems = compare.build_problems(a)
    assert len(problems) == 2 * 4 * 2
    # Each pair problem right after the d192 problem of the same seqlen and mask: the same heads
    # (hidden 2048 // 192), batch (16k tokens) and seqlen, V's head dim alone differing.
    for same, pair in zip(problems[::2], problems[1::2]):
        assert (same.hdim, same.hdim_v, pair.hdim, pair.hdim_v) == (192, 192, 192, 128)
        assert vars(pair) == dict(vars(same), hdim_v=128)
        assert same.heads == 10 and same.batch * same.seqlen == 16384
    assert [(p.causal, p.seqlen) for p in problems[::2]] == [(c, s) for c in (False, True)
                                                             for s in (2048, 4096, 8192, 16384)]


def test_pairs_without_their_head_dim(compare):
    # --hdims without 192: the pair problems alone, after the selected sweep's (whose d128 rows stay
    # what they were); several pairs of one QK head dim follow each other.
    a = args(compare, "--hdims", "128", "--hdim-pairs", "192x128,192x64,128x64", "--seqlens", "4096",
             "--causal", "yes", "--dtype", "bf16", "--extra", "")
    assert [(p.hdim, p.hdim_v, p.heads) for p in compare.build_problems(a)] == [
        (128, 128, 16), (128, 64, 16), (192, 128, 10), (192, 64, 10)]
    a = args(compare, "--hdims", "", "--hdim-pairs", "192x128", "--seqlens", "4096", "--causal", "no", "--dtype",
             "bf16", "--extra", "gqa,varlen")
    assert [(p.hdim, p.hdim_v, p.varlen) for p in compare.build_problems(a)] == [(192, 128, False)]


def test_quick_keeps_a_pair_row(compare):
    a = args(compare, "--hdims", "192", "--hdim-pairs", "192x128", "--causal", "yes", "--dtype", "bf16",
             "--extra", "", "--quick")
    assert [(p.hdim, p.hdim_v, p.seqlen) for p in compare.build_problems(a)] == [(192, 192, 4096), (192, 128, 4096)]


def test_pairs_get_the_copies(compare):
    a = args(compare, "--hdims", "192", "--hdim-pairs", "192x128", "--seqlens", "4096", "--causal", "yes",
             "--dtype", "bf16", "--extra", "", "--window", "128", "--sinks", "--softcap", "30")
    problems = compare.build_problems(a)
    assert len(problems) == 2 * 8
    assert [p.hdim_v for p in problems] == [192] * 8 + [128] * 8
    assert len({(p.window, p.sinks, p.softcap, p.hdim_v) for p in problems}) == 16


def test_flops(compare):
    # 2 * heads * (hdim + hdim_v) per visible pair: S = Q K^T in hdim, O = P V in hdim_v.
    pair = compare.Problem("bf16", 192, False, 8, 2048, 10, 10, hdim_v=128)
    assert pair.fwd_flops() == 2 * 10 * 2048 * 2048 * (192 + 128) * 8
    assert pair.variant(causal=True).fwd_flops() == pair.fwd_flops() / 2
    same = pair.variant(hdim_v=192)
    assert same.fwd_flops() == 4 * 10 * 2048 * 2048 * 192 * 8  # equal dims: the count it always was
    assert pair.fwd_flops() / same.fwd_flops() == pytest.approx(320 / 384)
    windowed = pair.variant(causal=True, window=(128, 0))
    assert windowed.fwd_flops() == 2 * 10 * (192 + 128) * 8 * compare.visible_pairs(2048, True, (128, 0))
    lengths = [1000, 3000]
    varlen = compare.Problem("bf16", 192, True, 2, 2048, 10, 10, lengths, hdim_v=128)
    assert varlen.fwd_flops() == sum(2 * 10 * s * s * 320 for s in lengths) / 2


def test_row_fields_and_describe(compare):
    pair = compare.Problem("bf16", 192, True, 4, 4096, 10, 10, hdim_v=128)
    row = pair.row("hopattn", "bwd", False, 2.0, check="pass")
    assert (row["hdim"], row["hdim_v"], row["softcap"], row["sinks"], row["window_left"], row["window_right"]) == (
        192, 128, 0, False, -1, -1)
    # backward: its five matmuls, 2 * (3 * 192 + 2 * 128) per pair against the forward's 2 * 320
    assert row["tflops"] == pytest.approx(pair.fwd_flops() * 832 / 320 / 2e9)
    assert json.loads(json.dumps(row))["hdim_v"] == 128
    assert "d192x128 causal" in pair.describe() and "d192 causal" in pair.variant(hdim_v=192).describe()


# ---- keys, panels, figures ----

def test_keys(compare):
    pair = compare.Problem("bf16", 192, True, 4, 4096, 10, 10, hdim_v=128)
    same = pair.variant(hdim_v=192)
    pair_key = compare.row_key(pair.row("hopattn", "fwd", False, 1.0))
    same_key = compare.row_key(same.row("hopattn", "fwd", False, 1.0))
    assert pair_key != same_key and compare.same_head_dims(pair_key) == same_key
    assert compare.same_head_dims(same_key) == same_key
    assert pair_key[3] == "hdim_v 128" and pair_key[15] == 128 and same_key[3] == ""
    # A row of a file from before the field is a problem of one head dim.
    old = {k: v for k, v in same.row("cudnn", "fwd", False, 1.0).items() if k != "hdim_v"}
    assert compare.row_key(old) == same_key
    # The kind keeps GQA and varlen, and comes off again.
    gqa = compare.Problem("bf16", 192, False, 4, 4096, 32, 4, hdim_v=128).row("hopattn", "bwd", True, 1.0)
    assert compare.kind_of(gqa) == "gqa 32/4 hdim_v 128"
    assert compare.same_head_dims(compare.row_key(gqa))[3] == "gqa 32/4"
    varlen = compare.Problem("bf16", 192, False, 2, 2048, 10, 10, [1000, 3000], hdim_v=128).row("fa3", "fwd",
                                                                                                 False, 1.0)
    assert compare.same_head_dims(compare.row_key(varlen))[3] == "varlen"
    # With sinks and the cap: the other options stay, and their own "without" keys still work.
    both = compare.row_key(pair.variant(sinks=True, softcap=30.0).row("hopattn", "fwd", False, 1.0))
    assert compare.without_softcap(compare.without_sinks(compare.same_head_dims(both))) == same_key
    assert compare.panel_label(compare.panel_of(pair_key)) == "fwd bf16 hdim_v 128 d192 causal"
    assert compare.dims_text(192, 128) == "192x128" and compare.dims_text(128, 128) == "128"


def test_figure_names(compare):
    assert compare.figure_name("r", ("fwd", "bf16", "hdim_v 128", (-1, -1), False, 0)) == "r-fwd-bf16-hdim_v128.png"
    assert compare.figure_name("r", ("bwd", "bf16", "gqa 64/8 hdim_v 128", (128, 0), True, 30.0)) == (
        "r-bwd-bf16-gqa64-8-hdim_v128-window128_0-sinks-softcap30.png")
    assert compare.figure_name("r", ("fwd", "bf16", "gqa 64/8", (-1, -1), False, 0)) == "r-fwd-bf16-gqa64-8.png"
    groups = compare.figure_groups(compare.collect(canned_rows(compare)))
    # The pair rows have figures of their own, so that the d192 panels hold the d192 kernel's bars.
    assert sorted(compare.figure_name("r", g) for g in groups) == [
        "r-bwd-bf16-hdim_v128.png", "r-bwd-bf16.png", "r-fwd-bf16-hdim_v128.png", "r-fwd-bf16.png"]
    pair = groups[("fwd", "bf16", "hdim_v 128", (-1, -1), False, 0)]
    assert set(pair) == {(192, False), (192, True)} and set(pair[(192, True)]) == {2048, 16384}
    assert compare.group_title(("fwd", "bf16", "hdim_v 128", (-1, -1), False, 0), [{"gpu": "H100"}]) == (
        "Attention forward speed, bf16, hdim_v 128, H100")


# ---- the report ----

def canned_rows(compare):
    """d192 and (192, 128), fwd and bwd, causal and not, 2k and 16k: hopattn (192, 128) runs at 0.97x
    the d192 TFLOP/s, except 0.90x for the backward causal row at 16k; cuDNN ran the (192, 128)
    forward only (its backward rejected the shape: no row), its causal 16k row failing the check;
    FA3 ran both. One more problem (d192x128, 8k) whose hopattn forward failed its check."""
    rows = []
    for direction in ("fwd", "bwd"):
        for causal in (False, True):
            for seqlen in (2048, 16384):
                same = compare.Problem("bf16", 192, causal, 16384 // seqlen, seqlen, 10, 10)
                pair = same.variant(hdim_v=128)
                base = 500.0 if direction == "fwd" else 400.0
                ours = 0.90 if (direction, causal, seqlen) == ("bwd", True, 16384) else 0.97
                for p, factor in ((same, 1.0), (pair, ours)):
                    flops = p.row("hopattn", direction, False, 1e3)["tflops"] * 1e12  # what the row counts

                    def add(impl, tflops, check="pass"):
                        rows.append(p.row(impl, direction, False, flops / (tflops * 1e9), check=check))

                    add("hopattn", base * factor)
                    add("fa3", 0.8 * base)
                    if direction == "fwd":
                        failed = p is pair and causal and seqlen == 16384
                        add("cudnn", 0.5 * base, "FAIL: out error 1 > bound 0.1" if failed else "pass")
    pair = compare.Problem("bf16", 192, False, 2, 8192, 10, 10, hdim_v=128)
    rows.append(pair.variant(hdim_v=192).row("hopattn", "fwd", False, 1.0, check="pass"))
    rows.append(pair.row("hopattn", "fwd", False, None, check="FAIL: out error 1 > bound 0.1"))
    return rows


def test_hdim_v_table(compare, tmp_path):
    text = write_canned(compare, tmp_path, canned_rows(compare), "hdimv")
    part = section(text, "## V head dim")
    assert "**1 hopattn hdim_v row(s) not timed**" in part
    rows = table_rows(part)
    header = rows[0]
    assert header == ["dir", "dtype", "kind", "d", "causal", "batch x seqlen", "hdim_v", "hopattn hdim_v = d",
                      "hopattn", "vs hdim_v = d", "vs fa3", "vs cudnn"]
    by_problem = {tuple(r[:6]): dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)}
    assert len(by_problem) == 8  # the untimed problem has no line
    row = by_problem[("fwd", "bf16", "mha", "192", "no", "8 x 2048")]
    assert [row[c] for c in header[6:]] == ["128", "500", "485", "0.970", f"{485 / 400:.3f}", f"{485 / 250:.3f}"]
    row = by_problem[("fwd", "bf16", "mha", "192", "yes", "1 x 16384")]
    assert row["vs cudnn"] == "check failed"
    row = by_problem[("bwd", "bf16", "mha", "192", "yes", "1 x 16384")]
    assert [row[c] for c in header[6:]] == ["128", "400", "360", "0.900", f"{360 / 320:.3f}", ""]
    # The summary the bar reads: per panel and per direction, against the same dims and each peer.
    summary = {(r[0], r[1]): r[2:] for r in rows if len(r) == 5 and r[0] != "panel"}
    assert summary[("fwd bf16 hdim_v 128 d192 causal", "hdim_v = d")] == ["2", "0.970", "0.970"]
    assert summary[("fwd bf16 hdim_v 128 d192 causal", "cudnn")] == ["1", f"{485 / 250:.3f}", f"{485 / 250:.3f}"]
    assert summary[("fwd, every panel", "hdim_v = d")] == ["4", "0.970", "0.970"]
    assert summary[("fwd, every panel", "cudnn")] == ["3", f"{485 / 250:.3f}", f"{485 / 250:.3f}"]
    bwd = summary[("bwd, every panel", "hdim_v = d")]
    assert bwd == ["4", f"{math.exp((3 * math.log(0.97) + math.log(0.9)) / 4):.3f}", "0.900"]
    assert ("bwd, every panel", "cudnn") not in summary
    # Lines in order: the same dims before the peers, forward before backward.
    labels = [(r[0], r[1]) for r in rows if len(r) == 5 and r[0] != "panel"]
    assert labels.index(("fwd, every panel", "hdim_v = d")) < labels.index(("fwd, every panel", "fa3"))
    assert labels[-1] == ("bwd, every panel", "fa3")
    # The main table has the pair rows as problems of their own, and the untimed one is listed.
    main = table_rows(text[:text.index("## V head dim")])
    head = main[0]
    cells = {tuple(r[:6]): dict(zip(head, r)) for r in main[1:] if len(r) == len(head)}
    assert cells[("fwd", "bf16", "hdim_v 128", "192", "no", "8 x 2048")]["hopattn"] == "485"
    assert cells[("fwd", "bf16", "mha", "192", "no", "8 x 2048")]["hopattn"] == "500"
    assert "- hopattn fwd bf16 d192x128 non-causal 2 x 8192 h10/10: FAIL: out error" in text
    assert "## Softcap" not in text and "## Attention sinks" not in text


def test_hdim_v_table_without_the_same_dims(compare):
    # A run without --hdims 192: the pair rows with their peers, no ratio to the same dims.
    rows = [r for r in canned_rows(compare) if r["hdim_v"] == 128 and r["tflops"] is not None]
    table = table_rows(compare.hdim_v_table(compare.collect(rows)))
    header = table[0]
    line = dict(zip(header, table[1]))
    assert line["hopattn hdim_v = d"] == "" and line["vs hdim_v = d"] == "" and line["vs fa3"] != ""
    assert not any(r[1] == "hdim_v = d" for r in table if len(r) == 5)
    # No pair row with a hopattn result: no section.
    assert compare.hdim_v_table(compare.collect([r for r in rows if r["impl"] != "hopattn"])) == ""
    same_only = [r for r in canned_rows(compare) if r["hdim_v"] == 192]
    assert compare.hdim_v_table(compare.collect(same_only)) == ""


def test_report_of_old_files_has_no_hdim_v_section(compare, tmp_path):
    from test_compare_report import CANNED

    compare.write_report([str(CANNED)], tmp_path, name="canned", plots=False)
    assert "V head dim" not in (tmp_path / "canned.md").read_text()


# ---- with PyTorch: tensors, the reference and the checker on CPU tensors ----

def problem(compare, varlen=False, hdim_v=16, **options):
    """A small GQA problem (4 query heads over 2 KV heads), d32 with V's head dim 16."""
    lengths = [24, 40] if varlen else None
    return compare.Problem("bf16", 32, True, 2, 32, 4, 2, lengths, hdim_v=hdim_v, **options)


@pytest.mark.parametrize("varlen", [False, True])
def test_tensors(compare, varlen):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = problem(compare, varlen)
    t = compare.Tensors(torch, p, seed=2, device="cpu")
    lead = (64,) if varlen else (2, 32)
    assert (t.q.shape, t.k.shape, t.v.shape, t.dout.shape) == (lead + (4, 32), lead + (2, 32), lead + (2, 16),
                                                               lead + (4, 16))
    # Q and K are those of the problem of equal head dims.
    same = compare.Tensors(torch, p.variant(hdim_v=32), seed=2, device="cpu")
    assert torch.equal(t.q, same.q) and torch.equal(t.k, same.k)


@pytest.mark.parametrize("sinks, softcap", [(False, 0), (True, 2.0)])
def test_reference_is_the_formula(compare, sinks, softcap):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = problem(compare, window=(8, 0), sinks=sinks, softcap=softcap)
    t = compare.Tensors(torch, p, seed=3, device="cpu")
    take, qh, kvh = compare._subset(p, t)
    q, k, v, dout = (take(x, h).detach().double() for x, h in ((t.q, qh), (t.k, kvh), (t.v, kvh), (t.dout, qh)))
    sink = t.sink.detach()[qh].double() if sinks else None
    out, dq, dk, dv = compare._attention_slice(torch, q, k, v, dout, True, torch.float64, p.window, sink, softcap)
    assert out.shape == (32, 2, 16) and dv.shape == (32, 16) and dq.shape == (32, 2, 32) and dk.shape == (32, 32)
    # The formula written out, scale 1 / sqrt(32) (Q's head dim), and autograd's gradients of it.
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    expected = direct_attention(torch, leaves[0], leaves[1][:, None], leaves[2][:, None], True, p.window, sink,
                                softcap)
    assert torch.allclose(out, expected, rtol=1e-12, atol=1e-12)
    for got, want in zip((dq, dk, dv), torch.autograd.grad(expected, leaves, dout)):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    if sinks:  # the sink's gradient, over the batch, against autograd
        exact, *_ = compare._sink_gradient(torch, p, t, qh, kvh)
        leaf = t.sink.detach().double().requires_grad_(True)
        qq, kk, vv, dd = (flat(x.detach().double()) for x in (t.q, t.k, t.v, t.dout))
        loss = sum((direct_attention(torch, qq[a:b], kk[a:b], vv[a:b], True, p.window, leaf, softcap) * dd[a:b]).sum()
                   for a, b in spans_of(t.q))
        assert torch.allclose(exact, torch.autograd.grad(loss, leaf)[0][qh], rtol=1e-10, atol=1e-12)


def stand_in(torch, q, k, v, causal, window=(-1, -1), sink=None, softcap=0.0, cu=None, scale_dim=None):
    """An implementation on the stand-in of the softcap tests, out shaped (..., heads, hdim_v); with
    scale_dim, the scores scaled by 1 / sqrt(scale_dim) instead of Q's head dim (a wrong kernel)."""
    if scale_dim is not None:
        q = (q.float() * math.sqrt(q.shape[-1] / scale_dim)).to(q.dtype)
    out = attend(torch, *(flat(x) for x in (q, k, v)), spans_of(q, cu), causal, window, sink, softcap)
    return out.reshape(*q.shape[:-1], v.shape[-1])


@pytest.mark.parametrize("varlen", [False, True])
def test_checker(compare, varlen):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = problem(compare, varlen)
    t = compare.Tensors(torch, p, seed=4, device="cpu")
    checker = compare.Checker(torch, p, t)
    out = stand_in(torch, t.q, t.k, t.v, True, cu=t.cu)
    assert out.shape == t.dout.shape
    assert checker.check("fwd", out=out) == "pass"
    assert checker.check("bwd", grads=torch.autograd.grad(out, t.inputs(), t.dout)) == "pass"
    # Scaling by V's head dim instead of Q's fails.
    wrong = stand_in(torch, t.q, t.k, t.v, True, cu=t.cu, scale_dim=16)
    assert checker.check("fwd", out=wrong).startswith("FAIL: out error")


def fake_hopattn(torch):
    """hopattn.attention and attention_varlen as the stand-in (out with v's head dim), each call bound
    to this checkout's package signature (python/hopattn)."""
    def attention(q, k, v, *, causal=False, window_size=(-1, -1), deterministic=False, learnable_sink=None,
                  softcap=0.0):
        return stand_in(torch, q, k, v, causal, window_size, learnable_sink, softcap)

    def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                         window_size=(-1, -1), deterministic=False, learnable_sink=None, softcap=0.0):
        return stand_in(torch, q, k, v, causal, window_size, learnable_sink, softcap, cu=cu_seqlens_q)

    return signature_bound_hopattn(attention, attention_varlen)


def fake_fa3_module(torch):
    """flash_attn_interface with the stand-in behind FlashAttention-3's keyword names."""
    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                        deterministic=False):
        return stand_in(torch, q, k, v, causal, window_size, None, softcap), None

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                               causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False):
        return stand_in(torch, q, k, v, causal, window_size, None, softcap, cu=cu_seqlens_q), None

    return types.SimpleNamespace(flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func)


@pytest.mark.parametrize("varlen", [False, True])
def test_run_problem_on_cpu(compare, monkeypatch, tmp_path, varlen):
    # A problem of equal head dims and its (32, 16) pair run, are checked and "timed" for hopattn and
    # FA3; SDPA's cuDNN backend (no CPU kernel) rejects both and leaves no row, as a GPU's cuDNN that
    # rejects the pair's shape would. The report then divides the pair's rows by the same dims'.
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import hopattn

    if not hopattn.torch_available():
        pytest.skip("hopattn's PyTorch API is not available (PyTorch older than 2.4)")
    monkeypatch.setitem(sys.modules, "hopattn", fake_hopattn(torch))
    monkeypatch.setitem(sys.modules, "flash_attn_interface", fake_fa3_module(torch))
    ms = {"value": 0.5}

    def median_ms(torch, fn, warmup, reps, budget_s):
        fn()
        return ms["value"], 3

    monkeypatch.setattr(compare.gpu_timing, "median_ms", median_ms)
    a = args(compare, "--hdim-pairs", "32x16", "--no-deterministic")
    same = problem(compare, varlen, hdim_v=32)
    rows = []
    for p, value in ((same, 0.5), (same.variant(hdim_v=16), 0.45)):
        log = []
        ms["value"] = value
        got = compare.run_problem(torch, p, a, ["hopattn", "fa3", "cudnn"], log.append, device="cpu")
        assert [(r["impl"], r["direction"]) for r in got] == [(i, d) for i in ("hopattn", "fa3")
                                                              for d in ("fwd", "bwd")], log
        assert all(r["check"] == "pass" and r["hdim_v"] == p.hdim_v and r["hdim"] == 32 for r in got)
        assert any(line.startswith("  cudnn fwd") for line in log), log
        rows += got
    table = table_rows(section(write_canned(compare, tmp_path, rows, "cpu"), "## V head dim"))
    header = table[0]
    by_dir = {r[0]: dict(zip(header, r)) for r in table[1:] if len(r) == len(header)}
    assert set(by_dir) == {"fwd", "bwd"}
    # TFLOP/s with each row's own FLOPs: (32 + 16) / (32 + 32) of the work in 0.45 / 0.5 of the time.
    assert by_dir["fwd"]["vs hdim_v = d"] == f"{(48 / 64) / (0.45 / 0.5):.3f}"
    assert by_dir["bwd"]["vs fa3"] == "1.000" and "vs cudnn" not in header
