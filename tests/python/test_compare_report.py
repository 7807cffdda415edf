"""bench/compare.py's report part (markdown table and PNG plots) on a small canned JSON; no GPU,
no PyTorch. The plot test skips when matplotlib is missing."""

import subprocess
import sys
from pathlib import Path

import pytest

from bench_scripts import REPO, import_without, load, table_rows

CANNED = Path(__file__).resolve().parent / "data" / "compare_canned.json"


def load_compare():
    return load("compare")


def test_imports_without_torch_or_matplotlib():
    # The module imports torch and matplotlib only inside functions.
    out = import_without("compare", ["torch", "matplotlib"], "len(compare.PEERS)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "5"


def test_markdown_table(tmp_path):
    compare = load_compare()
    paths = compare.write_report([str(CANNED)], tmp_path, name="canned", plots=False)
    assert paths == [tmp_path / "canned.md"]
    text = (tmp_path / "canned.md").read_text()
    assert "NVIDIA H200 (canned test data)" in text and "peers: fa3 3.0.0" in text
    rows = table_rows(text)
    header = rows[0]
    assert header == ["dir", "dtype", "kind", "d", "causal", "batch x seqlen", "hopattn", "fa3", "cudnn", "fa2",
                      "vs fa3", "vs cudnn", "vs fa2"]
    by_shape = {(r[0], r[2], r[3], r[4], r[5]): dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)}
    row = by_shape[("fwd", "mha", "128", "no", "8 x 2048")]
    assert (row["hopattn"], row["cudnn"], row["fa2"], row["fa3"]) == ("600", "500", "300", "")
    assert (row["vs cudnn"], row["vs fa2"], row["vs fa3"]) == ("1.200", "2.000", "")
    assert by_shape[("fwd", "gqa 64/8", "128", "no", "1 x 16384")]["vs fa3"] == "1.000"
    assert by_shape[("fwd", "varlen", "128", "yes", "6 x 4096 (varlen)")]["vs fa3"] == "1.250"
    assert by_shape[("bwd", "mha", "128", "yes", "8 x 2048")]["vs cudnn"] == "0.050"
    assert by_shape[("bwd det", "mha", "128", "yes", "8 x 2048")]["vs fa3"] == "0.026"
    # The cuDNN-only row (no hopattn result) is not a table row.
    assert not any("1 x 1024" in r for r in rows)
    # Summary: geomean per panel and peer, all rows and seqlen >= 2048.
    summary = {(r[0], r[1]): r for r in rows if len(r) == 7 and r[0] != "panel"}
    assert summary[("fwd bf16 d128 non-causal", "cudnn")][2:6] == ["2", "1.149", "2", "1.149"]
    assert summary[("fwd bf16 d128 non-causal", "fa2")][3] == "2.000"
    assert summary[("fwd bf16 d64 causal", "cudnn")][2:5] == ["1", "0.500", "0"]
    # Rows that were not timed are listed.
    assert "Not timed" in text and "error after" in text


def test_ratio_table_front_end():
    out = subprocess.run([sys.executable, str(REPO / "bench" / "ratio_table.py"), str(CANNED)], capture_output=True,
                         text=True, check=True).stdout
    rows = table_rows(out)
    assert rows[0][-2:] == ["vs cudnn", "vs fa2"]
    assert any(r[5] == "4 x 4096" and r[-2:] == ["1.100", "2.000"] for r in rows)


def test_plots(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: the plot part of compare.py is untested")
    out = subprocess.run([sys.executable, str(REPO / "bench" / "compare.py"), "report", str(CANNED), "--out",
                          str(tmp_path), "--name", "canned"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert names == ["canned-bwd-bf16.png", "canned-bwd-det-bf16.png", "canned-fwd-bf16-gqa64-8.png",
                     "canned-fwd-bf16-varlen.png", "canned-fwd-bf16.png"]
    for name in names:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"]({name})" in (tmp_path / "canned.md").read_text()


@pytest.mark.parametrize("varlen", [False, True])
def test_checker_on_cpu(varlen):
    # The correctness check of `compare.py run` on tiny CPU tensors: PyTorch's own attention (math
    # backend, float32 accumulation) passes FA3's rule; an output with one element off fails it.
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: compare.py's checker is untested here")
    compare = load_compare()
    lengths = [24, 40] if varlen else None
    p = compare.Problem("bf16", 32, True, 2, 32, 4, 2, lengths)
    t = compare.Tensors(torch, p, seed=1, device="cpu")
    checker = compare.Checker(torch, p, t)

    def sdpa(q, k, v):  # (s, h, d) -> (s, h, d), GQA by repeating KV heads
        rep = q.shape[1] // k.shape[1]
        q, k, v = (x.float().transpose(0, 1) for x in (q, k, v))
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(0, 1).to(t.q.dtype)

    if varlen:
        cu = t.cu.tolist()
        out = torch.cat([sdpa(t.q[a:b], t.k[a:b], t.v[a:b]) for a, b in zip(cu[:-1], cu[1:])])
    else:
        out = torch.stack([sdpa(t.q[b], t.k[b], t.v[b]) for b in range(p.batch)])
    assert checker.check("fwd", out=out) == "pass"
    grads = torch.autograd.grad(out, (t.q, t.k, t.v), t.dout)
    assert checker.check("bwd", grads=grads) == "pass"
    bad = out.detach().clone()
    bad.view(-1)[-1] += 1.0  # in the checked slice: the last sequence, the last KV-head group
    assert checker.check("fwd", out=bad).startswith("FAIL: out error")
    dk = grads[1].clone()
    dk.view(-1)[-1] -= 1.0
    assert "dk error" in checker.check("bwd", grads=(grads[0], dk, grads[2]))
    # FLOPs: causal halves 4 * heads * s^2 * d, summed over sequences for varlen.
    expected = sum(4 * 4 * s * s * 32 for s in (lengths or [32, 32])) / 2
    assert p.fwd_flops() == expected


def test_measure_all_rewrites_the_json_after_every_problem(tmp_path):
    # What run and decode share: every problem's rows in order, the file complete after each one
    # (a crash keeps what was measured), the env's "seconds" at the end.
    import json

    compare = load_compare()

    class FakeProblem:
        def __init__(self, n):
            self.n = n

        def describe(self):
            return f"problem {self.n}"

    path = tmp_path / "out.json"
    seen = []

    def measure(p, log):
        if p.n > 0:
            seen.append(json.loads(path.read_text())["rows"])
        return [{"problem": p.n}] * p.n

    env = {"gpu": "test"}
    rows = compare.measure_all([FakeProblem(n) for n in range(3)], "fake", env, str(path), measure)
    assert rows == [{"problem": 1}, {"problem": 2}, {"problem": 2}]
    assert seen == [[], [{"problem": 1}]]
    saved = json.loads(path.read_text())
    assert saved["rows"] == rows and saved["env"]["gpu"] == "test" and "seconds" in saved["env"]
