"""The PyTorch layer without a GPU: error paths (one per kind of bad input), shapes through the
fake/meta implementations, autograd wiring, torch.compile(fullgraph=True) tracing, and the
FlashAttention-3 compatible wrappers. Needs PyTorch (skips without it), no GPU."""

import pytest

import hopattn
from conftest import torch_or_skip

torch = torch_or_skip()
from hopattn import _torch as hop_torch  # noqa: E402  (needs torch)

BF16 = torch.bfloat16


def meta(*shape, dtype=BF16, grad=False):
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=grad)


# --- one error-path test per kind of bad input ---------------------------------------------------


def test_cpu_tensors_are_rejected_with_the_reason():
    q = torch.randn(1, 16, 2, 64, dtype=BF16)
    with pytest.raises(ValueError, match="runs on CUDA tensors") as info:
        hopattn.attention(q, q, q)
    assert isinstance(info.value, hopattn.InvalidArgumentError)
    if not torch.cuda.is_available():
        assert "needs an NVIDIA Hopper GPU" in str(info.value)


def test_wrong_dtype_is_a_type_error():
    q = meta(1, 16, 2, 64, dtype=torch.float32)
    with pytest.raises(TypeError, match="must be torch.float16 or torch.bfloat16"):
        hopattn.attention(q, q, q)


def test_mismatched_dtypes_are_a_type_error():
    q = meta(1, 16, 2, 64)
    with pytest.raises(TypeError, match=r"k.dtype is torch.float16 but must be torch.bfloat16"):
        hopattn.attention(q, q.to(torch.float16), q)


def test_non_tensors_are_a_type_error():
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        hopattn.attention([1.0], meta(1, 16, 2, 64), meta(1, 16, 2, 64))


def test_mismatched_devices_are_rejected():
    q = meta(1, 16, 2, 64)
    with pytest.raises(ValueError, match="v is on cpu but q is on meta"):
        hopattn.attention(q, q, torch.empty(1, 16, 2, 64, dtype=BF16))


def test_varlen_index_arrays_must_be_int32_and_max_seqlen_ints():
    q = meta(10, 2, 64)
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    with pytest.raises(TypeError, match="cu_seqlens_k.dtype is torch.int64 but must be torch.int32"):
        hopattn.attention_varlen(q, q, q, cu, cu.long(), 8, 8)
    with pytest.raises(TypeError, match="max_seqlen_q must be a Python int"):
        hopattn.attention_varlen(q, q, q, cu, cu, torch.tensor(8), 8)
    with pytest.raises(TypeError, match="needs cu_seqlens_q and cu_seqlens_k"):
        hopattn.attention_varlen(q, q, q, None, None, 8, 8)
    with pytest.raises(ValueError, match="seqused_q has shape"):
        hopattn.attention_varlen(q, q, q, cu, cu, 8, 8, seqused_q=cu.view(1, 3))


def test_wrong_ranks_are_rejected_before_the_library():
    with pytest.raises(ValueError, match="q has 5 dimensions but must have 4"):
        hopattn.attention(meta(1, 16, 3, 2, 64), meta(1, 16, 2, 64), meta(1, 16, 2, 64))
    with pytest.raises(ValueError, match=r"q.rank is 3 but must be 4: \(batch, seqlen, heads, head_dim\)"):
        hopattn.attention(meta(16, 2, 64), meta(16, 2, 64), meta(16, 2, 64))  # meta: the fake implementation
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match=r"k.rank is 4 but must be 3"):
        hopattn.attention_varlen(meta(16, 2, 64), meta(1, 16, 2, 64), meta(1, 16, 2, 64), cu, cu, 8, 8)


def test_window_size_must_be_a_pair():
    q = meta(1, 16, 2, 64)
    with pytest.raises(TypeError, match="window_size must be a pair"):
        hopattn.attention(q, q, q, window_size=5)


def test_flash_attn_features_hopattn_lacks_are_not_implemented():
    q = meta(1, 16, 2, 64)
    with pytest.raises(RuntimeError, match="attention_chunk"):
        hopattn.flash_attn_varlen_func(q[0], q[0], q[0], None, None, 16, 16, attention_chunk=4)


# --- the library's messages through the torch layer (no GPU: CPU memory stands in) ---------------


@pytest.fixture
def cpu_memory_as_device(monkeypatch, lib):
    """Lets CPU tensors through the Python checks so that the library validates real torch
    tensors (shapes, strides, pointers). Only on machines without CUDA: a valid problem then stops
    at the device check and nothing can be launched on host memory."""
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA (on a GPU the GPU tests cover this with CUDA tensors)")

    def check_tensors(q, others, ranks):
        for t in (q, *(t for _, t in others)):
            if t.dtype not in hop_torch._DTYPE_CODES:
                raise TypeError(t.dtype)

    class NoDevice:
        def __init__(self, device):
            pass

        def __enter__(self):
            return 0

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(hop_torch, "_check_tensors", check_tensors)
    monkeypatch.setattr(hop_torch, "_check_index_array", lambda name, t, device, dims=1: None)
    monkeypatch.setattr(hop_torch, "_OnDevice", NoDevice)


def test_bad_shapes_raise_the_library_message(cpu_memory_as_device):
    q = torch.randn(2, 32, 4, 64, dtype=BF16)
    k = torch.randn(2, 32, 3, 64, dtype=BF16)
    with pytest.raises(ValueError, match=r"heads \(4\) must be a multiple of heads_kv \(3\)"):
        hopattn.attention(q, k, k)
    q12 = torch.randn(2, 32, 4, 12, dtype=BF16)
    with pytest.raises(ValueError, match=r"head_dim \(q.shape\[3\]\) is 12 but must be a multiple of 8"):
        hopattn.attention(q12, q12, q12)
    with pytest.raises(ValueError, match="causal"):
        hopattn.attention(q, q, q, causal=True, window_size=(-1, 3))


def test_a_valid_call_explains_why_it_cannot_run(cpu_memory_as_device):
    q = torch.randn(2, 32, 4, 64, dtype=BF16)
    with pytest.raises(RuntimeError, match="no usable CUDA device") as info:
        hopattn.attention(q, q, q, causal=True)
    assert isinstance(info.value, hopattn.DeviceUnavailableError)
    assert "Hopper" in str(info.value)


def test_strided_views_reach_the_library_as_views(cpu_memory_as_device):
    """q, k, v sliced out of a packed (batch, seqlen, 3, heads, d) tensor are accepted as they are
    (they pass validation and stop at the device check); a non-contiguous last dim is refused."""
    qkv = torch.randn(2, 32, 3, 4, 64, dtype=BF16)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.attention(q, k, v)
    bad = torch.randn(2, 32, 4, 128, dtype=BF16)[..., ::2]
    with pytest.raises(ValueError, match=r"q.stride\[3\] is 2 but the last dimension must be contiguous"):
        hopattn.attention(bad, k, v)
    # flash_attn_func copies such inputs first, as FlashAttention-3 does.
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.flash_attn_func(bad, k, v)


