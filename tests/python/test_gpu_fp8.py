"""FP8 inputs from PyTorch on a Hopper GPU: float8_e4m3fn q, k, v with descale factors, out in
bfloat16 or float16, against the float64 attention of the dequantized inputs, with FA3's rule whose
bound is the naive FP8 computation (docs/semantics.md, "FP8": S in out's dtype, P rounded to
e4m3, out in its dtype); fixed-length and varlen, GQA, masks, sinks, softcap, a head dim of V's own,
the FlashAttention-3 drop-ins, KV caches in FP8 (contiguous and paged, appends, key splits); the
backward's error. Every test skips, saying why, without an sm_90
GPU."""

import math

import pytest

import hopattn
from conftest import hopper_or_skip

torch = hopper_or_skip()
from test_gpu import check, visible  # noqa: E402  (the float64 reference's mask and the rule)

FP8, BF16, FP16 = torch.float8_e4m3fn, torch.bfloat16, torch.float16
DEVICE = "cuda"


def fp8_inputs(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, head_dim_v=None, descales=True, seed=0):
    """q, k, v in e4m3 and their descales, float32 (batch, heads_kv) in [1/4, 4) (None without)."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, generator=generator).to(FP8)

    q = randn(batch, seqlen_q, heads, head_dim)
    k = randn(batch, seqlen_k, heads_kv, head_dim)
    v = randn(batch, seqlen_k, heads_kv, head_dim_v or head_dim)
    scales = [torch.exp2(torch.rand(batch, heads_kv, device=DEVICE, generator=generator) * 4 - 2) if descales else None
              for _ in range(3)]  # fmt: skip
    return (q, k, v), scales


def dequantized(x, descale, heads):
    """x (batch, seqlen, heads_x, d) times its (batch, heads_kv) descale, as float64, with the KV
    heads repeated to `heads` (q's heads take their KV head's factor)."""
    x = x.double()
    if descale is not None:
        factor = descale.double().repeat_interleave(x.shape[2] // descale.shape[1], dim=1)
        x = x * factor[:, None, :, None]
    return x.repeat_interleave(heads // x.shape[2], dim=2)


def fp8_reference(q, k, v, scales, out_dtype, causal=False, window=(-1, -1), sink=None, softcap=0.0, naive=False):
    """(out, lse): exact, the float64 attention of the dequantized inputs; naive, FA3's FP8
    computation: S rounded to out's dtype, the softmax in float32, P rounded to e4m3, out
    accumulated in float32 and rounded to its dtype."""
    heads = q.shape[2]
    qd, kd, vd = (dequantized(x, d, heads) for x, d in zip((q, k, v), scales))
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd) / math.sqrt(q.shape[-1])
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if naive:
        s = s.to(out_dtype).float()
    mask = visible(q.shape[1], k.shape[1], causal, window, q.device)
    s = s.masked_fill(~mask, float("-inf"))
    if sink is not None:
        column = sink.to(s.dtype)[None, :, None, None].expand(*s.shape[:-1], 1)
        s = torch.cat((s, column), dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows that see nothing: P = 0
    if sink is not None:
        p = p[..., :-1]
    if naive:
        out = torch.einsum("bhqk,bkhd->bqhd", p.to(FP8).float(), vd.float()).to(out_dtype)
    else:
        out = torch.einsum("bhqk,bkhd->bqhd", p, vd)
    return out, lse


CASES = {
    # name: (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, head_dim_v, causal, window, out_dtype, descales)
    "plain": (2, 128, 128, 4, 4, 128, None, False, (-1, -1), BF16, True),
    "causal_gqa": (2, 256, 300, 8, 2, 128, None, True, (-1, -1), BF16, True),
    "causal_mqa_fp16_odd": (1, 113, 203, 4, 1, 64, None, True, (-1, -1), FP16, True),
    "local_no_descales": (2, 200, 200, 4, 2, 96, None, False, (32, 16), BF16, False),
    "d256": (1, 130, 257, 2, 2, 256, None, False, (-1, -1), BF16, True),
    "hdim_v_192_128": (2, 100, 150, 4, 2, 192, 128, True, (-1, -1), BF16, True),
}


@pytest.mark.parametrize("case", CASES)
def test_fp8_forward_matches_the_float64_reference(case):
    batch, sq, sk, heads, heads_kv, d, dv, causal, window, out_dtype, descales = CASES[case]
    (q, k, v), scales = fp8_inputs(batch, sq, sk, heads, heads_kv, d, dv, descales, seed=len(case))
    q_descale, k_descale, v_descale = scales
    out, lse = hopattn.attention(q, k, v, causal=causal, window_size=window, q_descale=q_descale, k_descale=k_descale,
                                 v_descale=v_descale, out_dtype=out_dtype, return_lse=True)  # fmt: skip
    assert out.dtype == out_dtype and out.shape == q.shape[:-1] + v.shape[-1:]
    exact = fp8_reference(q, k, v, scales, out_dtype, causal, window)
    naive = fp8_reference(q, k, v, scales, out_dtype, causal, window, naive=True)
    check("out", out, exact[0], naive[0], out_dtype)
    check("lse", lse, exact[1], naive[1], torch.float32)


def test_fp8_with_sinks_and_softcap():
    (q, k, v), scales = fp8_inputs(2, 150, 120, 8, 2, 128, seed=7)
    sink = torch.linspace(-2, 2, 8, device=DEVICE)
    out, lse = hopattn.attention(q, k, v, causal=True, learnable_sink=sink, softcap=30.0, q_descale=scales[0],
                                 k_descale=scales[1], v_descale=scales[2], return_lse=True)  # fmt: skip
    options = dict(causal=True, sink=sink, softcap=30.0)
    exact = fp8_reference(q, k, v, scales, BF16, **options)
    naive = fp8_reference(q, k, v, scales, BF16, naive=True, **options)
    check("out", out, exact[0], naive[0], BF16)
    check("lse", lse, exact[1], naive[1], torch.float32)


def test_fp8_varlen_takes_a_descale_row_per_sequence():
    lengths_q, lengths_k = [30, 0, 77], [50, 9, 64]
    (q, k, v), scales = fp8_inputs(1, sum(lengths_q), sum(lengths_k), 4, 2, 128, seed=8)
    scales = [torch.exp2(torch.rand(3, 2, device=DEVICE) * 4 - 2) for _ in range(3)]
    cu_q = torch.tensor([0, 30, 30, 107], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 50, 59, 123], dtype=torch.int32, device=DEVICE)
    out = hopattn.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 77, 64, causal=True, q_descale=scales[0],
                                         k_descale=scales[1], v_descale=scales[2])  # fmt: skip
    assert out.dtype == BF16  # FlashAttention-3's out for FP8
    for b in range(3):
        rows_q, rows_k = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lengths_q[b] == 0:
            continue
        sequence = (q[:, rows_q], k[:, rows_k], v[:, rows_k])
        own = [s[b : b + 1] for s in scales]
        exact = fp8_reference(*sequence, own, BF16, causal=True)
        naive = fp8_reference(*sequence, own, BF16, causal=True, naive=True)
        check(f"out[{b}]", out[None, rows_q], exact[0], naive[0], BF16)


def test_fp8_flash_attn_func_matches_attention():
    (q, k, v), scales = fp8_inputs(2, 64, 64, 4, 4, 128, seed=9)
    named = dict(q_descale=scales[0], k_descale=scales[1], v_descale=scales[2])
    assert torch.equal(hopattn.flash_attn_func(q, k, v, causal=True, **named),
                       hopattn.attention(q, k, v, causal=True, **named))  # fmt: skip


def test_fp8_backward_raises():
    (q, k, v), _ = fp8_inputs(1, 64, 64, 2, 2, 64, descales=False, seed=10)
    q.requires_grad_()
    out = hopattn.attention(q, k, v)
    with pytest.raises(NotImplementedError, match="has a forward only"):
        out.float().sum().backward()


KVCACHE_CASES = {
    # name: (seqlen_q, seqlen_new, page_size (0: contiguous), num_splits)
    "decode_contiguous": (1, 0, 0, 0),
    "decode_append_paged_split": (1, 1, 256, 4),
    "speculative_append_contiguous": (4, 4, 0, 0),
    "speculative_paged": (4, 0, 128, 2),
}


@pytest.mark.parametrize("case", KVCACHE_CASES)
def test_fp8_kvcache_matches_the_float64_reference(case):
    """An FP8 KV cache (FlashAttention-3's flash_attn_with_kvcache with descales): per sequence, the
    cache's keys before the call plus the appended ones, GQA, causal (bottom-right: every query
    sees the whole cache); the appended entries bitwise."""
    seqlen_q, seqlen_new, page_size, num_splits = KVCACHE_CASES[case]
    batch, heads, heads_kv, d, capacity = 3, 8, 2, 128, 1024
    generator = torch.Generator(device=DEVICE).manual_seed(len(case))

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, generator=generator).to(FP8)

    lengths = torch.tensor([700, 0, 1000 - seqlen_new], dtype=torch.int32, device=DEVICE)
    q = randn(batch, seqlen_q, heads, d)
    k_rows, v_rows = randn(batch, capacity, heads_kv, d), randn(batch, capacity, heads_kv, d)
    k_new = randn(batch, seqlen_new, heads_kv, d) if seqlen_new else None
    v_new = randn(batch, seqlen_new, heads_kv, d) if seqlen_new else None
    scales = [torch.exp2(torch.rand(batch, heads_kv, device=DEVICE, generator=generator) * 4 - 2) for _ in range(3)]
    if page_size:  # the rows' pages, shuffled over a pool
        pages_per_row = capacity // page_size
        table = torch.randperm(batch * pages_per_row, device=DEVICE, generator=generator).to(torch.int32)
        table = table.view(batch, pages_per_row)
        k_cache = torch.empty(batch * pages_per_row, page_size, heads_kv, d, device=DEVICE, dtype=FP8)
        v_cache = torch.empty_like(k_cache)
        for cache, rows in ((k_cache, k_rows), (v_cache, v_rows)):  # as bytes: e4m3 has no index_put
            cache.view(torch.uint8)[table.long().flatten()] = rows.view(torch.uint8).view(-1, page_size, heads_kv, d)
    else:
        table, k_cache, v_cache = None, k_rows.clone(), v_rows.clone()
    out = hopattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lengths, page_table=table,
                                          causal=True, num_splits=num_splits, q_descale=scales[0],
                                          k_descale=scales[1], v_descale=scales[2])  # fmt: skip
    assert out.dtype == BF16 and out.shape == q.shape

    def row(cache, b):  # sequence b's cache row after the call
        if table is None:
            return cache[b]
        return cache.view(torch.uint8)[table[b].long()].reshape(capacity, heads_kv, d).view(FP8)

    for b in range(batch):
        end = int(lengths[b]) + seqlen_new
        keys, values = row(k_cache, b)[:end], row(v_cache, b)[:end]
        if seqlen_new:
            assert torch.equal(keys[-seqlen_new:].view(torch.uint8), k_new[b].view(torch.uint8)), f"k_new[{b}]"
            assert torch.equal(values[-seqlen_new:].view(torch.uint8), v_new[b].view(torch.uint8)), f"v_new[{b}]"
        if end == 0:
            assert torch.equal(out[b], torch.zeros_like(out[b])), f"out[{b}]: no keys"
            continue
        sequence = (q[b : b + 1], keys[None], values[None])
        own = [s[b : b + 1] for s in scales]
        exact = fp8_reference(*sequence, own, BF16, causal=True)
        naive = fp8_reference(*sequence, own, BF16, causal=True, naive=True)
        check(f"out[{b}]", out[b : b + 1], exact[0], naive[0], BF16)


@pytest.mark.parametrize("pack_gqa", [True, False])
@pytest.mark.parametrize("page_size", [256, 128])
def test_fp8_paged_decode_in_16_splits_repeats_bitwise(pack_gqa, page_size):
    """One query row against 32k paged keys in 16 key splits, 50 calls: the shape that hung on an
    H100 while the transposers' end marker was one flag for the whole v_rows ring (they could read
    it before the last V block's copy had landed and leave without that block). Every call gives
    the same bytes, and the first one the float64 reference's result."""
    heads, heads_kv, d, keys = 32, 8, 128, 32768
    generator = torch.Generator(device=DEVICE).manual_seed(page_size + pack_gqa)

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, generator=generator).to(FP8)

    pages = keys // page_size
    q, k_cache, v_cache = randn(1, 1, heads, d), randn(pages, page_size, heads_kv, d), randn(pages, page_size, heads_kv, d)
    table = torch.randperm(pages, device=DEVICE, generator=generator).to(torch.int32).view(1, pages)
    lengths = torch.full((1,), keys, dtype=torch.int32, device=DEVICE)
    ones = torch.ones(1, heads_kv, device=DEVICE)

    def call():
        return hopattn.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, page_table=table, causal=True,
                                              num_splits=16, pack_gqa=pack_gqa, q_descale=ones, k_descale=ones,
                                              v_descale=ones)  # fmt: skip

    first = call()
    for i in range(49):
        assert torch.equal(call(), first), f"call {i + 1} differs from the first"
    order = table[0].long()  # gathered as bytes: e4m3 has no indexing kernels

    def in_order(cache):
        return cache.view(torch.uint8)[order].reshape(1, keys, heads_kv, d).view(FP8)

    sequence = (q, in_order(k_cache), in_order(v_cache))
    scales = [ones] * 3
    exact = fp8_reference(*sequence, scales, BF16, causal=True)
    naive = fp8_reference(*sequence, scales, BF16, causal=True, naive=True)
    check("out", first, exact[0], naive[0], BF16)
