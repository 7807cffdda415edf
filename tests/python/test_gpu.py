"""hopattn from PyTorch on a Hopper GPU: values, LSE and gradients against a float64 PyTorch
reference on upcast inputs, with the C++ suites' tolerance rule (FlashAttention-3's: the error is at
most 2x the error of the same computation done naively in the input's precision, plus an atol from
that precision's rounding); causal, windows, GQA/MQA, varlen with empty sequences and seqused, odd
sizes, strided views; determinism; torch.compile(fullgraph=True); CUDA-graph capture and replay;
errors with CUDA tensors; KV caches (contiguous and paged, appends with rotary embedding, chunked
prefill) against the same reference on the updated cache; attention sinks (learnable_sink), their
gradient included; softcapping (softcap), forward and backward. Every test skips, saying why,
without an sm_90 GPU."""

import math

import pytest

import hopattn
from conftest import hopper_or_skip

torch = hopper_or_skip()

BF16, FP16 = torch.bfloat16, torch.float16
DEVICE = "cuda"


# --- the float64 reference -----------------------------------------------------------------------


def visible(seqlen_q, seqlen_k, causal, window, device):
    """(seqlen_q, seqlen_k) bool: key j visible to query i (docs/semantics.md, bottom-right aligned)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    shift = seqlen_k - seqlen_q
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= i + shift - left
    if right >= 0:
        mask &= j <= i + shift + right
    return mask


def attention_reference(q, k, v, causal=False, window=(-1, -1), scale=None, upcast=True, sink=None, softcap=0.0):
    """out (b, sq, h, d) and lse (b, h, sq). upcast=True: float64 (the exact value); False: the
    naive computation in the inputs' precision (the yardstick of the tolerance rule). sink: the
    (h,) attention sinks, a column of scores without a value. softcap > 0: the scores are capped,
    softcap * tanh(scores / softcap), before the mask."""
    dtype = torch.float64 if upcast else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    heads, heads_kv = q.shape[2], k.shape[2]
    k = k.repeat_interleave(heads // heads_kv, dim=2)
    v = v.repeat_interleave(heads // heads_kv, dim=2)
    scale = 1.0 / math.sqrt(q.shape[-1]) if not scale else scale
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    mask = visible(q.shape[1], k.shape[1], causal, window, q.device)
    s = s.masked_fill(~mask, float("-inf"))
    if sink is not None:
        # Softmax over [scores, sink], the sink's column dropped: a row without a visible key
        # gets P = 0 and lse = sink, without NaN.
        column = sink.to(s.dtype)[None, :, None, None].expand(*s.shape[:-1], 1)
        s = torch.cat((s, column), dim=-1)
        lse = torch.logsumexp(s.to(torch.float64 if upcast else torch.float32), dim=-1)
        p = torch.softmax(s, dim=-1)[..., :-1].to(v.dtype)
        return torch.einsum("bhqk,bkhd->bqhd", p, v), lse
    any_key = mask.any(-1)[:, None]  # (sq, 1)
    lse = torch.logsumexp(s.to(torch.float64 if upcast else torch.float32), dim=-1)
    # Rows without a visible key: P = 0 (softmax of a dummy row, then zeroed, so no NaN gradient).
    p = torch.softmax(torch.where(any_key, s, torch.zeros_like(s)), dim=-1)
    p = torch.where(any_key, p, torch.zeros_like(p)).to(v.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return out, lse


def rule_atol(exact, dtype):
    x = exact[torch.isfinite(exact)]
    if x.numel() == 0:
        return 0.0
    shifted = ((x.to(dtype) + 0.3) - 0.3).to(torch.float64)
    return 2 * (shifted - x).abs().max().item()


def check(name, got, exact, naive, dtype, multiplier=2.0):
    got, exact, naive = got.detach().double(), exact.detach().double(), naive.detach().double()
    finite = torch.isfinite(exact)
    assert torch.equal(got[~finite], exact[~finite]), f"{name}: rows that see no key must be exactly {exact[~finite][:4]}"
    g, e, n = got[finite], exact[finite], naive[finite]
    assert torch.isfinite(g).all(), f"{name}: non-finite values"
    error = (g - e).abs().max().item() if g.numel() else 0.0
    keep = torch.isfinite(n)
    naive_error = (n[keep] - e[keep]).abs().max().item() if keep.any() else 0.0
    atol = rule_atol(e, dtype)
    assert error <= multiplier * naive_error + atol, (
        f"{name}: max error {error:.3g} vs bound {multiplier} * naive {naive_error:.3g} + atol {atol:.3g}"
    )


def randn(*shape, dtype=BF16, grad=True):
    return torch.randn(*shape, dtype=dtype, device=DEVICE).requires_grad_(grad)


def run_or_skip(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except hopattn.NotSupportedError as e:
        pytest.skip(f"this build has no kernel for it: {e}")


def check_fixed(q, k, v, causal=False, window=(-1, -1), scale=None, deterministic=False, sink=None, softcap=0.0):
    dtype = q.dtype
    out, lse = run_or_skip(hopattn.attention, q, k, v, causal=causal, window_size=window, softmax_scale=scale,
                           deterministic=deterministic, return_lse=True, learnable_sink=sink, softcap=softcap)
    assert out.shape == q.shape[:-1] + v.shape[-1:] and out.dtype == dtype  # O has V's head dim
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    inputs = (q, k, v) if sink is None else (q, k, v, sink)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, dout)
    reference = dict(scale=scale, sink=sink, softcap=softcap)
    exact_out, exact_lse = attention_reference(q, k, v, causal, window, upcast=True, **reference)
    exact_grads = torch.autograd.grad(exact_out, inputs, dout.double())
    naive_out, naive_lse = attention_reference(q, k, v, causal, window, upcast=False, **reference)
    naive_grads = torch.autograd.grad(naive_out, inputs, dout)
    check("out", out, exact_out, naive_out, dtype)
    check("lse", lse, exact_lse, naive_lse, torch.float32)
    for name, g, e, n in zip(("dq", "dk", "dv", "dsink"), grads, exact_grads, naive_grads):
        check(name, g, e, n, dtype if name != "dsink" else torch.float32)
    return out, lse, grads


# --- values ----------------------------------------------------------------------------------------

CASES = {
    # name: (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, window, dtype)
    "plain": (2, 128, 128, 4, 4, 128, False, (-1, -1), BF16),
    "causal_gqa": (2, 256, 256, 8, 2, 128, True, (-1, -1), BF16),
    "causal_mqa_fp16_odd": (1, 113, 203, 4, 1, 64, True, (-1, -1), FP16),
    "causal_more_queries_than_keys": (2, 203, 113, 4, 2, 128, True, (-1, -1), BF16),
    "two_sided_window": (2, 200, 200, 4, 4, 128, False, (32, 16), BF16),
    "causal_local": (2, 97, 97, 4, 2, 96, True, (40, -1), BF16),
    "seqlen_q_1": (3, 1, 77, 2, 2, 256, False, (-1, -1), BF16),
    "head_dim_72_rounds_up": (1, 64, 80, 2, 1, 72, True, (-1, -1), BF16),
    "head_dim_192": (1, 130, 130, 2, 2, 192, False, (64, 0), FP16),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_forward_backward_match_the_float64_reference(case):
    batch, sq, sk, heads, heads_kv, d, causal, window, dtype = CASES[case]
    torch.manual_seed(hash(case) % 1000)
    q, k, v = randn(batch, sq, heads, d, dtype=dtype), randn(batch, sk, heads_kv, d, dtype=dtype), randn(
        batch, sk, heads_kv, d, dtype=dtype
    )
    check_fixed(q, k, v, causal, window)


# name: (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, head_dim_v, causal, dtype)
HEAD_DIM_V_CASES = {
    "192x128_causal_gqa": (2, 300, 300, 4, 2, 192, 128, True, BF16),  # the pair's own kernels
    "192x128_more_keys_fp16": (1, 257, 400, 2, 2, 192, 128, False, FP16),
    "128x64_causal_mqa": (2, 200, 200, 4, 1, 128, 64, True, BF16),  # on the (128, 128) kernels
    "64x128_v_wider": (1, 130, 130, 2, 2, 64, 128, False, BF16),
    "72x40_causal": (1, 97, 150, 4, 2, 72, 40, True, BF16),
}


@pytest.mark.parametrize("case", HEAD_DIM_V_CASES, ids=list(HEAD_DIM_V_CASES))
def test_head_dim_v_forward_backward_match_the_float64_reference(case):
    batch, sq, sk, heads, heads_kv, d, dv, causal, dtype = HEAD_DIM_V_CASES[case]
    torch.manual_seed(hash(case) % 1000)
    q, k = randn(batch, sq, heads, d, dtype=dtype), randn(batch, sk, heads_kv, d, dtype=dtype)
    v = randn(batch, sk, heads_kv, dv, dtype=dtype)
    _, _, (dq, dk, dv_grad) = check_fixed(q, k, v, causal)
    assert dq.shape == q.shape and dk.shape == k.shape and dv_grad.shape == v.shape


def test_head_dim_v_through_the_drop_ins_and_a_paged_kvcache():
    """(192, 128) through flash_attn_func, the varlen call and a paged KV cache with decode key
    splits: each equals attention() on the same tensors or the float64 reference."""
    torch.manual_seed(31)
    q, k, v = randn(2, 128, 4, 192, grad=False), randn(2, 256, 2, 192, grad=False), randn(2, 256, 2, 128, grad=False)
    ours = run_or_skip(hopattn.attention, q, k, v, causal=True, num_splits=1)
    assert ours.shape == (2, 128, 4, 128)
    assert torch.equal(hopattn.flash_attn_func(q, k, v, causal=True), ours)
    cu_q = torch.tensor([0, 128, 256], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 256, 512], dtype=torch.int32, device=DEVICE)
    packed = hopattn.attention_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, 128, 256,
                                      causal=True)
    exact, _ = attention_reference(q, k, v, True, upcast=True)
    naive, _ = attention_reference(q, k, v, True, upcast=False)
    check("varlen out", packed.unflatten(0, (2, 128)), exact, naive, BF16)
    # Decode from a paged cache of 16-token pages (gathered rows) and 256-token pages (TMA).
    q1 = randn(2, 1, 4, 192, grad=False)
    exact1, _ = attention_reference(q1, k, v, True, upcast=True)
    naive1, _ = attention_reference(q1, k, v, True, upcast=False)
    for page in (16, 256):
        pages = 256 // page
        k_cache = k.reshape(2 * pages, page, 2, 192)
        v_cache = v.reshape(2 * pages, page, 2, 128)
        table = torch.arange(2 * pages, dtype=torch.int32, device=DEVICE).view(2, pages)
        for splits in (1, 4):
            out = hopattn.attention_with_kvcache(q1, k_cache, v_cache, page_table=table, causal=True,
                                                 num_splits=splits)
            check(f"kvcache page {page} splits {splits}", out, exact1, naive1, BF16)


def test_softmax_scale_is_used_as_given():
    torch.manual_seed(1)
    q, k, v = randn(2, 96, 4, 128), randn(2, 96, 4, 128), randn(2, 96, 4, 128)
    check_fixed(q, k, v, causal=True, scale=0.3)


def test_strided_views_of_packed_qkv():
    torch.manual_seed(2)
    qkv = randn(2, 150, 3, 4, 128)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    check_fixed(q, k, v, causal=True)
    out = hopattn.attention(q, k, v, causal=True)
    out.sum().backward()
    assert qkv.grad is not None and qkv.grad.shape == qkv.shape


def test_flash_attn_func_matches_attention():
    torch.manual_seed(3)
    q, k, v = randn(2, 128, 8, 128, grad=False), randn(2, 128, 2, 128, grad=False), randn(2, 128, 2, 128, grad=False)
    ours = hopattn.attention(q, k, v, causal=True, return_lse=True, num_splits=1)  # FA3's default: no split
    theirs = hopattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    # FlashAttention-3: causal overrides the right window instead of rejecting it.
    assert torch.equal(hopattn.flash_attn_func(q, k, v, causal=True, window_size=(-1, 5)), ours[0])


@pytest.mark.parametrize("num_splits", [0, 1, 5])
@pytest.mark.parametrize("pack_gqa", [None, True, False])
def test_decode_with_key_splits_and_packed_heads(num_splits, pack_gqa):
    """One query row per sequence against a 3000-key cache, GQA 32/8: split or not, packed or not,
    the values match the reference, and the drop-in passes both options through."""
    torch.manual_seed(20)
    q, k, v = randn(4, 1, 32, 128, grad=False), randn(4, 3000, 8, 128, grad=False), randn(4, 3000, 8, 128, grad=False)
    out, lse = run_or_skip(hopattn.attention, q, k, v, causal=True, return_lse=True, num_splits=num_splits,
                           pack_gqa=pack_gqa)
    exact_out, exact_lse = attention_reference(q, k, v, True, upcast=True)
    naive_out, naive_lse = attention_reference(q, k, v, True, upcast=False)
    check("out", out, exact_out, naive_out, BF16)
    check("lse", lse, exact_lse, naive_lse, torch.float32)
    again = hopattn.attention(q, k, v, causal=True, num_splits=num_splits, pack_gqa=pack_gqa)
    assert torch.equal(out, again)  # splits merge in a fixed order
    drop_in = hopattn.flash_attn_func(q, k, v, causal=True, num_splits=num_splits, pack_gqa=pack_gqa)
    assert torch.equal(out, drop_in)


def test_zero_size_problems():
    q, k = randn(2, 16, 4, 128, grad=False), randn(2, 0, 4, 128, grad=False)
    out, lse = hopattn.attention(q, k, k, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse).all()
    empty = randn(0, 16, 4, 128, grad=False)
    assert hopattn.attention(empty, empty, empty).shape == empty.shape


# --- attention sinks -------------------------------------------------------------------------------


def sinks(heads, grad=True):
    """float32 (heads,) sink logits from about as small as a row's scores to well above their
    log-sum-exp, so that the sink takes anything from a sliver to most of a row's weight."""
    return (torch.rand(heads, device=DEVICE) * 10 - 3).requires_grad_(grad)