def test_varlen_reaches_the_library(cpu_memory_as_device):
    q = torch.randn(100, 4, 64, dtype=BF16)
    k = torch.randn(90, 2, 64, dtype=BF16)
    cu_q = torch.tensor([0, 40, 40, 100], dtype=torch.int32)
    cu_k = torch.tensor([0, 30, 50, 90], dtype=torch.int32)
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.attention_varlen(q, k, k, cu_q, cu_k, 60, 40, causal=True)
    with pytest.raises(ValueError, match="varlen.seqused_k.size is 2 but must be 3"):
        hopattn.attention_varlen(q, k, k, cu_q, cu_k, 60, 40, seqused_k=torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="max_seqlen_q"):
        hopattn.attention_varlen(q, k, k, cu_q, cu_k, -1, 40)


# --- shapes (fake/meta implementations), autograd, torch.compile ---------------------------------


@pytest.mark.parametrize("heads_kv", [8, 2, 1])
def test_meta_shapes_and_gradients(heads_kv):
    q, k, v = meta(2, 100, 8, 64, grad=True), meta(2, 130, heads_kv, 64, grad=True), meta(2, 130, heads_kv, 64, grad=True)
    out, lse = hopattn.attention(q, k, v, causal=True, window_size=(32, -1), return_lse=True)
    assert out.shape == (2, 100, 8, 64) and out.dtype == BF16
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32  # (batch, heads, seqlen_q)
    assert not lse.requires_grad
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_meta_varlen_shapes():
    q, k = meta(300, 8, 128, grad=True), meta(280, 2, 128, grad=True)
    cu = torch.empty(4, dtype=torch.int32, device="meta")
    out, lse = hopattn.attention_varlen(q, k, k, cu, cu, 128, 100, return_lse=True)
    assert out.shape == (300, 8, 128)
    assert lse.shape == (8, 300)  # (heads, total_q)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_flash_attn_return_conventions():
    q = meta(2, 64, 4, 64)
    assert isinstance(hopattn.flash_attn_func(q, q, q), torch.Tensor)
    out, lse = hopattn.flash_attn_func(q, q, q, causal=True, window_size=(8, 8), return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 64)
    qv = meta(100, 4, 64)
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    out, lse = hopattn.flash_attn_varlen_func(qv, qv, qv, cu, cu, 64, 64, return_attn_probs=True)
    assert out.shape == (100, 4, 64) and lse.shape == (4, 100)
    from hopattn import flash_attn_interface

    assert flash_attn_interface.flash_attn_func is hopattn.flash_attn_func


def test_flash_attn_signatures_match_flash_attention_3():
    import inspect

    fixed = list(inspect.signature(hopattn.flash_attn_func).parameters)
    assert fixed == ["q", "k", "v", "softmax_scale", "causal", "qv", "q_descale", "k_descale", "v_descale",
                     "window_size", "attention_chunk", "softcap", "num_splits", "pack_gqa", "deterministic",
                     "sm_margin", "return_attn_probs"]
    varlen = list(inspect.signature(hopattn.flash_attn_varlen_func).parameters)
    assert varlen[:9] == ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
                          "seqused_q", "seqused_k"]
    assert varlen[9:] == fixed[3:]
    kvcache = list(inspect.signature(hopattn.flash_attn_with_kvcache).parameters)
    assert kvcache == ["q", "k_cache", "v_cache", "k", "v", "qv", "rotary_cos", "rotary_sin", "cache_seqlens",
                       "cache_batch_idx", "cache_leftpad", "page_table", "cu_seqlens_q", "cu_seqlens_k_new",
                       "max_seqlen_q", "rotary_seqlens", "q_descale", "k_descale", "v_descale", "softmax_scale",
                       "causal", "window_size", "attention_chunk", "softcap", "rotary_interleaved",
                       "scheduler_metadata", "num_splits", "pack_gqa", "sm_margin", "return_softmax_lse"]
    defaults = {name: p.default for name, p in inspect.signature(hopattn.flash_attn_with_kvcache).parameters.items()}
    assert defaults["num_splits"] == 0 and defaults["rotary_interleaved"] is True and defaults["causal"] is False


def test_eager_calls_skip_the_dispatcher_and_tracing_uses_the_ops():
    plain = torch.empty(1, 16, 2, 64, dtype=BF16)
    assert not hop_torch._use_ops(plain, plain, plain)
    assert hop_torch._use_ops(meta(1, 16, 2, 64), None, None)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passthrough():  # a dispatch mode (FlopCounterMode, make_fx, ...) must see the operators
        assert hop_torch._use_ops(plain, plain, plain)
    for name in ("forward", "forward_varlen", "backward", "backward_varlen", "forward_kvcache"):
        assert hasattr(torch.ops.hopattn, name)


def test_compile_fullgraph_traces_without_graph_breaks():
    """torch.compile(fullgraph=True) through forward and backward, fixed-length and varlen (max
    seqlens as Python ints). On meta tensors with the aot_eager backend, so it runs without a GPU;
    the GPU suite runs the same with inductor on real tensors."""
    torch._dynamo.reset()

    def fixed(q, k, v):
        out, lse = hopattn.attention(q, k, v, causal=True, return_lse=True)
        return out.float().sum() + lse.sum()

    q, k, v = meta(2, 64, 8, 64, grad=True), meta(2, 64, 2, 64, grad=True), meta(2, 64, 2, 64, grad=True)
    torch.compile(fixed, fullgraph=True, backend="aot_eager")(q, k, v).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape

    def varlen(q, k, v, cu_q, cu_k, max_q: int, max_k: int):
        return hopattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True).sum()

    q, k = meta(300, 8, 64, grad=True), meta(280, 2, 64, grad=True)
    cu = torch.empty(4, dtype=torch.int32, device="meta")
    torch.compile(varlen, fullgraph=True, backend="aot_eager")(q, k, k, cu, cu, 128, 100).backward()
    assert q.grad.shape == q.shape


def test_custom_ops_pass_torch_library_opcheck_on_fake_tensors():
    """torch.library.opcheck's schema and fake-tensor checks on meta inputs (the real kernel needs a
    GPU; test_gpu.py runs opcheck in full there)."""
    q, k = meta(2, 64, 4, 64), meta(2, 64, 2, 64)
    args = (q, k, k, 0.0, True, -1, -1, False, 0, -1)
    torch.library.opcheck(torch.ops.hopattn.forward.default, args,
                          test_utils=("test_schema", "test_faketensor"))


# --- FP8 inputs (float8_e4m3fn q, k, v with descales; forward only) ------------------------------

FP8 = torch.float8_e4m3fn


def descale(batch, heads_kv, device="meta"):
    return torch.empty(batch, heads_kv, dtype=torch.float32, device=device)


