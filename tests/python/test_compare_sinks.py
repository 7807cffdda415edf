"""bench/compare.py's attention sinks and sliding window: the options, the problems they add, the
row fields (and their defaults in files written before them), the sinks table of the report, all
without a GPU or PyTorch; with PyTorch, the float64 reference with a sink (and its gradient) on CPU
tensors against the formula of docs/semantics.md, the checker on a stand-in implementation, and whole
problems through run_problem with stand-ins for hopattn and FA4."""

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


# ---- options and problems ----

def test_options_default_off(compare):
    a = args(compare)
    assert a.sinks is False and a.window is None


def test_options_parse(compare):
    a = args(compare, "--sinks", "--window", "128", "--causal", "yes")
    assert a.sinks is True and a.window == 128


@pytest.mark.parametrize("extra", [["--window", "-1"], ["--window", "x"], ["--window", "128", "--causal", "no"]])
def test_options_rejected(compare, extra, capsys):
    # A negative or non-integer left size, and a window without causal problems to copy.
    with pytest.raises(SystemExit):
        args(compare, *extra)
    assert "--window" in capsys.readouterr().err


def test_problems_get_window_and_sink_copies(compare):
    a = args(compare, "--hdims", "64,128", "--seqlens", "2048,4096", "--causal", "both", "--dtype", "bf16",
             "--extra", "", "--window", "128", "--sinks")
    problems = compare.build_problems(a)
    # Non-causal: the problem and its sink copy; causal: also the windowed one and its sink copy, each
    # right after the problem it copies.
    assert len(problems) == 2 * 2 * (2 + 4)
    first_causal = next(i for i, p in enumerate(problems) if p.causal)
    copies = problems[first_causal:first_causal + 4]
    assert [(p.window, p.sinks) for p in copies] == [((-1, -1), False), ((128, 0), False), ((-1, -1), True),
                                                      ((128, 0), True)]
    assert len({(p.hdim, p.seqlen, p.batch, p.heads) for p in copies}) == 1
    assert not any(p.window != (-1, -1) for p in problems if not p.causal)
    # Without the options, the problem list is what it was.
    plain = compare.build_problems(args(compare, "--hdims", "64", "--seqlens", "2048", "--dtype", "bf16",
                                        "--extra", ""))
    assert [(p.causal, p.window, p.sinks) for p in plain] == [(False, (-1, -1), False), (True, (-1, -1), False)]


def test_quick_keeps_the_copies(compare):
    a = args(compare, "--hdims", "128", "--causal", "yes", "--dtype", "bf16", "--extra", "varlen", "--quick",
             "--window", "128", "--sinks")
    problems = compare.build_problems(a)
    assert {p.seqlen for p in problems} == {4096}
    assert len(problems) == 2 * 4  # sweep and varlen, each with its three copies


def test_visible_pairs(compare):
    s = 1000
    assert compare.visible_pairs(s, False, (-1, -1)) == s * s
    assert compare.visible_pairs(s, True, (-1, -1)) == s * (s + 1) // 2
    # Causal window (128, 0): query i sees min(i, 128) + 1 keys.
    assert compare.visible_pairs(s, True, (128, 0)) == 129 * s - 128 * 129 // 2
    assert compare.visible_pairs(s, True, (128, -1)) == compare.visible_pairs(s, True, (128, 0))
    # A two-sided window, counted by brute force.
    left, right = 3, 5
    brute = sum(1 for i in range(20) for j in range(20) if i - left <= j <= i + right)
    assert compare.visible_pairs(20, False, (left, right)) == brute


