"""Drop-in for FlashAttention-3's `flash_attn_interface` (the hopper/ package of flash-attention).

Change `from flash_attn_interface import flash_attn_func, flash_attn_varlen_func,
flash_attn_with_kvcache` to `from hopattn import ...` (or
`import hopattn.flash_attn_interface as flash_attn_interface`). Argument names, positions, defaults
and return values are FlashAttention-3's:
- returns `out`, or `(out, softmax_lse)` with return_attn_probs=True (return_softmax_lse=True for
  flash_attn_with_kvcache, where FlashAttention-3 also returns its split buffers: hopattn returns
  the pair only); softmax_lse is float32 (batch, heads, seqlen_q), or (heads, total_q) for varlen
  queries;
- window_size=(left, right), -1 unbounded; query i sees key j iff
  i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right; causal=True sets
  right = 0 (as FlashAttention-3 does, so causal with a right window is not an error here);
- softmax_scale=None is 1/sqrt(head_dim); GQA/MQA by head counts; deterministic backward;
- v (and out, and the KV cache's v_cache and new v) may have a head dim of its own, head_dim_v
  (v.shape[-1], DeepSeek's 128 next to a head_dim of 192), a multiple of 8 in [8, 256];
- softcap > 0 caps the scores at softcap * tanh(softmax_scale * q.k / softcap) (Gemma 2), forward
  and backward; 0 is off; a negative or non-finite softcap raises ValueError;
- FP8: q, k, v of torch.float8_e4m3fn with optional q_descale/k_descale/v_descale, float32
  (batch, heads_kv), give a bfloat16 out (flash_attn_func, flash_attn_varlen_func; forward only).
Not supported (NotImplementedError, a RuntimeError): qv, FP8 in flash_attn_with_kvcache (its
q/k/v_descale), attention_chunk != 0, scheduler_metadata (flash_attn_with_kvcache: only None).
num_splits (1: no split, 0: chosen, n: up to n key splits; they need no workspace from the caller)
and pack_gqa (None: chosen) are honoured; sm_margin is accepted and ignored. Inputs (not the KV cache, which is updated in place) whose last
dimension is not contiguous are copied first, as FlashAttention-3 does.
FlashAttention-3's flash_attn_varlen_func takes no page table; hopattn.attention_varlen(...,
page_table=) runs the varlen forward on a paged cache (chunked prefill), as flash_attn_with_kvcache
with cu_seqlens_q does. Likewise FlashAttention-3 has no attention sinks, so these functions take
none: hopattn.attention, attention_varlen and attention_with_kvcache take them as learnable_sink=
(FlashAttention-4's name for them), differentiable except in attention_with_kvcache.
"""

from . import _torch
from ._capi import NotSupportedError

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]


def _maybe_contiguous(x):
    return x.contiguous() if x is not None and hasattr(x, "stride") and x.stride(-1) != 1 else x


def _reject_unsupported(qv, attention_chunk):
    if qv is not None:
        raise NotSupportedError("hopattn: qv is not supported")
    if attention_chunk:
        raise NotSupportedError(f"hopattn: attention_chunk={attention_chunk} is not supported (only 0)")


def _window(causal, window_size):
    left, right = _torch._window(window_size)
    return (left, 0) if causal else (left, right)


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """FlashAttention-3's flash_attn_func on hopattn. q: (batch, seqlen_q, heads, head_dim),
    k: (batch, seqlen_k, heads_kv, head_dim), v: (batch, seqlen_k, heads_kv, head_dim_v). Returns
    out (batch, seqlen_q, heads, head_dim_v), or (out, softmax_lse) with return_attn_probs=True,
    softmax_lse float32 (batch, heads, seqlen_q). FP8 (float8_e4m3fn) q, k, v take the descales
    and give a bfloat16 out. See hopattn.attention for the mask, FP8 and the errors."""
    _reject_unsupported(qv, attention_chunk)
    q, k, v = _maybe_contiguous(q), _maybe_contiguous(k), _maybe_contiguous(v)
    return _torch.attention(
        q,
        k,
        v,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=_window(causal, window_size),
        deterministic=deterministic,
        return_lse=return_attn_probs,
        num_splits=num_splits,
        pack_gqa=pack_gqa,
        softcap=softcap,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
    )


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """FlashAttention-3's flash_attn_varlen_func on hopattn. q: (total_q, heads, head_dim),
    k: (total_k, heads_kv, head_dim), v: (total_k, heads_kv, head_dim_v), cu_seqlens_* int32
    (batch + 1,), max_seqlen_* Python ints. Returns out (total_q, heads, head_dim_v), or
    (out, softmax_lse) with return_attn_probs=True, softmax_lse float32 (heads, total_q); FP8 as in
    flash_attn_func. See hopattn.attention_varlen."""
    _reject_unsupported(qv, attention_chunk)
    q, k, v = _maybe_contiguous(q), _maybe_contiguous(k), _maybe_contiguous(v)
    return _torch.attention_varlen(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        seqused_q=seqused_q,
        seqused_k=seqused_k,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=_window(causal, window_size),
        deterministic=deterministic,
        return_lse=return_attn_probs,
        num_splits=num_splits,
        pack_gqa=pack_gqa,
        softcap=softcap,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
    )


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
):
    """FlashAttention-3's flash_attn_with_kvcache on hopattn: k and v (if given) are written into
    k_cache/v_cache in place at cache_seqlens (an int, an int32 (batch,) tensor, or None for full
    caches), rotated with rotary_cos/rotary_sin if given, then q attends to the cache. Returns out,
    or (out, softmax_lse) with return_softmax_lse=True. No backward. See
    hopattn.attention_with_kvcache."""
    _reject_unsupported(qv, attention_chunk)
    if scheduler_metadata is not None:
        raise NotSupportedError("hopattn: scheduler_metadata is not supported (only None); hopattn plans the "
                                "split schedule itself")
    q, k, v = _maybe_contiguous(q), _maybe_contiguous(k), _maybe_contiguous(v)
    rotary_cos, rotary_sin = _maybe_contiguous(rotary_cos), _maybe_contiguous(rotary_sin)
    return _torch.attention_with_kvcache(
        q,
        k_cache,
        v_cache,
        k,
        v,
        rotary_cos=rotary_cos,
        rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens,
        cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad,
        page_table=page_table,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k_new=cu_seqlens_k_new,
        max_seqlen_q=max_seqlen_q,
        rotary_seqlens=rotary_seqlens,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=_window(causal, window_size),
        rotary_interleaved=rotary_interleaved,
        num_splits=num_splits,
        pack_gqa=pack_gqa,
        return_lse=return_softmax_lse,
        softcap=softcap,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
    )