def test_fp8_out_is_bfloat16_or_the_out_dtype_asked_for():
    q, k = meta(2, 64, 8, 128, dtype=FP8), meta(2, 96, 2, 128, dtype=FP8)
    out, lse = hopattn.attention(q, k, k, causal=True, q_descale=descale(2, 2), k_descale=descale(2, 2),
                                 v_descale=descale(2, 2), return_lse=True)  # fmt: skip
    assert out.shape == (2, 64, 8, 128) and out.dtype == BF16
    assert lse.shape == (2, 8, 64) and lse.dtype == torch.float32
    assert hopattn.attention(q, k, k, out_dtype=torch.float16).dtype == torch.float16
    cu = torch.empty(4, dtype=torch.int32, device="meta")
    qv, kv = meta(300, 8, 128, dtype=FP8), meta(280, 2, 128, dtype=FP8)
    out = hopattn.attention_varlen(qv, kv, kv, cu, cu, 128, 100, k_descale=descale(3, 2))
    assert out.shape == (300, 8, 128) and out.dtype == BF16
    # FlashAttention-3's drop-in: its descales pass through, out is bfloat16.
    out = hopattn.flash_attn_func(q, k, k, q_descale=descale(2, 2), k_descale=descale(2, 2), v_descale=descale(2, 2))
    assert out.dtype == BF16
    out = hopattn.flash_attn_varlen_func(qv, kv, kv, cu, cu, 128, 100, v_descale=descale(3, 2))
    assert out.dtype == BF16


def test_fp8_argument_errors_before_the_library():
    q, x = meta(2, 64, 4, 128, dtype=FP8), meta(2, 64, 4, 128)
    with pytest.raises(TypeError, match="out_dtype is torch.float8_e4m3fn but must be torch.bfloat16 or "
                                        "torch.float16: float8_e4m3fn inputs give a 16-bit out"):  # fmt: skip
        hopattn.attention(q, q, q, out_dtype=FP8)
    with pytest.raises(TypeError, match="out_dtype is torch.float16 but q.dtype is torch.bfloat16"):
        hopattn.attention(x, x, x, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="q_descale is given but q.dtype is torch.bfloat16: descale factors belong "
                                         "to torch.float8_e4m3fn inputs only"):  # fmt: skip
        hopattn.attention(x, x, x, q_descale=descale(2, 4))
    with pytest.raises(TypeError, match="k_descale.dtype is torch.float16 but must be torch.float32"):
        hopattn.attention(q, q, q, k_descale=descale(2, 4).half())
    with pytest.raises(ValueError, match="v_descale is on cpu but q is on meta"):
        hopattn.attention(q, q, q, v_descale=descale(2, 4, device="cpu"))
    with pytest.raises(ValueError, match=r"q_descale has shape \(8,\) but must be \(batch, heads_kv\)"):
        hopattn.attention(q, q, q, q_descale=torch.empty(8, device="meta"))
    with pytest.raises(TypeError, match="k.dtype is torch.bfloat16 but must be torch.float8_e4m3fn"):
        hopattn.attention(q, x, q)
    with pytest.raises(ValueError, match="k_descale is given but q.dtype is torch.bfloat16"):
        hopattn.flash_attn_with_kvcache(x, x, x, cache_seqlens=3, k_descale=descale(2, 4))


def test_fp8_backward_raises_a_clear_error():
    q, k = meta(2, 64, 4, 128, dtype=FP8, grad=True), meta(2, 64, 4, 128, dtype=FP8, grad=True)
    out = hopattn.attention(q, k, k)  # the forward runs
    with pytest.raises(NotImplementedError, match="float8_e4m3fn inputs has a forward only"):
        out.float().sum().backward()
    with pytest.raises(NotImplementedError, match="has a forward only"):
        hop_torch.backward_impl(meta(2, 64, 4, 128), q, k, k, out, meta(2, 4, 64, dtype=torch.float32), None, None,
                                None, None, 0, 0, 0.0, False, -1, -1, False)  # fmt: skip


def test_fp8_compiles_and_passes_opcheck_on_fake_tensors():
    torch._dynamo.reset()
    q, k = meta(2, 64, 8, 64, dtype=FP8), meta(2, 64, 2, 64, dtype=FP8)

    def forward(q, k, v, scale):
        return hopattn.attention(q, k, v, causal=True, q_descale=scale, k_descale=scale, v_descale=scale,
                                 out_dtype=torch.float16)  # fmt: skip

    out = torch.compile(forward, fullgraph=True, backend="aot_eager")(q, k, k, descale(2, 2))
    assert out.shape == (2, 64, 8, 64) and out.dtype == torch.float16
    args = (q, k, k, 0.0, True, -1, -1, False, 0, -1, None, 0.0, descale(2, 2), None, descale(2, 2), torch.float16)
    torch.library.opcheck(torch.ops.hopattn.forward.default, args, test_utils=("test_schema", "test_faketensor"))
    # An FP8 KV cache: out is bfloat16.
    cache = meta(2, 256, 2, 64, dtype=FP8)
    args = (q[:, :1], cache, cache, None, None, None, None, ints(2), None, None, None, None, None, 0, None, 0.0, True,
            -1, -1, True, 0, -1, None, 0.0, descale(2, 2), None, descale(2, 2))  # fmt: skip
    out, lse = torch.ops.hopattn.forward_kvcache(*args)
    assert out.shape == (2, 1, 8, 64) and out.dtype == torch.bfloat16
    torch.library.opcheck(torch.ops.hopattn.forward_kvcache.default, args, test_utils=("test_schema", "test_faketensor"))


def test_fp8_reaches_the_library(cpu_memory_as_device):
    q = torch.randn(2, 32, 4, 64).to(FP8)
    k = torch.randn(2, 32, 2, 64).to(FP8)
    scale = torch.rand(2, 2) + 0.5
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.attention(q, k, k, causal=True, q_descale=scale, k_descale=scale, v_descale=scale)
    with pytest.raises(hopattn.DeviceUnavailableError):  # an expanded descale is made contiguous
        hopattn.attention(q, k, k, v_descale=torch.ones(1).expand(2, 2))
    with pytest.raises(ValueError, match=r"k_descale.shape\[1\] is 4 but must be 2"):
        hopattn.attention(q, k, k, k_descale=torch.ones(2, 4))
    q40 = torch.randn(2, 32, 4, 40).to(FP8)
    with pytest.raises(ValueError, match=r"head_dim \(q.shape\[3\]\) is 40 but must be a multiple of 16"):
        hopattn.attention(q40, q40, q40)
    # FP8 KV caches reach the library too, descales and all; what they do not take yet it names.
    seqlens = torch.full((2,), 32, dtype=torch.int32)
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.attention_with_kvcache(q, k, k, cache_seqlens=seqlens, k_descale=scale)
    with pytest.raises(NotImplementedError, match="softcap with a float8_e4m3 cache is not supported yet"):
        hopattn.flash_attn_with_kvcache(q, k, k, cache_seqlens=seqlens, softcap=30.0)


# --- KV cache (attention_with_kvcache, flash_attn_with_kvcache) and paged varlen ------------------


def ints(*shape, device="meta", dtype=torch.int32):
    return torch.empty(*shape, dtype=dtype, device=device)