def test_flops(compare):
    p = compare.Problem("bf16", 64, True, 8, 2048, 32, 32)
    assert p.fwd_flops() == 4 * 32 * 2048 * 2048 * 64 * 8 / 2  # plain causal: the FA convention
    windowed = p.variant(window=(128, 0))
    assert windowed.fwd_flops() == 4 * 32 * 64 * 8 * (129 * 2048 - 128 * 129 // 2)
    assert p.variant(sinks=True).fwd_flops() == p.fwd_flops()
    assert p.window == (-1, -1) and not p.sinks  # variant() copies


# ---- rows ----

def test_row_fields(compare):
    p = compare.Problem("bf16", 128, True, 4, 4096, 16, 16)
    row = p.row("hopattn", "fwd", False, 1.0)
    assert (row["softcap"], row["sinks"], row["window_left"], row["window_right"], row["hdim_v"]) == (0, False, -1, -1,
                                                                                                       128)
    row = p.variant(window=(128, 0), sinks=True).row("fa4", "bwd", False, 1.0, check="pass")
    assert (row["softcap"], row["sinks"], row["window_left"], row["window_right"], row["hdim_v"]) == (0, True, 128, 0,
                                                                                                       128)
    assert row["causal"] is True and row["check"] == "pass"
    json.dumps(row)  # every field is JSON


def test_old_rows_read_as_defaults(compare):
    # A row of a file written before the fields existed means: no softcap, no sinks, no window, hdim_v = hdim.
    old = {"impl": "hopattn", "direction": "fwd", "dtype": "bf16", "hdim": 128, "causal": True, "batch": 4,
           "heads": 16, "heads_kv": 16, "seqlen_q": 4096, "seqlen_k": 4096, "varlen": False, "deterministic": False,
           "ms": 1.0, "tflops": 300.0}
    assert [compare.field(old, f) for f in ("softcap", "sinks", "window_left", "window_right", "hdim_v")] == [
        0, False, -1, -1, 128]
    new = compare.Problem("bf16", 128, True, 4, 4096, 16, 16).row("cudnn", "fwd", False, 2.0)
    assert compare.row_key(old) == compare.row_key(new)
    by_key = compare.collect([old, new])
    assert set(by_key[compare.row_key(old)]) == {"hopattn", "cudnn"}
    sinks = dict(new, impl="hopattn", sinks=True)
    assert compare.row_key(sinks) != compare.row_key(old)
    assert compare.without_sinks(compare.row_key(sinks)) == compare.row_key(old)


# ---- the report ----

def canned_sink_rows(compare):
    """hopattn and FA4 with and without sinks, cuDNN without; fwd and bwd, d64 and d128, causal with and
    without the window (128, 0), 2k and 16k. TFLOP/s chosen so that hopattn's ratio sinks / no sinks
    is 0.98, except 0.95 for the backward d128 window row at 16k."""
    rows = []
    for direction in ("fwd", "bwd"):
        for hdim in (64, 128):
            for window in ((-1, -1), (128, 0)):
                for seqlen in (2048, 16384):
                    p = compare.Problem("bf16", hdim, True, 16384 // seqlen, seqlen, 2048 // hdim, 2048 // hdim,
                                        window=window)
                    base = 400.0 if direction == "fwd" else 300.0
                    ratio = 0.95 if (direction, hdim, window, seqlen) == ("bwd", 128, (128, 0), 16384) else 0.98
                    for sinks, factor in ((False, 1.0), (True, ratio)):
                        q = p.variant(sinks=sinks)
                        flops = q.fwd_flops() * (2.5 if direction == "bwd" else 1.0)
                        for impl, tflops in (("hopattn", base * factor), ("fa4", 0.9 * base * (0.9 if sinks else 1))):
                            rows.append(q.row(impl, direction, False, flops / (tflops * 1e9), check="pass"))
                        if not sinks and window == (-1, -1):
                            rows.append(q.row("cudnn", direction, False, flops / (200.0 * 1e9), check="pass"))
    rows.append(compare.Problem("bf16", 64, True, 8, 2048, 32, 32, window=(128, 0), sinks=True)
                .row("hopattn", "bwd", True, None, check="FAIL: dsink error 1 > bound 0.1"))
    return rows


def write_canned(tmp_path, rows):
    path = tmp_path / "sinks.json"
    path.write_text(json.dumps({"env": {"gpu": "NVIDIA H200 (canned sink rows)"}, "rows": rows}))
    return path


def section(text, title):
    """The markdown from the heading `title` to the next heading (or the end)."""
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:] if end < 0 else text[start:end]


