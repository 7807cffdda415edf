"""bench/compare.py's softcap: the option, the problem copies it adds (alone and with --window and
--sinks), the row fields, the peers' keywords, and the "Softcap" section of the report from canned
rows, all without a GPU or PyTorch; with PyTorch, the float64 reference with the cap (and its
gradients) on CPU tensors against the formula written out directly and autograd, the naive
low-precision cap, the checker on stand-in implementations, and whole problems through run_problem
with stand-ins for hopattn, FlashAttention-3 and FlashAttention-4."""

import json
import math
import sys
import types

import pytest

from bench_scripts import load, run_args as args, table_rows
from attention_formula import direct_attention, flat, spans_of
from conftest import signature_bound_hopattn


@pytest.fixture(scope="module")
def compare():
    return load("compare")


def section(text, title):
    """The markdown from the heading `title` to the next heading (or the end)."""
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:] if end < 0 else text[start:end]


# ---- options and problems ----

def test_option_default_off(compare):
    assert args(compare).softcap is None
    assert all(p.softcap == 0 for p in compare.build_problems(args(compare, "--hdims", "128", "--dtype", "bf16")))


@pytest.mark.parametrize("text, value", [("30", 30.0), ("12.5", 12.5), ("1e1", 10.0)])
def test_option_parses(compare, text, value):
    a = args(compare, "--softcap", text)
    assert a.softcap == value and isinstance(a.softcap, float)


@pytest.mark.parametrize("text", ["0", "-30", "nan", "inf", "x", ""])
def test_option_rejected(compare, text, capsys):
    # No cap is the option left out; a negative, NaN, infinite or non-numeric cap is an error.
    with pytest.raises(SystemExit):
        args(compare, "--softcap", text)
    assert "--softcap" in capsys.readouterr().err


def test_problems_get_softcap_copies(compare):
    a = args(compare, "--hdims", "128,256", "--seqlens", "2048,4096,8192,16384", "--causal", "both",
             "--dtype", "bf16", "--extra", "", "--softcap", "30")
    problems = compare.build_problems(a)
    assert len(problems) == 2 * 2 * 4 * 2
    # Each problem, then right after it its copy with the cap: the same shape and tensors' seed.
    for plain, capped in zip(problems[::2], problems[1::2]):
        assert (plain.softcap, capped.softcap) == (0, 30.0)
        assert vars(capped) == dict(vars(plain), softcap=30.0)
    assert {(p.hdim, p.causal) for p in problems} == {(128, False), (128, True), (256, False), (256, True)}


def test_softcap_combines_with_window_and_sinks(compare):
    a = args(compare, "--hdims", "128", "--seqlens", "4096", "--causal", "both", "--dtype", "bf16", "--extra", "",
             "--window", "128", "--sinks", "--softcap", "30")
    problems = compare.build_problems(a)
    # Non-causal: plain, sinks, and both again with the cap; causal: also the window, with and
    # without sinks, each with and without the cap: one copy per combination.
    non_causal = [(p.window, p.sinks, p.softcap) for p in problems if not p.causal]
    causal = [(p.window, p.sinks, p.softcap) for p in problems if p.causal]
    assert non_causal == [((-1, -1), False, 0), ((-1, -1), True, 0), ((-1, -1), False, 30.0), ((-1, -1), True, 30.0)]
    w = (128, 0)
    assert causal == [((-1, -1), False, 0), (w, False, 0), ((-1, -1), True, 0), (w, True, 0),
                      ((-1, -1), False, 30.0), (w, False, 30.0), ((-1, -1), True, 30.0), (w, True, 30.0)]
    assert len(set(causal)) == 8


def test_quick_keeps_the_copies(compare):
    a = args(compare, "--hdims", "128,256", "--causal", "yes", "--dtype", "bf16", "--extra", "varlen", "--quick",
             "--softcap", "30")
    problems = compare.build_problems(a)
    assert {p.seqlen for p in problems} == {4096}
    # d128 and d256 sweep rows and the d128 varlen row, each with its softcap copy.
    assert [(p.hdim, p.varlen, p.softcap) for p in problems] == [
        (128, False, 0), (128, False, 30.0), (256, False, 0), (256, False, 30.0), (128, True, 0), (128, True, 30.0)]