def test_kvcache_argument_errors_before_the_library():
    q, cache, new = meta(2, 1, 8, 64), meta(2, 256, 2, 64), meta(2, 1, 2, 64)
    with pytest.raises(ValueError, match="k is given but v is None; they come together"):
        hopattn.attention_with_kvcache(q, cache, cache, new, cache_seqlens=3)
    with pytest.raises(ValueError, match="rotary_sin is given but rotary_cos is None"):
        hopattn.attention_with_kvcache(q, cache, cache, new, new, cache_seqlens=3, rotary_sin=meta(64, 16))
    with pytest.raises(ValueError, match="cache_seqlens is None .* but k/v are given"):
        hopattn.attention_with_kvcache(q, cache, cache, new, new)
    with pytest.raises(TypeError, match="cache_seqlens.dtype is torch.int64 but must be torch.int32"):
        hopattn.attention_with_kvcache(q, cache, cache, cache_seqlens=ints(2, dtype=torch.int64))
    with pytest.raises(TypeError, match="cache_batch_idx.dtype is torch.int64"):
        hopattn.attention_with_kvcache(q, cache, cache, cache_seqlens=3, cache_batch_idx=ints(2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"page_table has shape \(32,\) but must be 2-D"):
        hopattn.attention_with_kvcache(q, cache, cache, cache_seqlens=3, page_table=ints(32))
    with pytest.raises(TypeError, match="rotary_cos.dtype is torch.float32 but must be torch.bfloat16"):
        table = meta(64, 16, dtype=torch.float32)
        hopattn.attention_with_kvcache(q, cache, cache, new, new, cache_seqlens=3, rotary_cos=table, rotary_sin=table)
    with pytest.raises(TypeError, match="max_seqlen_q must be a Python int"):
        hopattn.attention_with_kvcache(meta(5, 8, 64), cache, cache, cache_seqlens=3, cu_seqlens_q=ints(3))
    with pytest.raises(ValueError, match="v_cache is on cpu but q is on meta"):
        hopattn.attention_with_kvcache(q, cache, torch.empty(2, 256, 2, 64, dtype=BF16), cache_seqlens=3)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        cpu = torch.empty(2, 1, 8, 64, dtype=BF16)
        hopattn.attention_with_kvcache(cpu, cpu, cpu, cache_seqlens=torch.zeros(2, dtype=torch.int32))


def test_kvcache_features_hopattn_lacks_are_not_implemented():
    q, cache = meta(2, 1, 8, 64), meta(2, 256, 2, 64)
    for option in (dict(qv=q), dict(attention_chunk=128), dict(scheduler_metadata=ints(8))):
        with pytest.raises(NotImplementedError):
            hopattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=3, **option)


def test_kvcache_meta_shapes():
    q, cache, new = meta(3, 2, 8, 64), meta(3, 256, 2, 64), meta(3, 2, 2, 64)
    out, lse = hopattn.attention_with_kvcache(q, cache, cache, new, new, cache_seqlens=7, causal=True,
                                              rotary_cos=meta(512, 16), rotary_sin=meta(512, 16), return_lse=True)
    assert out.shape == q.shape and lse.shape == (3, 8, 2) and lse.dtype == torch.float32
    assert hopattn.attention_with_kvcache(q, cache, cache).shape == q.shape  # full caches
    pages, table = meta(40, 16, 2, 64), ints(3, 16)
    qv = meta(11, 8, 64)
    out, lse = hopattn.flash_attn_with_kvcache(qv, pages, pages, cache_seqlens=ints(3), page_table=table,
                                               cu_seqlens_q=ints(4), max_seqlen_q=6, return_softmax_lse=True)
    assert out.shape == qv.shape and lse.shape == (8, 11)  # (heads, total_q)
    assert isinstance(hopattn.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=ints(3)), torch.Tensor)
    with pytest.raises(ValueError, match=r"q.rank is 4 but must be 3: \(total_q, heads, head_dim\)"):
        hopattn.attention_with_kvcache(q, cache, cache, cache_seqlens=1, cu_seqlens_q=ints(4), max_seqlen_q=2)


def test_kvcache_op_declares_the_cache_mutation_and_passes_opcheck():
    schema = torch.ops.hopattn.forward_kvcache.default._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == {"k_cache", "v_cache"}
    q, cache, new = meta(2, 1, 8, 64), meta(2, 256, 2, 64), meta(2, 1, 2, 64)
    args = (q, cache, cache, new, new, meta(64, 16), meta(64, 16), ints(2), None, None, None, None, None, 0, None,
            0.0, True, -1, -1, True, 0, -1)  # fmt: skip
    torch.library.opcheck(torch.ops.hopattn.forward_kvcache.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_kvcache_compile_fullgraph():
    torch._dynamo.reset()

    def step(q, k_cache, v_cache, k, v, lens):
        out, lse = hopattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, causal=True,
                                                   return_softmax_lse=True)
        return out.float().sum() + lse.sum()

    q, cache, new = meta(2, 1, 8, 64), meta(2, 256, 2, 64), meta(2, 1, 2, 64)
    torch.compile(step, fullgraph=True, backend="aot_eager")(q, cache, cache.clone(), new, new, ints(2))