SINK_CASES = {
    # name: (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, window)
    "causal_gqa": (2, 256, 256, 8, 2, 128, True, (-1, -1)),
    "local_window": (2, 300, 300, 4, 4, 128, False, (128, 0)),
    # The first 90 queries see no key: out = 0, lse = sink, and they still add to the sink's gradient.
    "causal_rows_without_keys": (1, 203, 113, 4, 2, 64, True, (-1, -1)),
}


@pytest.mark.parametrize("case", SINK_CASES, ids=list(SINK_CASES))
def test_sinks_forward_backward_match_the_float64_reference(case):
    batch, sq, sk, heads, heads_kv, d, causal, window = SINK_CASES[case]
    torch.manual_seed(50 + sq)
    q, k, v = randn(batch, sq, heads, d), randn(batch, sk, heads_kv, d), randn(batch, sk, heads_kv, d)
    sink = sinks(heads)
    check_fixed(q, k, v, causal, window, sink=sink)
    # The sink's gradient is a fixed-order sum: the same bits on every run.
    dout = torch.randn(q.shape, dtype=q.dtype, device=DEVICE)
    first, second = (torch.autograd.grad(hopattn.attention(q, k, v, causal=causal, window_size=window,
                                                           learnable_sink=sink), sink, dout)[0] for _ in range(2))
    assert torch.equal(first, second)