def test_flops_and_describe(compare):
    p = compare.Problem("bf16", 128, True, 4, 4096, 16, 16)
    capped = p.variant(softcap=30.0)
    assert capped.fwd_flops() == p.fwd_flops()  # the tanh is not counted: TFLOP/s ratio = inverse time ratio
    assert p.softcap == 0  # variant() copies
    assert "softcap30" in capped.describe() and "softcap" not in p.describe()
    both = p.variant(window=(128, 0), sinks=True, softcap=12.5)
    assert both.fwd_flops() == p.variant(window=(128, 0)).fwd_flops()
    assert "w128,0 sinks softcap12.5" in both.describe()


# ---- rows and keys ----

def test_row_fields(compare):
    p = compare.Problem("bf16", 256, False, 8, 2048, 8, 8)
    plain = p.row("hopattn", "fwd", False, 1.0)
    assert plain["softcap"] == 0 and not plain["sinks"] and plain["hdim_v"] == 256
    row = p.variant(softcap=30.0).row("fa3", "bwd", False, 2.0, check="pass")
    assert (row["softcap"], row["sinks"], row["window_left"], row["window_right"], row["hdim_v"]) == (30.0, False, -1,
                                                                                                      -1, 256)
    assert row["tflops"] == pytest.approx(p.fwd_flops() * 2.5 / 2e9)
    assert json.loads(json.dumps(row))["softcap"] == 30.0
    combined = p.variant(window=(64, 0), causal=True, sinks=True, softcap=30.0).row("hopattn", "fwd", False, 1.0)
    assert (combined["softcap"], combined["sinks"], combined["window_left"], combined["window_right"]) == (30.0, True,
                                                                                                          64, 0)


def test_keys(compare):
    p = compare.Problem("bf16", 128, True, 4, 4096, 16, 16)
    plain = compare.row_key(p.row("hopattn", "fwd", False, 1.0))
    capped = compare.row_key(p.variant(softcap=30.0).row("hopattn", "fwd", False, 1.0))
    assert capped != plain and compare.without_softcap(capped) == plain
    assert compare.without_softcap(plain) == plain
    # A row written before the field (no "softcap") is the problem without the cap.
    old = {k: v for k, v in p.row("cudnn", "fwd", False, 1.0).items() if k not in ("softcap", "sinks", "hdim_v")}
    assert compare.row_key(old) == plain
    # Sinks and softcap come off independently; the first 16 fields, which older readers index, stay.
    both = compare.row_key(p.variant(sinks=True, softcap=30.0).row("hopattn", "fwd", False, 1.0))
    assert compare.without_sinks(compare.without_softcap(both)) == plain
    assert compare.without_softcap(compare.without_sinks(both)) == plain
    assert both[:16] == plain[:16] and plain[11] == 4096
    # The panel adds the softcap at the end; seven-field panels (from before it) still label.
    assert compare.panel_of(capped) == ("fwd", "bf16", "", 128, True, (-1, -1), False, 30.0)
    assert compare.panel_label(compare.panel_of(capped)) == "fwd bf16 d128 causal softcap 30"
    assert compare.panel_label(compare.panel_of(plain)) == "fwd bf16 d128 causal"
    assert compare.panel_label(("bwd", "bf16", "", 128, True, (-1, -1), True)) == "bwd bf16 d128 causal sinks"


# ---- the peers' keywords (no torch: fake modules and tensors) ----

def test_mask_options(compare):
    p = compare.Problem("bf16", 128, True, 4, 4096, 16, 16)
    no_sink = types.SimpleNamespace(sink=None)
    assert compare.mask_options(p, no_sink) == {}
    assert compare.mask_options(p.variant(softcap=30.0), no_sink) == {"softcap": 30.0}
    options = compare.mask_options(p.variant(softcap=30.0, window=(128, 0)), no_sink)
    assert options == {"window_size": (128, 0), "softcap": 30.0} and type(options["softcap"]) is float


def fake_fa3(calls):
    """flash_attn_interface with FlashAttention-3's keyword names (hopper/flash_attn_interface.py), so
    that a keyword it lacks raises TypeError; each call's keywords go to `calls`."""
    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                        deterministic=False):
        calls.append(dict(causal=causal, window_size=window_size, softcap=softcap, deterministic=deterministic))
        return q, None

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                               causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False):
        calls.append(dict(causal=causal, window_size=window_size, softcap=softcap, deterministic=deterministic,
                          varlen=True))
        return q, None

    return types.SimpleNamespace(flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func)