def test_paged_varlen_checks_and_shapes():
    q, pages, table, cu = meta(30, 8, 64), meta(40, 16, 2, 64), ints(2, 16), ints(3)
    out, lse = hopattn.attention_varlen(q, pages, pages, cu, None, 20, 0, page_table=table, seqused_k=ints(2),
                                        causal=True, return_lse=True)
    assert out.shape == q.shape and lse.shape == (8, 30)
    with pytest.raises(ValueError, match="cu_seqlens_k must be None with page_table"):
        hopattn.attention_varlen(q, pages, pages, cu, cu, 20, 0, page_table=table)
    with pytest.raises(TypeError, match="needs cu_seqlens_q"):
        hopattn.attention_varlen(q, pages, pages, None, None, 20, 0, page_table=table)
    with pytest.raises(NotImplementedError, match="forward only"):
        hopattn.attention_varlen(meta(30, 8, 64, grad=True), pages, pages, cu, None, 20, 0, page_table=table)
    with pytest.raises(TypeError, match="page_table.dtype is torch.int64"):
        hopattn.attention_varlen(q, pages, pages, cu, None, 20, 0, page_table=ints(2, 16, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"k.rank is 3 but must be 4 with page_table"):
        hopattn.attention_varlen(q, meta(640, 2, 64), meta(640, 2, 64), cu, None, 20, 0, page_table=table)
    # The operator's page_table has a default: callers of the schema from before it are unaffected.
    out, _ = torch.ops.hopattn.forward_varlen(q, q, q, cu, cu, None, None, 20, 20, 0.0, False, -1, -1, False, 0, -1)
    assert out.shape == q.shape


def test_kvcache_reaches_the_library(cpu_memory_as_device):
    q, cache = torch.randn(2, 1, 8, 64, dtype=BF16), torch.zeros(2, 256, 2, 64, dtype=BF16)
    new = torch.randn(2, 3, 2, 64, dtype=BF16)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    with pytest.raises(hopattn.DeviceUnavailableError):  # valid: it stops at the device check
        hopattn.attention_with_kvcache(q, cache, cache, new, new, cache_seqlens=lens, causal=True)
    with pytest.raises(hopattn.DeviceUnavailableError):  # an int for every sequence, and full caches
        hopattn.flash_attn_with_kvcache(q, cache, cache, new, new, cache_seqlens=4)
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.flash_attn_with_kvcache(q, cache, cache)
    cos = torch.randn(512, 16, dtype=BF16)
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.flash_attn_with_kvcache(q, cache, cache, new, new, rotary_cos=cos, rotary_sin=cos, cache_seqlens=lens,
                                        rotary_interleaved=False)
    with pytest.raises(ValueError, match=r"heads \(8\) must be a multiple of heads_kv \(3\)"):
        odd = torch.zeros(2, 256, 3, 64, dtype=BF16)
        hopattn.attention_with_kvcache(q, odd, odd, cache_seqlens=lens)
    with pytest.raises(ValueError, match="rotary.positions is given without rotary.cos/sin"):
        hopattn.attention_with_kvcache(q, cache, cache, new, new, cache_seqlens=lens, rotary_seqlens=lens)
    with pytest.raises(ValueError, match="cache_seqlens.size is 3 but must be 2"):
        hopattn.attention_with_kvcache(q, cache, cache, cache_seqlens=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"rotary_dim \(2 \* rotary.cos.shape\[1\]\) is 24"):
        hopattn.attention_with_kvcache(q, cache, cache, new, new, cache_seqlens=lens, rotary_cos=cos[:, :12],
                                       rotary_sin=cos[:, :12])  # fmt: skip
    with pytest.raises(ValueError, match="page_table.batch \\(rows\\) is 3"):
        pages = torch.zeros(40, 16, 2, 64, dtype=BF16)
        table = torch.zeros(3, 16, dtype=torch.int32)
        hopattn.attention_with_kvcache(q, pages, pages, cache_seqlens=lens, page_table=table)


def test_paged_varlen_reaches_the_library(cpu_memory_as_device):
    q, pages = torch.randn(30, 8, 64, dtype=BF16), torch.zeros(40, 16, 2, 64, dtype=BF16)
    cu = torch.tensor([0, 10, 30], dtype=torch.int32)
    used = torch.tensor([100, 250], dtype=torch.int32)
    table = torch.arange(32, dtype=torch.int32).view(2, 16)
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.attention_varlen(q, pages, pages, cu, None, 20, 0, seqused_k=used, page_table=table, causal=True)
    with pytest.raises(ValueError, match="page_table.batch \\(rows\\) is 1"):
        hopattn.attention_varlen(q, pages, pages, cu, None, 20, 0, page_table=table[:1])


def test_page_tables_reach_the_library_as_rows_it_can_read():
    """Row stride 0 means max_pages to the library, so a broadcast table (every sequence on the same
    pages) is copied, as is one whose columns are strided; a plain or row-sliced table is not."""
    table = torch.arange(64, dtype=torch.int32).view(4, 16)
    assert hop_torch._page_table(table) is table
    assert hop_torch._page_table_fields(table[::2])[1:] == (2, 16, 32)
    broadcast = hop_torch._page_table(table[:1].expand(3, 16))
    assert broadcast.stride() == (16, 1) and torch.equal(broadcast, table[:1].expand(3, 16))
    assert hop_torch._page_table(table.t()).is_contiguous()
    assert hop_torch._page_table_fields(table[:1])[1:] == (1, 16, 0)  # one row: its stride is never used
    assert hop_torch._page_table_fields(None) == (0, 0, 0, 0)


# --- attention sinks (learnable_sink) ---------------------------------------------------------------


def sink(heads, grad=False, dtype=torch.float32, device="meta"):
    return torch.empty(heads, dtype=dtype, device=device, requires_grad=grad)


def test_learnable_sink_argument_errors_before_the_library():
    """Each wrong learnable_sink is named in Python (on meta tensors through the fake
    implementations, so the same as under torch.compile), for every entry point."""
    q, kv, cu = meta(2, 16, 4, 64), meta(2, 16, 2, 64), ints(3)
    calls = {
        "attention": lambda s: hopattn.attention(q, kv, kv, learnable_sink=s),
        "attention_varlen": lambda s: hopattn.attention_varlen(q[0], kv[0], kv[0], cu, cu, 8, 8, learnable_sink=s),
        "attention_with_kvcache": lambda s: hopattn.attention_with_kvcache(q, kv, kv, cache_seqlens=3,
                                                                           learnable_sink=s),
    }
    wrong = [
        (sink(2), ValueError, r"learnable_sink has shape \(2,\) but must be \(heads,\) = \(4,\): one logit per query "
                              "head"),  # one per key/value head is a mistake under GQA
        (sink((1, 4)), ValueError, r"learnable_sink has shape \(1, 4\)"),
        (sink(()), ValueError, r"learnable_sink has shape \(\)"),
        (sink(4, dtype=BF16), TypeError, "learnable_sink.dtype is torch.bfloat16 but must be torch.float32"),
        (sink(4, device="cpu"), ValueError, "learnable_sink is on cpu but q is on meta"),
    ]
    for name, call in calls.items():
        for bad, error, message in wrong:
            with pytest.raises(error, match=message):
                call(bad)
        assert call(sink(4)).shape == (q[0] if name == "attention_varlen" else q).shape


def test_learnable_sink_on_a_cpu_tensor_stops_at_q():
    q = torch.randn(1, 16, 2, 64, dtype=BF16)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):  # before anything looks at the sink
        hopattn.attention(q, q, q, learnable_sink=torch.zeros(2))


@pytest.mark.parametrize("sink_grad", [True, False], ids=["sink_grad", "frozen_sink"])
def test_meta_shapes_and_gradients_with_sinks(sink_grad):
    q, k = meta(2, 100, 8, 64, grad=True), meta(2, 130, 2, 64, grad=True)
    s = sink(8, grad=sink_grad)
    out, lse = hopattn.attention(q, k, k, causal=True, window_size=(32, 0), return_lse=True, learnable_sink=s)
    assert out.shape == q.shape and lse.shape == (2, 8, 100) and not lse.requires_grad
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    assert (s.grad is not None) == sink_grad
    if sink_grad:
        assert s.grad.shape == (8,) and s.grad.dtype == torch.float32
        s.grad = None
    qv, kv, cu = meta(300, 8, 64, grad=True), meta(280, 2, 64, grad=True), ints(4)
    out, lse = hopattn.attention_varlen(qv, kv, kv, cu, cu, 128, 100, return_lse=True, learnable_sink=s)
    assert out.shape == qv.shape and lse.shape == (8, 300)
    out.sum().backward()
    assert (s.grad is not None) == sink_grad and kv.grad.shape == kv.shape


def test_a_sink_that_needs_a_gradient_is_refused_on_pages():
    q, pages, table, cu = meta(30, 8, 64), meta(40, 16, 2, 64), ints(2, 16), ints(3)
    with pytest.raises(NotImplementedError, match="forward only"):
        hopattn.attention_varlen(q, pages, pages, cu, None, 20, 0, page_table=table, learnable_sink=sink(8, grad=True))
    out = hopattn.attention_varlen(q, pages, pages, cu, None, 20, 0, page_table=table, learnable_sink=sink(8))
    assert out.shape == q.shape


