"""bench/compare.py's FP8 (e4m3) rows: the option, the FP8 table of the report (e4m3 / bf16 per
problem and the bar's summary), and with PyTorch on CPU the e4m3 inputs and the checker's naive
FP8 computation (FlashAttention-3's: S in bf16, P rounded to e4m3) on a stand-in implementation."""

import json

import pytest

from bench_scripts import load, run_args, table_rows


@pytest.fixture(scope="module")
def compare():
    return load("compare")


def test_dtype_option_takes_e4m3(compare):
    assert run_args(compare, "--dtype", "bf16,e4m3").dtype == ["bf16", "e4m3"]
    assert run_args(compare).dtype == ["bf16", "fp16"]  # e4m3 only when asked for


def canned_rows(compare):
    """hopattn fwd with bf16 and e4m3 inputs, d128 and d256, causal and not, 4k and 16k: e4m3 at 1.6x
    bf16 except 1.4x at d256 causal 4k; a cuDNN bf16 row that the FP8 table leaves out."""
    rows = []
    for hdim in (128, 256):
        for causal in (False, True):
            for seqlen in (4096, 16384):
                p = compare.Problem("bf16", hdim, causal, 16384 // seqlen, seqlen, 2048 // hdim, 2048 // hdim)
                flops = p.fwd_flops()
                speedup = 1.4 if (hdim, causal, seqlen) == (256, True, 4096) else 1.6
                rows.append(p.row("hopattn", "fwd", False, flops / (500.0 * 1e9), check="pass"))
                rows.append(p.row("cudnn", "fwd", False, flops / (450.0 * 1e9), check="pass"))
                rows.append(p.variant(dtype="e4m3").row("hopattn", "fwd", False, flops / (500.0 * speedup * 1e9),
                                                        check="pass"))
    return rows


def test_fp8_table(compare, tmp_path):
    path = tmp_path / "fp8.json"
    path.write_text(json.dumps({"env": {"gpu": "NVIDIA H200 (canned FP8 rows)"}, "rows": canned_rows(compare)}))
    compare.write_report([str(path)], tmp_path, name="fp8", plots=False)
    text = (tmp_path / "fp8.md").read_text()
    start = text.index("## FP8")
    end = text.find("\n## ", start + 1)
    rows = table_rows(text[start:] if end < 0 else text[start:end])
    header = rows[0]
    assert header == ["dir", "dtype", "kind", "d", "causal", "batch x seqlen", "hopattn bf16", "hopattn e4m3",
                      "e4m3 / bf16"]
    by_problem = {tuple(r[:6]): dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)}
    assert len(by_problem) == 8
    row = by_problem[("fwd", "e4m3", "mha", "128", "no", "4 x 4096")]
    assert (row["hopattn bf16"], row["hopattn e4m3"], row["e4m3 / bf16"]) == ("500", "800", "1.600")
    summary = {r[0]: r[1:] for r in rows if len(r) == 4 and r[0] != "panel"}
    assert summary["fwd bf16 d128 non-causal"] == ["2", "1.600", "1.600"]
    assert summary["fwd bf16 d256 causal"][2] == "1.400"
    assert summary["fwd, every panel"][0] == "8"
    # Without e4m3 rows there is no FP8 section.
    assert compare.fp8_table(compare.collect([r for r in canned_rows(compare) if r["dtype"] != "e4m3"])) == ""


def test_e4m3_inputs_and_checker(compare):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    p = compare.Problem("e4m3", 32, True, 2, 48, 4, 2)
    t = compare.Tensors(torch, p, seed=3, device="cpu")
    plain = compare.Tensors(torch, p.variant(dtype="bf16"), seed=3, device="cpu")
    assert t.q.dtype == torch.float8_e4m3fn and not t.q.requires_grad
    assert torch.equal(t.q.to(torch.bfloat16), plain.q.detach().to(torch.float8_e4m3fn).to(torch.bfloat16))
    checker = compare.Checker(torch, p, t)

    def stand_in(p_dtype):  # what an FP8 kernel computes: S in float32, P rounded to p_dtype, O in bf16
        out = torch.zeros(t.q.shape, dtype=torch.bfloat16)
        q, k, v = (x.to(torch.float32) for x in (t.q, t.k, t.v))
        group = p.heads // p.heads_kv
        visible = torch.ones(48, 48, dtype=torch.bool).tril()
        for b in range(p.batch):
            for h in range(p.heads):
                s = q[b, :, h] @ k[b, :, h // group].T / 32 ** 0.5
                probs = torch.softmax(s.masked_fill(~visible, float("-inf")), -1)
                out[b, :, h] = (probs.to(p_dtype).to(torch.float32) @ v[b, :, h // group]).to(torch.bfloat16)
        return out

    assert checker.check("fwd", out=stand_in(torch.float8_e4m3fn)) == "pass"
    assert checker.check("fwd", out=stand_in(torch.float32)) == "pass"  # more exact than the naive one
    wrong = stand_in(torch.float8_e4m3fn)
    wrong[-1, :, -1] *= 1.1
    assert checker.check("fwd", out=wrong).startswith("FAIL: out error")
