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
    with pytest.raises(NotImplementedError, match="softcap"):
        hopattn.flash_attn_func(q, q, q, softcap=30.0)
    with pytest.raises(NotImplementedError, match="FP8"):
        hopattn.flash_attn_func(q, q, q, q_descale=torch.ones(1))
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
    for option in (dict(qv=q), dict(k_descale=torch.ones(1)), dict(attention_chunk=128), dict(softcap=5.0),
                   dict(scheduler_metadata=ints(8))):  # fmt: skip
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