def test_backward_ops_return_the_sink_gradient():
    """The backward operators' fourth output: the sink's gradient, or an empty (0,) float32 tensor
    without a sink (operators return tensors, never None)."""
    q, k = meta(2, 64, 4, 64), meta(2, 64, 2, 64)
    lse = meta(2, 4, 64, dtype=torch.float32)
    fixed = (q, q, k, k, q, lse, 0.0, True, -1, -1, False)
    dq, dk, dv, dsink = torch.ops.hopattn.backward(*fixed)  # a caller of the schema from before the sink
    assert dq.shape == q.shape and dk.shape == k.shape and dsink.shape == (0,) and dsink.dtype == torch.float32
    assert torch.ops.hopattn.backward(*fixed, sink(4))[3].shape == (4,)
    qv, kv, lse_v, cu = meta(100, 4, 64), meta(90, 2, 64), meta(4, 100, dtype=torch.float32), ints(3)
    varlen = (qv, qv, kv, kv, qv, lse_v, cu, cu, None, None, 60, 60, 0.0, True, -1, -1, False)
    assert torch.ops.hopattn.backward_varlen(*varlen)[3].shape == (0,)
    assert torch.ops.hopattn.backward_varlen(*varlen, sink(4))[3].shape == (4,)


def test_ops_with_sinks_pass_torch_library_opcheck_on_fake_tensors():
    q, k, cu, s = meta(2, 64, 4, 64), meta(2, 64, 2, 64), ints(3), sink(4)
    lse, lse_v = meta(2, 4, 64, dtype=torch.float32), meta(4, 128, dtype=torch.float32)
    qv, kv = q.flatten(0, 1), k.flatten(0, 1)
    cases = [
        (torch.ops.hopattn.forward.default, (q, k, k, 0.0, True, -1, -1, False, 0, -1, s)),
        (torch.ops.hopattn.forward_varlen.default, (qv, kv, kv, cu, cu, None, None, 64, 64, 0.0, True, 128, 0,
                                                    False, 0, -1, None, s)),
        (torch.ops.hopattn.backward.default, (q, q, k, k, q, lse, 0.0, True, -1, -1, False, s)),
        (torch.ops.hopattn.backward.default, (q, q, k, k, q, lse, 0.0, True, -1, -1, False)),
        (torch.ops.hopattn.backward_varlen.default, (qv, qv, kv, kv, qv, lse_v, cu, cu, None, None, 64, 64, 0.0,
                                                     True, -1, -1, False, s)),
        (torch.ops.hopattn.forward_kvcache.default, (meta(2, 1, 4, 64), k, k, None, None, None, None, ints(2), None,
                                                     None, None, None, None, 0, None, 0.0, True, -1, -1, True, 0, -1,
                                                     s)),
    ]  # fmt: skip
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


def test_compile_fullgraph_with_sinks():
    torch._dynamo.reset()

    def loss(q, k, v, s, cu, max_q: int):
        out, lse = hopattn.attention(q, k, v, causal=True, return_lse=True, learnable_sink=s)
        varlen = hopattn.attention_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, max_q, max_q,
                                          learnable_sink=s)  # fmt: skip
        return out.float().sum() + lse.sum() + varlen.float().sum()

    q, k, s = meta(2, 64, 8, 64, grad=True), meta(2, 64, 2, 64, grad=True), sink(8, grad=True)
    torch.compile(loss, fullgraph=True, backend="aot_eager")(q, k, k, s, ints(3), 64).backward()
    assert s.grad.shape == (8,) and q.grad.shape == q.shape


def test_sinks_reach_the_library(cpu_memory_as_device, monkeypatch):
    """A sink the Python checks let through (they are switched off here) but the library refuses
    gets the library's message, from every call; a valid one stops at the device check."""
    q, kv = torch.randn(2, 32, 4, 64, dtype=BF16), torch.randn(2, 32, 2, 64, dtype=BF16)
    good = torch.zeros(8)[::2]  # strided: made contiguous for the library
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.attention(q, kv, kv, learnable_sink=good)
    monkeypatch.setattr(hop_torch, "_check_sink", lambda sink, q: None)
    bad = torch.zeros(3)
    cu = torch.tensor([0, 32, 64], dtype=torch.int32)
    message = r"sinks.shape\[0\] is 3 but must be 4"
    with pytest.raises(ValueError, match=message):
        hopattn.attention(q, kv, kv, learnable_sink=bad)
    with pytest.raises(ValueError, match=message):
        hopattn.attention_varlen(q.flatten(0, 1), kv.flatten(0, 1), kv.flatten(0, 1), cu, cu, 32, 32,
                                 learnable_sink=bad)  # fmt: skip
    with pytest.raises(ValueError, match=message):
        hopattn.attention_with_kvcache(q[:, :1], kv, kv, cache_seqlens=5, learnable_sink=bad)
    lse = torch.zeros(2, 4, 32)
    with pytest.raises(ValueError, match=message):
        hop_torch.backward_impl(q, q, kv, kv, q, lse, None, None, None, None, 0, 0, 0.0, True, -1, -1, False, bad)
    with pytest.raises(hopattn.DeviceUnavailableError):  # with its gradient, the backward stops at the device
        hop_torch.backward_impl(q, q, kv, kv, q, lse, None, None, None, None, 0, 0, 0.0, True, -1, -1, False, good)


# --- softcapping ------------------------------------------------------------------------------------


def _softcap_calls(q, kv, cu):
    """Every entry point that takes softcap, as functions of it (meta tensors: the fake
    implementations, so the same as under torch.compile)."""
    return {
        "attention": lambda c: hopattn.attention(q, kv, kv, softcap=c),
        "attention_varlen": lambda c: hopattn.attention_varlen(q[0], kv[0], kv[0], cu, cu, 8, 8, softcap=c),
        "attention_with_kvcache": lambda c: hopattn.attention_with_kvcache(q, kv, kv, cache_seqlens=3, softcap=c),
        "flash_attn_func": lambda c: hopattn.flash_attn_func(q, kv, kv, softcap=c),
        "flash_attn_varlen_func": lambda c: hopattn.flash_attn_varlen_func(q[0], kv[0], kv[0], cu, cu, 8, 8,
                                                                           softcap=c),
        "flash_attn_with_kvcache": lambda c: hopattn.flash_attn_with_kvcache(q, kv, kv, cache_seqlens=3, softcap=c),
    }  # fmt: skip


def test_softcap_argument_errors_before_the_library():
    q, kv, cu = meta(2, 16, 4, 64), meta(2, 16, 2, 64), ints(3)
    rule = "but must be 0 \\(off\\) or a positive finite cap"
    wrong = [
        (-1.0, ValueError, f"softcap is -1.0 {rule}"),
        (-1e-30, ValueError, f"softcap is -1e-30 {rule}"),  # however small, a negative cap is no "off"
        (float("nan"), ValueError, f"softcap is nan {rule}"),
        (float("inf"), ValueError, f"softcap is inf {rule}"),
        (-5, ValueError, f"softcap is -5.0 {rule}"),
        ("30", TypeError, "softcap must be a Python float, got str"),
        (True, TypeError, "softcap must be a Python float, got bool"),
        (torch.tensor(30.0), TypeError, "softcap must be a Python float, got Tensor"),  # no read-back
        (None, TypeError, "softcap must be a Python float, got NoneType"),
    ]
    for name, call in _softcap_calls(q, kv, cu).items():
        for bad, error, message in wrong:
            with pytest.raises(error, match=message) as info:
                call(bad)
            assert isinstance(info.value, hopattn.HopattnError), (name, bad)
        for good in (0.0, 30.0, 5, 1e-3):  # ints are taken as floats
            assert call(good).shape == (q[0] if "varlen" in name else q).shape, (name, good)


