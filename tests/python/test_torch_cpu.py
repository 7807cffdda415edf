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

    def check_qkv(q, k, v):
        for t in (q, k, v):
            if t.dtype not in hop_torch._DTYPE_CODES:
                raise TypeError(t.dtype)

    class NoDevice:
        def __init__(self, device):
            pass

        def __enter__(self):
            return 0

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(hop_torch, "_check_qkv", check_qkv)
    monkeypatch.setattr(hop_torch, "_check_index_array", lambda name, t, device: None)
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
    for name in ("forward", "forward_varlen", "backward", "backward_varlen"):
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