@pytest.mark.parametrize("num_splits", [1, 5])
def test_sinks_in_decode_with_key_splits_and_from_a_kvcache(num_splits):
    """One query row per sequence against 3000 keys (GQA 32/8): the split pieces merge with the
    sink counted once, through attention() and through attention_with_kvcache on full caches."""
    torch.manual_seed(60 + num_splits)
    q, k, v = randn(4, 1, 32, 128, grad=False), randn(4, 3000, 8, 128, grad=False), randn(4, 3000, 8, 128, grad=False)
    sink = sinks(32, grad=False)
    exact_out, exact_lse = attention_reference(q, k, v, True, upcast=True, sink=sink)
    naive_out, naive_lse = attention_reference(q, k, v, True, upcast=False, sink=sink)
    for call in (hopattn.attention, hopattn.attention_with_kvcache):
        out, lse = run_or_skip(call, q, k, v, causal=True, return_lse=True, num_splits=num_splits,
                               learnable_sink=sink)  # fmt: skip
        check(f"{call.__name__} out", out, exact_out, naive_out, BF16)
        check(f"{call.__name__} lse", lse, exact_lse, naive_lse, torch.float32)


# --- varlen ----------------------------------------------------------------------------------------


def varlen_reference(q, k, v, lens_q, lens_k, used_q, used_k, causal, window, upcast, sink=None, scale=None,
                     softcap=0.0):  # fmt: skip
    """Packed out (total_q, h, d) and lse (h, total_q); rows outside the used tokens: 0 and -inf."""
    dtype = torch.float64 if upcast else q.dtype
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64 if upcast else torch.float32,
                     device=q.device)
    start_q = start_k = 0
    outs, lses = [], []
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        uq = used_q[b] if used_q is not None else lq
        uk = used_k[b] if used_k is not None else lk
        if uq > 0:
            o, l = attention_reference(q[None, start_q:start_q + uq], k[None, start_k:start_k + uk],
                                       v[None, start_k:start_k + uk], causal, window, scale, upcast=upcast, sink=sink,
                                       softcap=softcap)  # fmt: skip
            outs.append((start_q, uq, o[0], l[0]))
        start_q += lq
        start_k += lk
    # Assembled without in-place writes into leaves, so autograd flows back to q, k, v.
    pieces_out, pieces_lse, cursor = [], [], 0
    for start, n, o, l in outs:
        if start > cursor:
            pieces_out.append(out[cursor:start])
            pieces_lse.append(lse[:, cursor:start])
        pieces_out.append(o)
        pieces_lse.append(l)
        cursor = start + n
    pieces_out.append(out[cursor:])
    pieces_lse.append(lse[:, cursor:])
    return torch.cat(pieces_out, 0), torch.cat(pieces_lse, 1)