@pytest.mark.parametrize("varlen", [False, True])
def test_fa3_gets_the_cap(compare, monkeypatch, varlen):
    calls = []
    monkeypatch.setitem(sys.modules, "flash_attn_interface", fake_fa3(calls))
    p = compare.Problem("bf16", 128, True, 2, 64, 4, 4, [32, 32] if varlen else None, window=(16, 0), softcap=30.0)
    t = types.SimpleNamespace(q="q", k="k", v="v", sink=None, cu="cu", max_seqlen=32)
    assert compare.make_fa3(None, p, t, True)() == "q"
    assert calls[-1]["softcap"] == 30.0 and calls[-1]["window_size"] == (16, 0) and calls[-1]["deterministic"]
    assert calls[-1].get("varlen", False) == varlen
    compare.make_fa3(None, p.variant(softcap=0, window=(-1, -1)), t, False)()
    assert calls[-1]["softcap"] == 0.0 and calls[-1]["window_size"] == (-1, -1)  # the defaults: not passed


# ---- the report ----

SOFTCAP = 30.0


def canned_softcap_rows(compare):
    """hopattn, FA3 and FA4 with and without softcap 30, cuDNN without; fwd and bwd, d128 and d256,
    causal and not, 2k and 16k. hopattn's softcap / no softcap is 0.95, except 0.82 for the backward
    d256 causal row at 16k; FA3's 0.9; FA4's forward 0.8, and its backward softcap rows failed their
    check (timed all the same, as peers are). One more problem (d64) whose hopattn softcap row failed."""
    rows = []
    for direction in ("fwd", "bwd"):
        for hdim in (128, 256):
            for causal in (False, True):
                for seqlen in (2048, 16384):
                    p = compare.Problem("bf16", hdim, causal, 16384 // seqlen, seqlen, 2048 // hdim, 2048 // hdim)
                    base = 500.0 if direction == "fwd" else 400.0
                    ours = 0.82 if (direction, hdim, causal, seqlen) == ("bwd", 256, True, 16384) else 0.95
                    for softcap in (0, SOFTCAP):
                        q = p.variant(softcap=softcap)
                        flops = q.fwd_flops() * (2.5 if direction == "bwd" else 1.0)

                        def add(impl, tflops, check="pass"):
                            rows.append(q.row(impl, direction, False, flops / (tflops * 1e9), check=check))

                        add("hopattn", base * (ours if softcap else 1))
                        add("fa3", 0.8 * base * (0.9 if softcap else 1))
                        fa4_check = "FAIL: dq error 0.5 > bound 0.01" if softcap and direction == "bwd" else "pass"
                        add("fa4", 0.9 * base * (0.8 if softcap else 1), fa4_check)
                        if not softcap:
                            add("cudnn", 250.0)
    p = compare.Problem("bf16", 64, True, 8, 2048, 32, 32)
    rows.append(p.row("hopattn", "fwd", False, 1.0, check="pass"))
    rows.append(p.variant(softcap=SOFTCAP).row("hopattn", "fwd", False, None, check="FAIL: out error 1 > bound 0.1"))
    return rows


def write_canned(compare, tmp_path, rows, name="softcap"):
    """The markdown report of `rows` (written as one result file)."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"env": {"gpu": "NVIDIA H100 (canned softcap rows)"}, "rows": rows}))
    assert compare.write_report([str(path)], tmp_path, name=name, plots=False) == [tmp_path / f"{name}.md"]
    return (tmp_path / f"{name}.md").read_text()


def test_softcap_table(compare, tmp_path):
    text = write_canned(compare, tmp_path, canned_softcap_rows(compare))
    part = section(text, "## Softcap")
    assert "**1 hopattn softcap row(s) not timed**" in part
    rows = table_rows(part)
    header = rows[0]
    assert header == ["dir", "dtype", "kind", "d", "causal", "batch x seqlen", "softcap", "hopattn", "hopattn softcap",
                      "softcap / no softcap", "fa3 softcap / no softcap", "fa4 softcap / no softcap"]
    by_problem = {tuple(r[:6]): dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)}
    assert len(by_problem) == 2 * 2 * 2 * 2  # the d64 problem has no timed softcap row
    row = by_problem[("fwd", "bf16", "mha", "128", "no", "8 x 2048")]
    assert [row[c] for c in header[6:]] == ["30", "500", "475", "0.950", "0.900", "0.800"]
    row = by_problem[("bwd", "bf16", "mha", "256", "yes", "1 x 16384")]
    assert [row[c] for c in header[6:]] == ["30", "400", "328", "0.820", "0.900", "check failed"]
    # The summary the bar reads: per panel and per direction, the geomean and the least ratio.
    summary = {(r[0], r[1]): r[2:] for r in rows if len(r) == 5 and r[0] != "panel"}
    assert summary[("fwd bf16 d128 non-causal", "30")] == ["2", "0.950", "0.950"]
    assert summary[("bwd bf16 d256 causal", "30")] == ["2", f"{math.sqrt(0.95 * 0.82):.3f}", "0.820"]
    assert summary[("fwd, every panel", "30")] == ["8", "0.950", "0.950"]
    bwd = summary[("bwd, every panel", "30")]
    assert bwd[0] == "8" and bwd[2] == "0.820"
    assert bwd[1] == f"{math.exp((7 * math.log(0.95) + math.log(0.82)) / 8):.3f}"
    # The main table has the softcap rows as problems of their own, against the peers that ran them.
    main = table_rows(text[:text.index("## Softcap")])
    head = main[0]
    assert head[-3:] == ["vs fa3", "vs fa4", "vs cudnn"]
    cells = {tuple(r[:6]): dict(zip(head, r)) for r in main[1:] if len(r) == len(head)}
    capped = cells[("fwd", "bf16", "mha softcap 30", "128", "no", "8 x 2048")]
    assert capped["hopattn"] == "475" and capped["vs fa3"] == f"{475 / 360:.3f}" and capped["vs cudnn"] == ""
    assert cells[("fwd", "bf16", "mha", "128", "no", "8 x 2048")]["vs cudnn"] == "2.000"
    assert "| fwd bf16 d128 non-causal softcap 30 | fa3 |" in text
    # No sinks, no sinks section; the untimed row says what it was.
    assert "## Attention sinks" not in text
    assert "- hopattn fwd bf16 d64 causal softcap 30 8 x 2048 h32/32: FAIL: out error" in text


def test_softcap_table_needs_both_rows(compare):
    p = compare.Problem("bf16", 128, True, 4, 4096, 16, 16)
    assert compare.softcap_table(compare.collect([p.variant(softcap=SOFTCAP).row("hopattn", "fwd", False, 1.0)])) == ""
    assert compare.softcap_table(compare.collect([p.row("hopattn", "fwd", False, 1.0)])) == ""


def test_report_of_old_files_has_no_softcap_section(compare, tmp_path):
    from test_compare_report import CANNED

    compare.write_report([str(CANNED)], tmp_path, name="canned", plots=False)
    assert "Softcap" not in (tmp_path / "canned.md").read_text()


def test_softcap_with_sinks_in_both_tables(compare, tmp_path):
    # The four copies of one causal problem: each table divides the rows that differ in its option
    # only, and its summary keeps the other option in the panel.
    p = compare.Problem("bf16", 128, True, 4, 4096, 16, 16)
    times = {(False, 0): 1.0, (True, 0): 1.02, (False, SOFTCAP): 1.1, (True, SOFTCAP): 1.12}
    rows = [p.variant(sinks=s, softcap=c).row("hopattn", d, False, ms * (2.5 if d == "bwd" else 1), check="pass")
            for (s, c), ms in times.items() for d in ("fwd", "bwd")]
    text = write_canned(compare, tmp_path, rows, "both")
    softcap = table_rows(section(text, "## Softcap"))
    ratios = {(r[2], r[0]): r[9] for r in softcap[1:] if len(r) == 10}
    assert ratios == {("mha", "fwd"): f"{1.0 / 1.1:.3f}", ("mha sinks", "fwd"): f"{1.02 / 1.12:.3f}",
                      ("mha", "bwd"): f"{1.0 / 1.1:.3f}", ("mha sinks", "bwd"): f"{1.02 / 1.12:.3f}"}
    panels = {r[0]: r[2:] for r in softcap if len(r) == 5 and r[0] != "panel"}
    assert panels["fwd bf16 d128 causal sinks"] == ["1", f"{1.02 / 1.12:.3f}", f"{1.02 / 1.12:.3f}"]
    assert panels["fwd, every panel"] == ["2", f"{math.sqrt(1.0 / 1.1 * 1.02 / 1.12):.3f}", f"{1.0 / 1.1:.3f}"]
    sinks = table_rows(section(text, "## Attention sinks"))
    assert {(r[2], r[0]): r[8] for r in sinks[1:] if len(r) == 9} == {
        ("mha", "fwd"): f"{1.0 / 1.02:.3f}", ("mha softcap 30", "fwd"): f"{1.1 / 1.12:.3f}",
        ("mha", "bwd"): f"{1.0 / 1.02:.3f}", ("mha softcap 30", "bwd"): f"{1.1 / 1.12:.3f}"}
    sink_panels = {r[0]: r[1:] for r in sinks if len(r) == 4 and r[0] != "panel"}
    assert sink_panels["fwd bf16 d128 causal softcap 30"] == ["1", f"{1.1 / 1.12:.3f}", f"{1.1 / 1.12:.3f}"]
    assert sink_panels["fwd bf16 d128 causal"] == ["1", f"{1.0 / 1.02:.3f}", f"{1.0 / 1.02:.3f}"]


def test_figure_groups_and_names(compare):
    by_key = compare.collect(canned_softcap_rows(compare))
    names = sorted(compare.figure_name("r", g) for g in compare.figure_groups(by_key))
    assert names == ["r-bwd-bf16-softcap30.png", "r-bwd-bf16.png", "r-fwd-bf16-softcap30.png", "r-fwd-bf16.png"]
    assert compare.group_title(("bwd", "bf16", "", (128, 0), True, 30.0), [{"gpu": "H100"}]) == (
        "Attention backward speed, bf16, window (128,0), attention sinks, softcap 30, H100")
    # Groups of five fields (before the softcap) still name and title.
    assert compare.figure_name("r", ("fwd", "bf16", "", (-1, -1), True)) == "r-fwd-bf16-sinks.png"
    # Every (hdim, causal) panel of a softcap figure has both seqlens and the peers that ran.
    group = compare.figure_groups(by_key)[("fwd", "bf16", "", (-1, -1), False, SOFTCAP)]
    assert set(group) == {(128, False), (128, True), (256, False), (256, True)}
    assert set(group[(256, True)][16384]) == {"hopattn", "fa3", "fa4"}


# ---- with PyTorch: the reference with the cap, its gradients and the checker, on CPU tensors ----

def problem(compare, varlen=False, window=(-1, -1), sinks=False, softcap=2.0):
    """A small GQA problem (4 query heads over 2 KV heads, d32); softcap 2 bends scores of ~N(0, 1)
    well beyond rounding, so that a wrong cap shows (30 would barely touch them)."""
    lengths = [24, 40] if varlen else None
    return compare.Problem("bf16", 32, True, 2, 32, 4, 2, lengths, window=window, sinks=sinks, softcap=softcap)


def sliced(torch, compare, p, t):
    """The checked slice of the problem's tensors in float64, and its sink logits (or None)."""
    take, qh, kvh = compare._subset(p, t)
    q, k, v, dout = (take(x, h).detach().double() for x, h in ((t.q, qh), (t.k, kvh), (t.v, kvh), (t.dout, qh)))
    sink = t.sink.detach()[qh].double() if t.sink is not None else None
    return q, k, v, dout, sink


@pytest.mark.parametrize("window, sinks", [((-1, -1), False), ((8, 0), False), ((-1, -1), True), ((8, 0), True)])
def test_reference_with_softcap_is_the_formula(compare, window, sinks):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = problem(compare, window=window, sinks=sinks)
    t = compare.Tensors(torch, p, seed=3, device="cpu")
    q, k, v, dout, sink = sliced(torch, compare, p, t)
    out, dq, dk, dv = compare._attention_slice(torch, q, k, v, dout, True, torch.float64, window, sink, p.softcap)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    expected = direct_attention(torch, leaves[0], leaves[1][:, None], leaves[2][:, None], True, window, sink,
                                p.softcap)
    assert torch.allclose(out, expected, rtol=1e-12, atol=1e-12)
    # The gradients, through the tanh, are autograd's of the formula.
    for got, want in zip((dq, dk, dv), torch.autograd.grad(expected, leaves, dout)):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    # The cap matters here: without it the output and gradients differ well beyond rounding.
    plain = compare._attention_slice(torch, q, k, v, dout, True, torch.float64, window, sink)
    assert (plain[0] - out).abs().max() > 1e-2 and (plain[1] - dq).abs().max() > 1e-2
    # softcap 0 is no cap.
    none = compare._attention_slice(torch, q, k, v, dout, True, torch.float64, window, sink, 0)
    assert all(torch.equal(a, b) for a, b in zip(none, plain))


def test_the_cap_before_the_mask(compare):
    # Masked scores stay -inf: capping after the mask would turn them into -softcap, visible keys.
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = problem(compare, window=(4, 0), softcap=1.0)
    t = compare.Tensors(torch, p, seed=4, device="cpu")
    q, k, v, dout, _ = sliced(torch, compare, p, t)
    out = compare._attention_slice(torch, q, k, v, dout, True, torch.float64, p.window, None, p.softcap)[0]
    # The first query sees only the first key: its output is that value row.
    assert torch.allclose(out[0], v[0].expand_as(out[0]), rtol=0, atol=1e-12)
    expected = direct_attention(torch, q, k[:, None], v[:, None], True, p.window, None, p.softcap)
    assert torch.allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_naive_cap(compare):
    # The naive computation caps the bf16 score in float32 and rounds once; the reference in float64.
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    gen = torch.Generator().manual_seed(0)
    scores = (4 * torch.randn(64, 64, generator=gen)).to(torch.bfloat16)
    capped = compare._cap(torch, scores, 30.0)
    assert capped.dtype == torch.bfloat16
    assert torch.equal(capped, (30.0 * torch.tanh(scores.float() / 30.0)).to(torch.bfloat16))
    exact = compare._cap(torch, scores.double(), 30.0)
    assert exact.dtype == torch.float64 and torch.equal(exact, 30.0 * torch.tanh(scores.double() / 30.0))
    assert (exact - capped.double()).abs().max() > 0  # one more rounding of the score
    assert compare._cap(torch, scores, 0) is scores


def test_naive_error_with_softcap(compare):
    # The naive low-precision results follow the capped reference to within bf16 rounding, and the
    # cap is part of them too: the naive output without the cap is much farther off.
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = problem(compare)
    t = compare.Tensors(torch, p, seed=5, device="cpu")
    checker = compare.Checker(torch, p, t)
    for exact, naive in zip(checker.exact, checker.naive):
        assert naive.dtype == torch.bfloat16
        error = (naive.double() - exact).abs().max().item()
        assert 0 < error < 0.05 * exact.abs().max().item()
    take, qh, kvh = compare._subset(p, t)
    uncapped = compare._attention_slice(torch, take(t.q, qh), take(t.k, kvh), take(t.v, kvh), take(t.dout, qh), True,
                                        torch.bfloat16)[0]
    assert (uncapped.double() - checker.exact[0]).abs().max() > 4 * (checker.naive[0].double()
                                                                     - checker.exact[0]).abs().max()


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (8, 0)])
def test_sink_gradient_with_softcap(compare, varlen, window):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = problem(compare, varlen, window, sinks=True)
    t = compare.Tensors(torch, p, seed=6, device="cpu")
    _, qh, kvh = compare._subset(p, t)
    exact, *_ = compare._sink_gradient(torch, p, t, qh, kvh)
    sink = t.sink.detach().double().requires_grad_(True)
    q, k, v, dout = (flat(x.detach().double()) for x in (t.q, t.k, t.v, t.dout))
    loss = sum((direct_attention(torch, q[a:b], k[a:b], v[a:b], True, window, sink, p.softcap) * dout[a:b]).sum()
               for a, b in spans_of(t.q, t.cu))
    (dsink,) = torch.autograd.grad(loss, sink)
    assert torch.allclose(exact, dsink[qh], rtol=1e-10, atol=1e-12)
    # Without the cap the sink's gradient is another one.
    uncapped, *_ = compare._sink_gradient(torch, p.variant(softcap=0), t, qh, kvh)
    assert (uncapped - exact).abs().max() > 1e-3 * exact.abs().max()