def test_sinks_table(compare, tmp_path):
    path = write_canned(tmp_path, canned_sink_rows(compare))
    compare.write_report([str(path)], tmp_path, name="sinks", plots=False)
    text = (tmp_path / "sinks.md").read_text()
    rows = table_rows(section(text, "## Attention sinks"))
    header = rows[0]
    assert header == ["dir", "dtype", "kind", "d", "causal", "batch x seqlen", "hopattn", "hopattn sinks",
                      "sinks / no sinks", "fa4 sinks / no sinks"]
    by_problem = {tuple(r[:6]): dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)}
    assert len(by_problem) == 2 * 2 * 2 * 2
    row = by_problem[("fwd", "bf16", "mha", "64", "yes", "8 x 2048")]
    assert (row["hopattn"], row["hopattn sinks"], row["sinks / no sinks"], row["fa4 sinks / no sinks"]) == (
        "400", "392", "0.980", "0.900")
    assert by_problem[("bwd", "bf16", "mha", "128", "yes, window (128,0)", "1 x 16384")]["sinks / no sinks"] == "0.950"
    # The summary the bar reads: per panel and per direction, geomean and least ratio.
    summary = {r[0]: r[1:] for r in rows if len(r) == 4 and r[0] != "panel"}
    assert summary["fwd bf16 d64 causal"] == ["2", "0.980", "0.980"]
    assert summary["bwd bf16 d128 causal window (128,0)"] == ["2", f"{math.sqrt(0.98 * 0.95):.3f}", "0.950"]
    assert summary["fwd, every panel"] == ["8", "0.980", "0.980"]
    assert summary["bwd, every panel"][0] == "8" and summary["bwd, every panel"][2] == "0.950"
    # The main table shows sink and window rows as problems of their own, against the peers that ran them.
    main = table_rows(text[:text.index("## Attention sinks")])
    head = main[0]
    cells = {tuple(r[:6]): dict(zip(head, r)) for r in main[1:] if len(r) == len(head)}
    sink_row = cells[("fwd", "bf16", "mha sinks", "64", "yes, window (128,0)", "8 x 2048")]
    assert sink_row["hopattn"] == "392" and sink_row["vs fa4"] == f"{392 / 324:.3f}" and sink_row["vs cudnn"] == ""
    assert cells[("fwd", "bf16", "mha", "64", "yes", "8 x 2048")]["vs cudnn"] == "2.000"
    assert "| fwd bf16 d64 causal window (128,0) sinks | fa4 |" in text
    # The untimed row says what it was.
    assert "- hopattn bwd det bf16 d64 causal window (128,0) sinks 8 x 2048 h32/32: FAIL: dsink error" in text


def test_sinks_table_needs_both_rows(compare):
    # A sink row without its no-sinks row (or the other way round) gives no ratio; no sink rows, no table.
    p = compare.Problem("bf16", 64, True, 8, 2048, 32, 32)
    only_sinks = compare.collect([p.variant(sinks=True).row("hopattn", "fwd", False, 1.0)])
    assert compare.sinks_table(only_sinks) == ""
    only_plain = compare.collect([p.row("hopattn", "fwd", False, 1.0)])
    assert compare.sinks_table(only_plain) == ""


def test_report_of_old_files_has_no_sinks_section(compare, tmp_path):
    from test_compare_report import CANNED

    compare.write_report([str(CANNED)], tmp_path, name="canned", plots=False)
    assert "Attention sinks" not in (tmp_path / "canned.md").read_text()