@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
@pytest.mark.parametrize("with_seqused", [False, True], ids=["full", "seqused"])
def test_varlen_with_empty_sequences(with_seqused, with_sink):
    """With sinks, the rows of a sequence without keys get out = 0 and lse = sink, while rows of
    no sequence (beyond seqused) stay 0 and -inf."""
    torch.manual_seed(4)
    check_varlen(with_seqused, with_sink)


def check_varlen(with_seqused, with_sink, scale=None, softcap=0.0):
    """Six sequences, some empty, GQA 8/2, causal: out, lse and the gradients (the sink's too)
    against the reference."""
    lens_q, lens_k = [0, 17, 128, 1, 64, 33], [5, 40, 128, 0, 64, 200]
    used_q = [0, 10, 128, 1, 50, 33] if with_seqused else None
    used_k = [3, 40, 100, 0, 64, 150] if with_seqused else None
    heads, heads_kv, d, dtype = 8, 2, 128, BF16
    q = randn(sum(lens_q), heads, d)
    k, v = randn(sum(lens_k), heads_kv, d), randn(sum(lens_k), heads_kv, d)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    seq_q = torch.tensor(used_q, dtype=torch.int32, device=DEVICE) if with_seqused else None
    seq_k = torch.tensor(used_k, dtype=torch.int32, device=DEVICE) if with_seqused else None
    causal, window = True, (-1, -1)
    sink = sinks(heads) if with_sink else None
    out, lse = run_or_skip(hopattn.attention_varlen, q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                           seqused_q=seq_q, seqused_k=seq_k, softmax_scale=scale, causal=causal, return_lse=True,
                           learnable_sink=sink, softcap=softcap)  # fmt: skip
    assert out.shape == q.shape and lse.shape == (heads, q.shape[0])
    inputs = (q, k, v) if sink is None else (q, k, v, sink)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, dout)
    exact_out, exact_lse = varlen_reference(q, k, v, lens_q, lens_k, used_q, used_k, causal, window, True, sink,
                                            scale, softcap)  # fmt: skip
    exact_grads = torch.autograd.grad(exact_out, inputs, dout.double(), allow_unused=True)
    naive_out, naive_lse = varlen_reference(q, k, v, lens_q, lens_k, used_q, used_k, causal, window, False, sink,
                                            scale, softcap)  # fmt: skip
    naive_grads = torch.autograd.grad(naive_out, inputs, dout, allow_unused=True)
    check("out", out, exact_out, naive_out, dtype)
    check("lse", lse, exact_lse, naive_lse, torch.float32)
    for name, g, e, n in zip(("dq", "dk", "dv", "dsink"), grads, exact_grads, naive_grads):
        e = torch.zeros_like(g, dtype=torch.float64) if e is None else e
        n = torch.zeros_like(g) if n is None else n
        check(name, g, e, n, dtype if name != "dsink" else torch.float32)