def test_softcap_on_a_cpu_tensor_stops_at_q():
    q = torch.randn(1, 16, 2, 64, dtype=BF16)
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        hopattn.attention(q, q, q, softcap=30.0)


def test_meta_shapes_and_gradients_with_softcap():
    q, k = meta(2, 100, 8, 64, grad=True), meta(2, 130, 2, 64, grad=True)
    out, lse = hopattn.attention(q, k, k, causal=True, return_lse=True, softcap=30.0)
    assert out.shape == q.shape and lse.shape == (2, 8, 100) and not lse.requires_grad
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape
    qv, kv, cu = meta(300, 8, 64, grad=True), meta(280, 2, 64, grad=True), ints(4)
    out, lse = hopattn.attention_varlen(qv, kv, kv, cu, cu, 128, 100, return_lse=True, softcap=5.0)
    assert out.shape == qv.shape and lse.shape == (8, 300)
    out.sum().backward()
    assert qv.grad.shape == qv.shape and kv.grad.shape == kv.shape


def test_softcap_reaches_the_backward_operators():
    """Autograd hands the forward's softcap to the backward operator (recorded by a dispatch mode,
    which also routes the calls through the operators)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.softcaps = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "hopattn":  # every caller passes softcap, positionally
                names = [a.name for a in func._schema.arguments]
                self.softcaps[func.__name__] = args[names.index("softcap")]
            return func(*args, **(kwargs or {}))

    q, k = meta(2, 64, 8, 64, grad=True), meta(2, 64, 2, 64, grad=True)
    qv, kv, cu = meta(128, 8, 64, grad=True), meta(128, 2, 64, grad=True), ints(3)
    with Record() as record:
        hopattn.attention(q, k, k, causal=True, softcap=30.0).sum().backward()
        hopattn.flash_attn_varlen_func(qv, kv, kv, cu, cu, 64, 64, softcap=5.0).sum().backward()
        hopattn.flash_attn_with_kvcache(q[:, :1], k, k, cache_seqlens=3, softcap=7.0)
    assert record.softcaps == {"forward.default": 30.0, "backward.default": 30.0, "forward_varlen.default": 5.0,
                               "backward_varlen.default": 5.0, "forward_kvcache.default": 7.0}  # fmt: skip


def test_eager_autograd_passes_softcap_to_the_backward(monkeypatch):
    """The eager path (no dispatcher) keeps the forward's softcap for its backward; the launches are
    replaced by stand-ins that record it, so this runs on CPU tensors."""
    seen = []

    def fake_forward(q, *args, **kwargs):
        seen.append(("forward", args[-1 - hop_torch._FP8_ARGUMENTS]))  # softcap: the last before the FP8 ones
        heads_first = (q.shape[1], q.shape[0]) if q.dim() == 3 else (q.shape[0], q.shape[2], q.shape[1])
        return torch.zeros_like(q), torch.zeros(heads_first)

    def fake_backward(dout, q, k, v, out, lse, *args):
        seen.append(("backward", args[-1]))
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None

    monkeypatch.setattr(hop_torch, "forward_impl", fake_forward)
    monkeypatch.setattr(hop_torch, "backward_impl", fake_backward)
    q = torch.randn(1, 16, 2, 64, dtype=BF16, requires_grad=True)
    hopattn.attention(q, q, q, softcap=30.0).sum().backward()
    assert seen == [("forward", 30.0), ("backward", 30.0)]
    seen.clear()
    cu = torch.tensor([0, 16], dtype=torch.int32)
    hopattn.attention_varlen(q[0], q[0], q[0], cu, cu, 16, 16, softcap=5).sum().backward()
    assert seen == [("forward", 5.0), ("backward", 5.0)]


def test_ops_with_softcap_pass_torch_library_opcheck_on_fake_tensors():
    """Each operator takes softcap last (the forward operators then their FP8 arguments: out_dtype
    and the descales, the KV-cache one its descales), with a default of 0.0 (callers of the older
    schemas are unaffected: the other opcheck tests call them without it)."""
    for name in ("forward", "forward_varlen", "forward_kvcache", "backward", "backward_varlen"):
        arguments = getattr(torch.ops.hopattn, name).default._schema.arguments
        fp8 = {"forward": hop_torch._FP8_ARGUMENTS, "forward_varlen": hop_torch._FP8_ARGUMENTS,
               "forward_kvcache": 3}.get(name, 0)  # fmt: skip
        softcap = arguments[-1 - fp8]
        assert (softcap.name, str(softcap.type), softcap.default_value) == ("softcap", "float", 0.0), name
    q, k, cu, s = meta(2, 64, 4, 64), meta(2, 64, 2, 64), ints(3), sink(4)
    lse, lse_v = meta(2, 4, 64, dtype=torch.float32), meta(4, 128, dtype=torch.float32)
    qv, kv = q.flatten(0, 1), k.flatten(0, 1)
    cases = [
        (torch.ops.hopattn.forward.default, (q, k, k, 0.0, True, -1, -1, False, 0, -1, None, 30.0)),
        (torch.ops.hopattn.forward.default, (q, k, k, 0.0, True, -1, -1, False, 0, -1, s, 5.0)),
        (torch.ops.hopattn.forward_varlen.default, (qv, kv, kv, cu, cu, None, None, 64, 64, 0.0, True, -1, -1,
                                                    False, 0, -1, None, None, 30.0)),
        (torch.ops.hopattn.backward.default, (q, q, k, k, q, lse, 0.0, True, -1, -1, False, None, 30.0)),
        (torch.ops.hopattn.backward_varlen.default, (qv, qv, kv, kv, qv, lse_v, cu, cu, None, None, 64, 64, 0.0,
                                                     True, -1, -1, False, s, 30.0)),
        (torch.ops.hopattn.forward_kvcache.default, (meta(2, 1, 4, 64), k, k, None, None, None, None, ints(2), None,
                                                     None, None, None, None, 0, None, 0.0, True, -1, -1, True, 0, -1,
                                                     None, 30.0)),
    ]  # fmt: skip
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
    # A direct operator call is checked as the public functions check.
    with pytest.raises(ValueError, match="softcap is -1.0"):
        torch.ops.hopattn.backward(q, q, k, k, q, lse, 0.0, True, -1, -1, False, None, -1.0)


def test_compile_fullgraph_with_softcap():
    torch._dynamo.reset()

    def loss(q, k, v, cu, max_q: int):
        out, lse = hopattn.attention(q, k, v, causal=True, return_lse=True, softcap=30.0)
        varlen = hopattn.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, max_q,
                                                max_q, softcap=5.0)  # fmt: skip
        return out.float().sum() + lse.sum() + varlen.float().sum()

    q, k = meta(2, 64, 8, 64, grad=True), meta(2, 64, 2, 64, grad=True)
    torch.compile(loss, fullgraph=True, backend="aot_eager")(q, k, k, ints(3), 64).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_softcap_reaches_the_library(cpu_memory_as_device, monkeypatch):
    """A cap the Python check lets through (it is switched off here) but the library refuses gets
    the library's message, from every call; a valid one stops at the device check."""
    q, kv = torch.randn(2, 32, 4, 64, dtype=BF16), torch.randn(2, 32, 2, 64, dtype=BF16)
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.attention(q, kv, kv, softcap=30.0)
    monkeypatch.setattr(hop_torch, "_softcap", float)
    cu = torch.tensor([0, 32, 64], dtype=torch.int32)
    message = r"softcap is -1 but must be 0 \(off\) or a positive finite cap"
    with pytest.raises(ValueError, match=message):
        hopattn.attention(q, kv, kv, softcap=-1.0)
    with pytest.raises(ValueError, match=message):
        hopattn.attention_varlen(q.flatten(0, 1), kv.flatten(0, 1), kv.flatten(0, 1), cu, cu, 32, 32, softcap=-1.0)
    with pytest.raises(ValueError, match=message):
        hopattn.attention_with_kvcache(q[:, :1], kv, kv, cache_seqlens=5, softcap=-1.0)
    lse = torch.zeros(2, 4, 32)
    backward = (q, q, kv, kv, q, lse, None, None, None, None, 0, 0, 0.0, True, -1, -1, False, None)
    with pytest.raises(ValueError, match=message):
        hop_torch.backward_impl(*backward, -1.0)
    with pytest.raises(hopattn.DeviceUnavailableError):  # a valid cap: the backward stops at the device
        hop_torch.backward_impl(*backward, 30.0)