def test_figure_groups_and_names(compare):
    by_key = compare.collect(canned_sink_rows(compare))
    names = sorted(compare.figure_name("r", g) for g in compare.figure_groups(by_key))
    assert names == ["r-bwd-bf16-sinks.png", "r-bwd-bf16-window128_0-sinks.png", "r-bwd-bf16-window128_0.png",
                     "r-bwd-bf16.png", "r-fwd-bf16-sinks.png", "r-fwd-bf16-window128_0-sinks.png",
                     "r-fwd-bf16-window128_0.png", "r-fwd-bf16.png"]
    group = ("fwd", "bf16", "", (128, 0), True)
    assert compare.group_title(group, [{"gpu": "H200"}]) == ("Attention forward speed, bf16, window (128,0), "
                                                            "attention sinks, H200")


# ---- with PyTorch: the reference with sinks, its gradient and the checker, on CPU tensors ----

def problem(compare, varlen, window=(-1, -1), sinks=True):
    lengths = [24, 40] if varlen else None
    return compare.Problem("bf16", 32, True, 2, 32, 4, 2, lengths, window=window, sinks=sinks)


@pytest.mark.parametrize("window", [(-1, -1), (8, 0)])
def test_reference_with_sink_is_the_formula(compare, window):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = problem(compare, False, window)
    t = compare.Tensors(torch, p, seed=3, device="cpu")
    take, qh, kvh = compare._subset(p, t)
    q, k, v, dout = (take(x, h).detach().double() for x, h in ((t.q, qh), (t.k, kvh), (t.v, kvh), (t.dout, qh)))
    sink = t.sink.detach()[qh].double()
    out, dq, dk, dv = compare._attention_slice(torch, q, k, v, dout, True, torch.float64, window, sink)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    expected = direct_attention(torch, leaves[0], leaves[1][:, None], leaves[2][:, None], True, window, sink)
    assert torch.allclose(out, expected, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(expected, leaves, dout)
    for got, want in zip((dq, dk, dv), grads):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    # The sink matters here: without it the output differs well beyond rounding.
    plain = compare._attention_slice(torch, q, k, v, dout, True, torch.float64, window)[0]
    assert (plain - out).abs().max() > 1e-3


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (8, 0)])
def test_sink_gradient_is_autograd_of_the_formula(compare, varlen, window):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = problem(compare, varlen, window)
    t = compare.Tensors(torch, p, seed=5, device="cpu")
    _, qh, kvh = compare._subset(p, t)
    exact, naive, _ = compare._sink_gradient(torch, p, t, qh, kvh)
    # Autograd over every sequence of the batch, all heads, in float64.
    sink = t.sink.detach().double().requires_grad_(True)
    q, k, v, dout = (flat(x.detach().double()) for x in (t.q, t.k, t.v, t.dout))
    loss = sum((direct_attention(torch, q[a:b], k[a:b], v[a:b], True, window, sink) * dout[a:b]).sum()
               for a, b in spans_of(t.q, t.cu))
    (dsink,) = torch.autograd.grad(loss, sink)
    assert torch.allclose(exact, dsink[qh], rtol=1e-10, atol=1e-12)
    # The naive value reads O rounded to bf16: off the exact one, but only by that rounding.
    assert naive.dtype == torch.float32
    error = (naive.double() - exact).abs().max().item()
    assert 0 < error < 1e-2 * exact.abs().max().item()
    # From a stored output D reads it (here 1 everywhere), and the naive value differs from the
    # exact one by float32's rounding only.
    out = torch.zeros_like(t.dout)
    for take in compare._sequence_takes(p, t):
        take(out, qh)[:] = 1  # a view: each sequence's rows of the checked heads
    stored_exact, stored_naive, _ = compare._sink_gradient(torch, p, t, qh, kvh, out)
    ones = torch.zeros_like(exact)
    for take in compare._sequence_takes(p, t):
        q, k = take(t.q, qh).double(), take(t.k, kvh).double()
        for g in range(q.shape[1]):
            scores = q[:, g] @ k.transpose(0, 1) / math.sqrt(q.shape[-1])
            s = scores.shape[0]
            visible = compare._visible(torch, torch.arange(s), s, True, window)
            scores = scores.masked_fill(~visible, float("-inf"))
            lse = torch.logaddexp(torch.logsumexp(scores, -1), t.sink.detach()[qh][g].double())
            ones[g] -= (torch.exp(t.sink.detach()[qh][g].double() - lse) * take(t.dout, qh)[:, g].double().sum(-1)).sum()
    assert torch.allclose(stored_exact, ones, rtol=1e-10, atol=1e-12)
    assert (stored_naive.double() - stored_exact).abs().max() < 1e-5 * stored_exact.abs().max()