# --- softcapping -----------------------------------------------------------------------------------
#
# With the default scale, random inputs give scores of about N(0, 1), which a cap of 30 barely
# touches; a larger softmax_scale spreads them to where the cap bends them (tanh saturates), as it
# does for Gemma 2's large logits.

SOFTCAP_CASES = {
    # name: (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, window, softmax_scale, softcap, dtype)
    "cap30_causal_gqa": (2, 256, 256, 8, 2, 128, True, (-1, -1), 1.0, 30.0, BF16),
    "cap30_plain_fp16_odd": (1, 113, 203, 4, 4, 64, False, (-1, -1), 1.0, 30.0, FP16),
    "cap5_causal_mqa": (2, 200, 200, 4, 1, 128, True, (-1, -1), 0.5, 5.0, BF16),
    # The first 90 queries see no key: out = 0 and lse = -inf, as without a cap.
    "cap5_rows_without_keys": (1, 203, 113, 4, 2, 128, True, (-1, -1), 0.5, 5.0, BF16),
    "cap30_local_default_scale": (2, 300, 300, 4, 2, 256, False, (64, 32), None, 30.0, BF16),
}


@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=list(SOFTCAP_CASES))
def test_softcap_forward_backward_match_the_float64_reference(case):
    batch, sq, sk, heads, heads_kv, d, causal, window, scale, softcap, dtype = SOFTCAP_CASES[case]
    torch.manual_seed(70 + sq)
    q, k = randn(batch, sq, heads, d, dtype=dtype), randn(batch, sk, heads_kv, d, dtype=dtype)
    v = randn(batch, sk, heads_kv, d, dtype=dtype)
    out = check_fixed(q, k, v, causal, window, scale, softcap=softcap)[0]
    if scale is not None:  # the cap must have changed the result, or the comparison proves little
        uncapped = hopattn.attention(q, k, v, causal=causal, window_size=window, softmax_scale=scale)
        assert (out.float() - uncapped.float()).abs().max() > 0.05


@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
def test_softcap_varlen(with_sink):
    torch.manual_seed(71)
    check_varlen(True, with_sink, scale=1.0, softcap=30.0)


@pytest.mark.parametrize("num_splits", [1, 5])
def test_softcap_in_decode_with_key_splits_and_from_a_kvcache(num_splits):
    """One query row per sequence against 3000 keys (GQA 32/8), split or not, through attention(),
    attention_with_kvcache and the FA3 drop-in flash_attn_with_kvcache on full caches."""
    torch.manual_seed(72 + num_splits)
    q, k, v = randn(4, 1, 32, 128, grad=False), randn(4, 3000, 8, 128, grad=False), randn(4, 3000, 8, 128, grad=False)
    exact_out, exact_lse = attention_reference(q, k, v, True, scale=1.0, upcast=True, softcap=30.0)
    naive_out, naive_lse = attention_reference(q, k, v, True, scale=1.0, upcast=False, softcap=30.0)
    calls = {
        "attention": lambda: hopattn.attention(q, k, v, causal=True, softmax_scale=1.0, softcap=30.0,
                                               num_splits=num_splits, return_lse=True),
        "attention_with_kvcache": lambda: hopattn.attention_with_kvcache(q, k, v, causal=True, softmax_scale=1.0,
                                                                         softcap=30.0, num_splits=num_splits,
                                                                         return_lse=True),
        "flash_attn_with_kvcache": lambda: hopattn.flash_attn_with_kvcache(q, k, v, causal=True, softmax_scale=1.0,
                                                                           softcap=30.0, num_splits=num_splits,
                                                                           return_softmax_lse=True),
    }  # fmt: skip
    for name, call in calls.items():
        out, lse = run_or_skip(call)
        check(f"{name} out", out, exact_out, naive_out, BF16)
        check(f"{name} lse", lse, exact_lse, naive_lse, torch.float32)