def attend(torch, q, k, v, spans, causal, window=(-1, -1), sink=None, softcap=0.0, backward_cap=True):
    """A stand-in implementation: float32 from the low-precision inputs, out rounded to their dtype,
    differentiable in q, k, v and the sink (flat tensors, spans of rows per sequence). With
    backward_cap=False its forward is capped but its gradients are those of the uncapped problem, as
    a backward that ignores the cap would give."""
    def run(cap):
        return torch.cat([direct_attention(torch, *(x[a:b].float() for x in (q, k, v)), causal, window, sink, cap)
                          for a, b in spans]).to(q.dtype)

    out = run(softcap)
    if softcap and not backward_cap:
        wrong = run(0.0)
        out = out.detach() + (wrong - wrong.detach())
    return out


def stand_in(torch, p, t, softcap=None, backward_cap=True):
    cap = p.softcap if softcap is None else softcap
    out = attend(torch, *(flat(x) for x in (t.q, t.k, t.v)), spans_of(t.q, t.cu), p.causal, p.window, t.sink, cap,
                 backward_cap)
    return out.reshape(t.q.shape)


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("window, sinks", [((-1, -1), False), ((8, 0), True)])
def test_checker_with_softcap(compare, varlen, window, sinks):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = problem(compare, varlen, window, sinks)
    t = compare.Tensors(torch, p, seed=7, device="cpu")
    # The cap changes no tensor: the softcap copy runs on the inputs of the problem it copies.
    plain = compare.Tensors(torch, p.variant(softcap=0), seed=7, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip((t.q, t.k, t.v, t.dout), (plain.q, plain.k, plain.v, plain.dout)))
    assert compare.mask_options(p, t)["softcap"] == 2.0

    checker = compare.Checker(torch, p, t)
    out = stand_in(torch, p, t)
    assert checker.check("fwd", out=out) == "pass"
    grads = torch.autograd.grad(out, t.inputs(), t.dout)
    assert checker.check("bwd", out=out, grads=grads) == "pass"
    # An implementation that ignores the cap fails the forward check, one whose backward ignores it
    # (capped output, uncapped gradients) the backward check.
    assert checker.check("fwd", out=stand_in(torch, p, t, softcap=0.0)).startswith("FAIL: out error")
    wrong = stand_in(torch, p, t, backward_cap=False)
    assert checker.check("fwd", out=wrong) == "pass"
    verdict = checker.check("bwd", out=wrong, grads=torch.autograd.grad(wrong, t.inputs(), t.dout))
    assert verdict.startswith("FAIL") and "dq error" in verdict