# --- a value head dim of its own (head_dim_v: v's last dimension, out's and dv's too) -------------


def test_meta_shapes_and_gradients_with_head_dim_v():
    """out has v's head dim, narrower or wider than q's; every gradient has its input's shape."""
    for dim_v in (128, 256):  # next to head_dim 192
        q, k = meta(2, 100, 8, 192, grad=True), meta(2, 130, 2, 192, grad=True)
        v = meta(2, 130, 2, dim_v, grad=True)
        out, lse = hopattn.attention(q, k, v, causal=True, return_lse=True)
        assert out.shape == (2, 100, 8, dim_v) and lse.shape == (2, 8, 100)
        out.sum().backward()
        assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    q, k, v = meta(300, 8, 192, grad=True), meta(280, 2, 192, grad=True), meta(280, 2, 128, grad=True)
    out = hopattn.flash_attn_varlen_func(q, k, v, ints(4), ints(4), 128, 100)
    assert out.shape == (300, 8, 128)
    out.sum().backward()
    assert q.grad.shape == q.shape and v.grad.shape == v.shape


def test_kvcache_and_paged_meta_shapes_with_head_dim_v():
    q, k_cache, v_cache = meta(3, 2, 8, 192), meta(3, 256, 2, 192), meta(3, 256, 2, 128)
    out = hopattn.attention_with_kvcache(q, k_cache, v_cache, meta(3, 2, 2, 192), meta(3, 2, 2, 128),
                                         cache_seqlens=7)  # fmt: skip
    assert out.shape == (3, 2, 8, 128)
    out, lse = hopattn.flash_attn_with_kvcache(meta(11, 8, 192), k_cache, v_cache, cache_seqlens=ints(3),
                                               cu_seqlens_q=ints(4), max_seqlen_q=6, return_softmax_lse=True)
    assert out.shape == (11, 8, 128) and lse.shape == (8, 11)
    q, k_pages, v_pages = meta(30, 8, 192), meta(40, 16, 2, 192), meta(40, 16, 2, 128)
    out = hopattn.attention_varlen(q, k_pages, v_pages, ints(3), None, 20, 0, page_table=ints(2, 16))
    assert out.shape == (30, 8, 128)


def test_ops_with_head_dim_v_pass_opcheck_and_compile_fullgraph():
    q, k, v = meta(2, 64, 4, 192), meta(2, 64, 2, 192), meta(2, 64, 2, 128)
    torch.library.opcheck(torch.ops.hopattn.forward.default, (q, k, v, 0.0, True, -1, -1, False, 0, -1),
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip
    torch._dynamo.reset()

    def loss(q, k, v):
        return hopattn.attention(q, k, v, causal=True).float().sum()

    q, k, v = meta(2, 64, 4, 192, grad=True), meta(2, 64, 2, 192, grad=True), meta(2, 64, 2, 128, grad=True)
    torch.compile(loss, fullgraph=True, backend="aot_eager")(q, k, v).backward()
    assert v.grad.shape == v.shape and q.grad.shape == q.shape


def test_head_dim_v_reaches_the_library(cpu_memory_as_device):
    """Valid head dim pairs stop at the device check (out allocated with v's head dim); a head_dim_v
    the library refuses, and a dout or v_new without it, get the library's message."""
    q, k = torch.randn(2, 32, 4, 192, dtype=BF16), torch.randn(2, 32, 2, 192, dtype=BF16)
    v = torch.randn(2, 32, 2, 128, dtype=BF16)
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.attention(q, k, v, causal=True)
    message = r"v.shape\[3\] \(head_dim_v\) is 100 but must be a multiple of 8 in \[8, 256\]"
    with pytest.raises(ValueError, match=message):
        hopattn.attention(q, k, torch.randn(2, 32, 2, 100, dtype=BF16))
    cu = torch.tensor([0, 20, 64], dtype=torch.int32)
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.attention_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 44, 44)
    out, lse = torch.zeros(2, 32, 4, 128, dtype=BF16), torch.zeros(2, 4, 32)
    backward = (q, k, v, out, lse, None, None, None, None, 0, 0, 0.0, False, -1, -1, False)
    with pytest.raises(hopattn.DeviceUnavailableError):
        hop_torch.backward_impl(torch.zeros_like(out), *backward)
    with pytest.raises(ValueError, match=r"dout.shape\[3\] is 192 but must be 128"):
        hop_torch.backward_impl(torch.zeros_like(q), *backward)
    k_cache, v_cache = torch.zeros(2, 256, 2, 192, dtype=BF16), torch.zeros(2, 256, 2, 128, dtype=BF16)
    k_new, v_new = torch.randn(2, 3, 2, 192, dtype=BF16), torch.randn(2, 3, 2, 128, dtype=BF16)
    lens = torch.tensor([5, 9], dtype=torch.int32)
    with pytest.raises(hopattn.DeviceUnavailableError):
        hopattn.attention_with_kvcache(q[:, :1], k_cache, v_cache, k_new, v_new, cache_seqlens=lens)
    with pytest.raises(ValueError, match=r"v_new.shape\[3\] is 192 but must be 128"):
        hopattn.attention_with_kvcache(q[:, :1], k_cache, v_cache, k_new, k_new, cache_seqlens=lens)