def attend(torch, q, k, v, spans, sink, causal, window):
    """What an implementation computes, in float32 from the low-precision inputs, out rounded to their
    dtype, differentiable in q, k, v and the sink: flat (tokens, heads, d) tensors, spans the (start,
    stop) rows of each sequence. The stand-in for hopattn and FA4 on CPU."""
    out = torch.cat([direct_attention(torch, *(x[a:b].float() for x in (q, k, v)), causal, window, sink)
                     for a, b in spans])
    return out.to(q.dtype)


def stand_in(torch, p, t, use_sink=True, use_window=True):
    out = attend(torch, *(flat(x) for x in (t.q, t.k, t.v)), spans_of(t.q, t.cu), t.sink if use_sink else None,
                 p.causal, p.window if use_window else (-1, -1))
    return out.reshape(t.q.shape)


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (8, 0)])
def test_checker_with_sinks(compare, varlen, window):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = problem(compare, varlen, window)
    t = compare.Tensors(torch, p, seed=7, device="cpu")
    plain = compare.Tensors(torch, p.variant(sinks=False), seed=7, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip((t.q, t.k, t.v, t.dout), (plain.q, plain.k, plain.v, plain.dout)))
    assert plain.sink is None and len(plain.inputs()) == 3 and len(t.inputs()) == 4
    assert set(compare.mask_options(p, t)) == ({"learnable_sink", "window_size"} if window != (-1, -1)
                                               else {"learnable_sink"})
    assert compare.mask_options(p.variant(sinks=False, window=(-1, -1)), plain) == {}

    checker = compare.Checker(torch, p, t)
    out = stand_in(torch, p, t)
    assert checker.check("fwd", out=out) == "pass"
    grads = torch.autograd.grad(out, t.inputs(), t.dout)
    assert checker.check("bwd", out=out, grads=grads) == "pass"
    # An implementation that ignores the sink, or the window, fails the forward check.
    assert checker.check("fwd", out=stand_in(torch, p, t, use_sink=False)).startswith("FAIL: out error")
    if window != (-1, -1):
        assert checker.check("fwd", out=stand_in(torch, p, t, use_window=False)).startswith("FAIL: out error")
    # A sink gradient off by more than the bound (2 * the naive error + float32's atol) fails.
    exact, naive, _ = checker.dsink
    bound = 2 * (naive.double() - exact).abs().max().item()
    dsink = grads[3].clone()
    dsink[p.heads - 1] += 4 * bound + 1e-4
    assert "dsink error" in checker.check("bwd", out=out, grads=(*grads[:3], dsink))
    # So does a backward whose output, from which dsink is checked, is wrong.
    assert checker.check("bwd", out=stand_in(torch, p, t, use_sink=False), grads=grads).startswith("FAIL: out error")