def test_flash_attn_drop_ins_pass_softcap_through():
    """FlashAttention-3's functions with softcap give what hopattn's give (bitwise, same options),
    gradients included, and match the reference."""
    torch.manual_seed(73)
    q, k, v = randn(2, 128, 8, 128), randn(2, 128, 2, 128), randn(2, 128, 2, 128)
    # Deterministic, so that the gradients can be compared bitwise too.
    ours = run_or_skip(hopattn.attention, q, k, v, causal=True, softmax_scale=1.0, softcap=30.0, num_splits=1,
                       deterministic=True, return_lse=True)  # fmt: skip
    theirs = hopattn.flash_attn_func(q, k, v, causal=True, softmax_scale=1.0, softcap=30.0, deterministic=True,
                                     return_attn_probs=True)  # fmt: skip
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    dout = torch.randn_like(ours[0])
    for a, b in zip(torch.autograd.grad(ours[0], (q, k, v), dout), torch.autograd.grad(theirs[0], (q, k, v), dout)):
        assert torch.equal(a, b)
    exact_out, _ = attention_reference(q, k, v, True, scale=1.0, upcast=True, softcap=30.0)
    naive_out, _ = attention_reference(q, k, v, True, scale=1.0, upcast=False, softcap=30.0)
    check("flash_attn_func out", theirs[0], exact_out, naive_out, BF16)

    cu = torch.tensor([0, 128, 256], dtype=torch.int32, device=DEVICE)
    qv, kv, vv = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)
    ours = hopattn.attention_varlen(qv, kv, vv, cu, cu, 128, 128, causal=True, softmax_scale=1.0, softcap=30.0,
                                    num_splits=1)  # fmt: skip
    theirs = hopattn.flash_attn_varlen_func(qv, kv, vv, cu, cu, 128, 128, causal=True, softmax_scale=1.0,
                                            softcap=30.0)  # fmt: skip
    assert torch.equal(ours, theirs)
    check("flash_attn_varlen_func out", theirs.view(q.shape), exact_out, naive_out, BF16)


# --- KV cache --------------------------------------------------------------------------------------


def rotate(x, cos, sin, positions, interleaved):
    """Rotary embedding of x (b, s, h, d) at positions (b, s): computed in float32, rounded once."""
    half = cos.shape[1]
    c, s = cos[positions].float()[:, :, None], sin[positions].float()[:, :, None]  # (b, s, 1, half)
    x = x.float()
    rot, rest = x[..., : 2 * half], x[..., 2 * half :]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rot = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
        rot = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rot, rest), dim=-1).to(cos.dtype)


def to_pages(caches, page_size, gap_rows=0):
    """Contiguous caches (b, capacity, h, d) scattered over a shuffled pool of pages (a few spare
    ones unowned): (pages for each cache, page_table). gap_rows > 0: each page is a view that far
    short of the next one (page stride (page_size + gap_rows) rows)."""
    batch, capacity = caches[0].shape[:2]
    max_pages = capacity // page_size
    num_pages = batch * max_pages + 3
    table = torch.randperm(num_pages, device=DEVICE)[: batch * max_pages].view(batch, max_pages)
    pages = []
    for cache in caches:
        shape = (num_pages, page_size + gap_rows, *cache.shape[2:])
        pool = torch.randn(shape, dtype=cache.dtype, device=DEVICE)[:, :page_size]
        pool[table.flatten()] = cache.reshape(batch * max_pages, page_size, *cache.shape[2:])
        pages.append(pool)
    return pages, table.to(torch.int32)


def from_pages(pages, table):
    batch, max_pages = table.shape
    return pages[table.long()].reshape(batch, max_pages * pages.shape[1], *pages.shape[2:])