def fake_hopattn(torch):
    """hopattn's attention and attention_varlen as the stand-in, each call bound to this checkout's
    package signature (python/hopattn), so that a keyword compare.py passes and the package lacks
    fails here."""
    def attention(q, k, v, *, causal=False, window_size=(-1, -1), deterministic=False, learnable_sink=None,
                  softcap=0.0):
        return attend(torch, *(flat(x) for x in (q, k, v)), spans_of(q), causal, window_size, learnable_sink,
                      softcap).reshape(q.shape)

    def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                         window_size=(-1, -1), deterministic=False, learnable_sink=None, softcap=0.0):
        return attend(torch, q, k, v, spans_of(q, cu_seqlens_q), causal, window_size, learnable_sink, softcap)

    return signature_bound_hopattn(attention, attention_varlen)


def fake_fa3_module(torch, calls):
    """flash_attn_interface with the stand-in behind FlashAttention-3's keyword names."""
    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                        deterministic=False):
        calls.append(("fa3", softcap, deterministic))
        return attend(torch, *(flat(x) for x in (q, k, v)), spans_of(q), causal, window_size, None,
                      softcap).reshape(q.shape), None

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                               causal=False, window_size=(-1, -1), softcap=0.0, deterministic=False):
        calls.append(("fa3", softcap, deterministic))
        return attend(torch, q, k, v, spans_of(q, cu_seqlens_q), causal, window_size, None, softcap), None

    return types.SimpleNamespace(flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func)