def fake_hopattn(torch):
    """hopattn's attention and attention_varlen as the stand-in, each call bound to the real package's
    signature (this checkout's python/hopattn), so that a keyword compare.py passes and the package
    lacks fails here."""
    def attention(q, k, v, *, causal=False, window_size=(-1, -1), deterministic=False, learnable_sink=None):
        out = attend(torch, *(flat(x) for x in (q, k, v)), spans_of(q), learnable_sink, causal, window_size)
        return out.reshape(q.shape)

    def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                         window_size=(-1, -1), deterministic=False, learnable_sink=None):
        return attend(torch, q, k, v, spans_of(q, cu_seqlens_q), learnable_sink, causal, window_size)

    return signature_bound_hopattn(attention, attention_varlen)


def fake_fa4(torch, calls):
    """flash_attn.cute with the stand-in behind flash_attn_func and flash_attn_varlen_func; each call's
    keywords are recorded in `calls`."""
    def flash_attn_func(q, k, v, **kw):
        calls.append(kw)
        return attend(torch, *(flat(x) for x in (q, k, v)), spans_of(q), kw.get("learnable_sink"), kw["causal"],
                      kw.get("window_size", (-1, -1))).reshape(q.shape), None

    def flash_attn_varlen_func(q, k, v, **kw):
        calls.append(kw)
        return attend(torch, q, k, v, spans_of(q, kw["cu_seqlens_q"]), kw.get("learnable_sink"), kw["causal"],
                      kw.get("window_size", (-1, -1))), None

    cute = types.SimpleNamespace(flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func)
    return types.SimpleNamespace(cute=cute), cute


@pytest.mark.parametrize("varlen", [False, True])
def test_run_problem_on_cpu(compare, monkeypatch, varlen):
    # Each copy of a problem runs, is checked and "timed" for hopattn and FA4 (both given the window
    # and the sinks, and both differentiated in the sinks); FA2 through SDPA only where it has no
    # window and no sinks.
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import hopattn

    if not hopattn.torch_available():
        pytest.skip("hopattn's PyTorch API is not available (PyTorch older than 2.4)")
    calls, timed = [], []
    flash_attn, cute = fake_fa4(torch, calls)
    monkeypatch.setitem(sys.modules, "hopattn", fake_hopattn(torch))
    monkeypatch.setitem(sys.modules, "flash_attn", flash_attn)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)

    def median_ms(torch, fn, warmup, reps, budget_s):
        timed.append(fn())
        return 0.5, 3

    monkeypatch.setattr(compare.gpu_timing, "median_ms", median_ms)
    a = args(compare, "--window", "8", "--sinks", "--causal", "yes")
    impls = ["hopattn", "fa4"] + ([] if varlen else ["fa2"])
    base = problem(compare, varlen, sinks=False)
    for p in (base, base.variant(window=(8, 0)), base.variant(sinks=True), base.variant(window=(8, 0), sinks=True)):
        log, calls[:], timed[:] = [], [], []
        rows = compare.run_problem(torch, p, a, impls, log.append, device="cpu")
        expected = [("hopattn", "fwd", False), ("hopattn", "bwd", False), ("hopattn", "bwd", True),
                    ("fa4", "fwd", False), ("fa4", "bwd", False), ("fa4", "bwd", True)]
        plain = p.window == (-1, -1) and not p.sinks
        if "fa2" in impls and plain:
            expected += [("fa2", "fwd", False), ("fa2", "bwd", False)]
        assert [(r["impl"], r["direction"], r["deterministic"]) for r in rows] == expected, log
        assert all(r["check"] == "pass" and r["ms"] == 0.5 for r in rows), rows
        assert all((r["sinks"], r["window_left"], r["window_right"], r["softcap"], r["hdim_v"]) ==
                   (p.sinks, *p.window, 0, 32) for r in rows)
        if "fa2" in impls and not plain:
            assert any("fa2 fwd: not supported" in line for line in log), log
        # FA4 got the window and the sinks; the timed backward returned the sinks' gradient too.
        assert all((kw.get("window_size", (-1, -1)), "learnable_sink" in kw) == (p.window, p.sinks) for kw in calls)
        assert all(len(r) == (4 if p.sinks else 3) for r in timed if isinstance(r, tuple))