@pytest.mark.parametrize("page_size", [0, 16, 256], ids=["contiguous", "page16", "page256"])
@pytest.mark.parametrize("rotary", [None, True, False], ids=["no_rotary", "interleaved", "neox"])
def test_flash_attn_with_kvcache_appends_rotates_and_attends(page_size, rotary):
    """A decode step of 3 new tokens per sequence, GQA 8/2: the cache is updated in place (new rows
    rotated, nothing else touched) and out/lse match the reference on the updated cache. Causal
    except with GPT-NeoX rotary, where every query sits at the first new key's position."""
    torch.manual_seed(30 + page_size + {None: 0, True: 1, False: 2}[rotary])
    batch, heads, heads_kv, d, capacity, new = 3, 8, 2, 128, 512, 3
    causal = rotary is not False
    lens = torch.tensor([0, 130, capacity - new], dtype=torch.int32, device=DEVICE)
    k_cache, v_cache = randn(batch, capacity, heads_kv, d, grad=False), randn(batch, capacity, heads_kv, d, grad=False)
    q = randn(batch, new, heads, d, grad=False)
    k_new, v_new = randn(batch, new, heads_kv, d, grad=False), randn(batch, new, heads_kv, d, grad=False)
    positions = lens[:, None].long() + torch.arange(new, device=DEVICE)  # of the new keys, (batch, new)
    cos = sin = None
    k_want, q_want = k_new, q
    if rotary is not None:
        angle = torch.rand(capacity, 32, device=DEVICE) * 2 * math.pi  # rotary_dim 64 of 128
        cos, sin = angle.cos().to(BF16), angle.sin().to(BF16)
        k_want = rotate(k_new, cos, sin, positions, rotary)
        q_want = rotate(q, cos, sin, positions if causal else positions[:, :1].expand(-1, new), rotary)
    appended = torch.zeros(batch, capacity, dtype=torch.bool, device=DEVICE)
    for b in range(batch):
        appended[b, positions[b]] = True
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k[appended], want_v[appended] = k_want.flatten(0, 1), v_new.flatten(0, 1)

    table = None
    k_arg, v_arg = k_cache.clone(), v_cache.clone()
    if page_size:
        (k_arg, v_arg), table = to_pages((k_cache, v_cache), page_size)
    out, lse = run_or_skip(hopattn.flash_attn_with_kvcache, q, k_arg, v_arg, k_new, v_new, rotary_cos=cos,
                           rotary_sin=sin, cache_seqlens=lens, page_table=table, causal=causal,
                           rotary_interleaved=bool(rotary), return_softmax_lse=True)  # fmt: skip
    assert out.shape == q.shape and lse.shape == (batch, heads, new)

    got_k, got_v = (from_pages(k_arg, table), from_pages(v_arg, table)) if page_size else (k_arg, v_arg)
    assert torch.equal(got_v, want_v)
    assert torch.equal(got_k[~appended], k_cache[~appended])  # nothing but the new rows is written
    # The rotation is rounded once from fp32; whether it fuses a multiply-add may move the last bit.
    torch.testing.assert_close(got_k[appended], want_k[appended], rtol=2**-7, atol=1e-5)

    for b in range(batch):
        keys = int(lens[b]) + new
        args = (q_want[b : b + 1], want_k[b : b + 1, :keys], want_v[b : b + 1, :keys], causal)
        exact_out, exact_lse = attention_reference(*args, upcast=True)
        naive_out, naive_lse = attention_reference(*args, upcast=False)
        check(f"out[{b}]", out[b : b + 1], exact_out, naive_out, BF16)
        check(f"lse[{b}]", lse[b : b + 1], exact_lse, naive_lse, torch.float32)


@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("gap_rows", [0, 16], ids=["consecutive_pages", "pages_apart"])
def test_chunked_prefill_on_a_paged_cache(page_size, gap_rows):
    """Varlen query chunks against keys already in a paged cache, through attention_varlen(...,
    page_table=) and through flash_attn_with_kvcache with cu_seqlens_q (nothing appended). Pages
    of 16 and 64 keys take the key-group-major kernel where they follow one another, the other
    loads where they do not (fwd_page_rows_tma.hpp)."""
    torch.manual_seed(40 + page_size + gap_rows)
    heads, heads_kv, d, capacity = 8, 2, 128, 768
    lens_q, lens_k = [37, 1, 200], [300, 1, 700]  # each chunk is the last lens_q keys of its sequence
    k_cache, v_cache = randn(3, capacity, heads_kv, d, grad=False), randn(3, capacity, heads_kv, d, grad=False)
    (k_pages, v_pages), table = to_pages((k_cache, v_cache), page_size, gap_rows)
    q = randn(sum(lens_q), heads, d, grad=False)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    used_k = torch.tensor(lens_k, dtype=torch.int32, device=DEVICE)
    out, lse = run_or_skip(hopattn.attention_varlen, q, k_pages, v_pages, cu_q, None, max(lens_q), 0,
                           seqused_k=used_k, page_table=table, causal=True, return_lse=True)  # fmt: skip
    out_kv, lse_kv = hopattn.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=used_k, page_table=table,
                                                     cu_seqlens_q=cu_q, max_seqlen_q=max(lens_q), causal=True,
                                                     return_softmax_lse=True)  # fmt: skip
    assert out.shape == q.shape and lse.shape == (heads, q.shape[0])
    for b, (start, lq, lk) in enumerate(zip(cu_q.tolist(), lens_q, lens_k)):
        args = (q[None, start : start + lq], k_cache[b : b + 1, :lk], v_cache[b : b + 1, :lk], True)
        exact_out, exact_lse = attention_reference(*args, upcast=True)
        naive_out, naive_lse = attention_reference(*args, upcast=False)
        for name, o, l in (("attention_varlen", out, lse), ("flash_attn_with_kvcache", out_kv, lse_kv)):
            check(f"{name} out[{b}]", o[None, start : start + lq], exact_out, naive_out, BF16)
            check(f"{name} lse[{b}]", l[None, :, start : start + lq], exact_lse, naive_lse, torch.float32)


# --- determinism, compile, CUDA graphs, streams --------------------------------------------------


def test_deterministic_backward_is_bitwise_repeatable():
    torch.manual_seed(5)
    q, k, v = randn(2, 256, 8, 128), randn(2, 256, 2, 128), randn(2, 256, 2, 128)
    dout = torch.randn(2, 256, 8, 128, dtype=BF16, device=DEVICE)
    runs = []
    for _ in range(3):
        out = hopattn.attention(q, k, v, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), dout))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(6)
    q, k, v = randn(2, 128, 8, 128), randn(2, 128, 2, 128), randn(2, 128, 2, 128)

    def f(q, k, v):
        out, lse = hopattn.attention(q, k, v, causal=True, return_lse=True)
        return out * 2, lse

    compiled = torch.compile(f, fullgraph=True)
    out_c, lse_c = compiled(q, k, v)
    grads_c = torch.autograd.grad(out_c.float().square().sum(), (q, k, v))
    out_e, lse_e = f(q, k, v)
    grads_e = torch.autograd.grad(out_e.float().square().sum(), (q, k, v))
    assert torch.equal(out_c, out_e) and torch.equal(lse_c, lse_e)
    for a, b in zip(grads_c, grads_e):
        torch.testing.assert_close(a, b)