def fake_fa4_modules(torch, calls):
    """flash_attn.cute with the stand-in behind FlashAttention-4's keyword names; its forward caps
    and its backward ignores the cap (the check is then to catch it)."""
    def unbounded(window):  # FlashAttention-4 writes an unbounded side as None
        return tuple(-1 if w is None else w for w in window)

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None,
                        softcap=0.0, deterministic=False):
        calls.append(("fa4", softcap, deterministic))
        return attend(torch, *(flat(x) for x in (q, k, v)), spans_of(q), causal, unbounded(window_size),
                      learnable_sink, softcap, backward_cap=False).reshape(q.shape), None

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                               softmax_scale=None, causal=False, window_size=(None, None), learnable_sink=None,
                               softcap=0.0, deterministic=False):
        calls.append(("fa4", softcap, deterministic))
        return attend(torch, q, k, v, spans_of(q, cu_seqlens_q), causal, unbounded(window_size), learnable_sink,
                      softcap, backward_cap=False), None

    cute = types.SimpleNamespace(flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func)
    return types.SimpleNamespace(cute=cute), cute


@pytest.mark.parametrize("varlen", [False, True])
def test_run_problem_on_cpu(compare, monkeypatch, tmp_path, varlen):
    # A problem and its softcap copy run, are checked and "timed" for hopattn, FA3 and FA4 (all
    # given the cap), FA2 through SDPA only without it; FA4's backward ignoring the cap fails its
    # check, and the report shows hopattn's and FA3's ratios and no FA4 backward ratio.
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import hopattn

    if not hopattn.torch_available():
        pytest.skip("hopattn's PyTorch API is not available (PyTorch older than 2.4)")
    calls, ms = [], {"value": 0.5}
    flash_attn, cute = fake_fa4_modules(torch, calls)
    monkeypatch.setitem(sys.modules, "hopattn", fake_hopattn(torch))
    monkeypatch.setitem(sys.modules, "flash_attn_interface", fake_fa3_module(torch, calls))
    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)

    def median_ms(torch, fn, warmup, reps, budget_s):
        fn()
        return ms["value"], 3

    monkeypatch.setattr(compare.gpu_timing, "median_ms", median_ms)
    a = args(compare, "--softcap", "2")
    impls = ["hopattn", "fa3", "fa4"] + ([] if varlen else ["fa2"])
    base = problem(compare, varlen, softcap=0)
    rows = []
    for p, value in ((base, 0.5), (base.variant(softcap=a.softcap), 0.625)):
        log, calls[:] = [], []
        ms["value"] = value
        got = compare.run_problem(torch, p, a, impls, log.append, device="cpu")
        expected = [(i, d, det) for i in ("hopattn", "fa3", "fa4")
                    for d, det in (("fwd", False), ("bwd", False), ("bwd", True))]
        if "fa2" in impls and not p.softcap:
            expected += [("fa2", "fwd", False), ("fa2", "bwd", False)]
        assert [(r["impl"], r["direction"], r["deterministic"]) for r in got] == expected, log
        assert all(r["softcap"] == p.softcap and r["ms"] == value for r in got)
        checks = {(r["impl"], r["direction"]): r["check"] for r in got}
        if p.softcap:
            assert checks[("fa4", "bwd")].startswith("FAIL") and any("fa4 bwd" in line for line in log), log
            assert all(c == "pass" for (impl, d), c in checks.items() if (impl, d) != ("fa4", "bwd")), checks
            assert {c[1] for c in calls} == {2.0}  # every call got the cap
            if "fa2" in impls:
                assert any("fa2 fwd: not supported" in line for line in log), log
        else:
            assert all(c == "pass" for c in checks.values()), checks
            assert {c[1] for c in calls} == {0.0}
        rows += got
    text = write_canned(compare, tmp_path, rows, "cpu")
    table = table_rows(section(text, "## Softcap"))
    header = table[0]
    by_dir = {(r[0]): dict(zip(header, r)) for r in table[1:] if len(r) == len(header)}
    assert set(by_dir) == {"fwd", "bwd", "bwd det"}
    assert by_dir["fwd"]["softcap / no softcap"] == "0.800" and by_dir["fwd"]["fa3 softcap / no softcap"] == "0.800"
    assert by_dir["fwd"]["fa4 softcap / no softcap"] == "0.800"
    assert by_dir["bwd"]["fa4 softcap / no softcap"] == "check failed"
    assert "fa2 softcap / no softcap" not in header