def test_compile_fullgraph_varlen():
    torch._dynamo.reset()
    torch.manual_seed(7)
    lens = [0, 50, 128, 7]
    q, k, v = randn(sum(lens), 4, 128), randn(sum(lens), 4, 128), randn(sum(lens), 4, 128)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)

    def f(q, k, v, cu, max_seqlen: int):
        return hopattn.flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True)

    out_c = torch.compile(f, fullgraph=True)(q, k, v, cu, max(lens))
    out_e = f(q, k, v, cu, max(lens))
    assert torch.equal(out_c, out_e)
    out_c.sum().backward()
    assert q.grad is not None


def test_cuda_graph_capture_and_replay():
    torch.manual_seed(8)
    static_q, static_k, static_v = randn(2, 128, 8, 128), randn(2, 128, 2, 128), randn(2, 128, 2, 128)
    static_dout = torch.randn(2, 128, 8, 128, dtype=BF16, device=DEVICE)

    def step():
        # Deterministic: by default dQ (and GQA's dK/dV) add in whatever order the blocks finish,
        # so a replay and an eager call may differ in the last bits (docs/semantics.md).
        out = hopattn.attention(static_q, static_k, static_v, causal=True, deterministic=True)
        return (out, *torch.autograd.grad(out, (static_q, static_k, static_v), static_dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm up outside the capture
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_results = step()

    for seed in (9, 10):
        torch.manual_seed(seed)
        with torch.no_grad():
            for t in (static_q, static_k, static_v, static_dout):
                t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        expected = step()
        for got, want in zip(static_results, expected):
            assert torch.equal(got, want)


def test_runs_on_the_current_stream():
    torch.manual_seed(11)
    q, k, v = randn(2, 512, 8, 128, grad=False), randn(2, 512, 8, 128, grad=False), randn(2, 512, 8, 128, grad=False)
    expected = hopattn.attention(q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keeps the side stream busy: results need stream order
        got = hopattn.attention(q, k, v)
    side.synchronize()
    assert torch.equal(got, expected)


@pytest.mark.skipif("torch.cuda.device_count() < 2")
def test_tensors_on_another_device_than_the_current_one():
    torch.manual_seed(12)
    with torch.cuda.device(0):
        q = torch.randn(1, 64, 2, 128, dtype=BF16, device="cuda:1")
        out = hopattn.attention(q, q, q)
        assert out.device == q.device and torch.cuda.current_device() == 0
    with torch.cuda.device(1):
        assert torch.equal(out, hopattn.attention(q, q, q))


def test_custom_ops_pass_opcheck():
    q, k = randn(2, 64, 4, 128, grad=True), randn(2, 64, 2, 128, grad=True)
    torch.library.opcheck(torch.ops.hopattn.forward.default, (q, k, k, 0.0, True, -1, -1, False, 0, -1))
    sink = torch.randn(4, device=DEVICE, requires_grad=True)
    torch.library.opcheck(torch.ops.hopattn.forward.default, (q, k, k, 0.0, True, -1, -1, False, 0, -1, sink))
    torch.library.opcheck(torch.ops.hopattn.forward.default, (q, k, k, 1.0, True, -1, -1, False, 0, -1, None, 30.0))
    # The KV-cache operator writes only the caches it declares (each run appends at the same rows).
    q, cache, new = randn(2, 1, 4, 128, grad=False), randn(2, 256, 2, 128, grad=False), randn(2, 1, 2, 128, grad=False)
    lens = torch.tensor([3, 200], dtype=torch.int32, device=DEVICE)
    args = (q, cache, cache.clone(), new, new, None, None, lens, None, None, None, None, None, 0, None, 0.0, True,
            -1, -1, True, 0, -1)  # fmt: skip
    torch.library.opcheck(torch.ops.hopattn.forward_kvcache.default, args)


# --- errors with CUDA tensors --------------------------------------------------------------------


def test_errors_with_cuda_tensors():
    q = randn(2, 64, 4, 128, grad=False)
    with pytest.raises(ValueError, match="k is on cpu but q is on cuda"):
        hopattn.attention(q, q.cpu(), q)
    with pytest.raises(TypeError, match="must be torch.float16 or torch.bfloat16"):
        hopattn.attention(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match=r"heads \(4\) must be a multiple of heads_kv \(3\)"):
        hopattn.attention(q, q[:, :, :3], q[:, :, :3])
    with pytest.raises(ValueError, match="must be a multiple of 8"):
        hopattn.attention(q[..., :100], q[..., :100], q[..., :100])
    with pytest.raises(ValueError, match="causal"):
        hopattn.attention(q, q, q, causal=True, window_size=(-1, 2))
