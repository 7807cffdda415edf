"""PyTorch integration: argument checks, the launches, autograd and the torch.library ops.

Two paths lead to the same launch code:
- torch.compile (and any tracing: fake tensors, dispatch modes, tensor subclasses) goes through the
  operators hopattn::forward, hopattn::forward_varlen, hopattn::backward and
  hopattn::backward_varlen, registered with torch.library.custom_op, with fake implementations and
  register_autograd, so Dynamo traces them without graph breaks; likewise hopattn::forward_kvcache,
  which declares that it mutates the caches and has no autograd (inference only).
- Plain eager calls on plain tensors skip the dispatcher and use a torch.autograd.Function directly:
  a custom op's Python dispatch costs tens of microseconds per call in eager mode (measured at
  ~25 us without and ~60 us with autograd on a loaded CPU), several times the whole launch.

Every launch uses the current CUDA stream of the tensors' device and takes its memory (outputs and
the backward workspace) from PyTorch's caching allocator, so CUDA-graph capture and replay work.
"""

import math
import numbers
from typing import Optional, Tuple

import torch

from . import _capi
from ._capi import ArgumentTypeError, InvalidArgumentError, NotSupportedError

Tensor = torch.Tensor

_FP8 = torch.float8_e4m3fn  # FP8 inputs (forward only): the library's float8_e4m3
_DTYPE_CODES = {torch.float16: _capi.FLOAT16, torch.bfloat16: _capi.BFLOAT16, _FP8: _capi.FLOAT8_E4M3}
_FP8_NO_BACKWARD = ("hopattn: attention on float8_e4m3fn inputs has a forward only (FP8 has no backward); call it "
                    "under torch.no_grad() or on tensors that do not require grad, or train in bfloat16/float16")

# How many TorchDispatchModes are active (a private function with a stable name since 2.1).
_len_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(device_index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


# --- checks (run on real and on fake tensors) ----------------------------------------------------


def _no_cuda_hint() -> str:
    if torch.cuda.is_available():
        return ""
    return " (PyTorch sees no CUDA device on this machine: hopattn needs an NVIDIA Hopper GPU, H100/H200)"


def _check_qkv(q, k, v) -> None:
    """The attention functions' tensors (see _check_tensors)."""
    _check_tensors(q, (("k", k), ("v", v)), "4, (batch, seqlen, heads, head_dim), or 3 in varlen mode, "
                   "(total_tokens, heads, head_dim)")  # fmt: skip


def _check_tensors(q, others, ranks: str) -> None:
    """What the library cannot see from pointers: tensor types, devices, dtypes of q and of the
    (name, tensor) pairs in `others`, which must share q's device and dtype. `ranks` completes the
    message for a tensor of more dimensions than the C struct holds."""
    named = (("q", q), *others)
    for name, t in named:
        if not isinstance(t, Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.device.type != "cuda" and q.device.type != "meta":  # meta: shapes only, through the fake impls
        raise InvalidArgumentError(f"q is on {q.device}, but hopattn runs on CUDA tensors{_no_cuda_hint()}")
    for name, t in others:
        if t.device != q.device:
            raise InvalidArgumentError(f"{name} is on {t.device} but q is on {q.device}; all tensors must share a device")
    for name, t in named:
        if t.dim() > _capi.MAX_RANK:  # the C struct holds at most 4 dimensions
            raise InvalidArgumentError(f"{name} has {t.dim()} dimensions but must have {ranks}")
    if q.dtype not in _DTYPE_CODES:
        raise ArgumentTypeError(f"q.dtype is {q.dtype} but must be torch.float16 or torch.bfloat16 (or, forward "
                                "only, torch.float8_e4m3fn)")
    for name, t in others:
        if t.dtype != q.dtype:
            raise ArgumentTypeError(f"{name}.dtype is {t.dtype} but must be {q.dtype} (the dtype of q)")


def _check_rank(q, k, v, varlen: bool) -> None:
    """The library's rank rule, for the fake implementations (which must not fail on indexing)."""
    want, dims = (3, "(total_tokens, heads, head_dim)") if varlen else (4, "(batch, seqlen, heads, head_dim)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != want:
            raise InvalidArgumentError(f"{name}.rank is {t.dim()} but must be {want}: {dims}")


def _check_paged_rank(q, k, v) -> None:
    """The rank rule of the varlen forward on pages, for the fake implementation."""
    if q.dim() != 3:
        raise InvalidArgumentError(f"q.rank is {q.dim()} but must be 3: (total_tokens, heads, head_dim)")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 4:
            raise InvalidArgumentError(f"{name}.rank is {t.dim()} but must be 4 with page_table: "
                                       "(num_pages, page_size, heads_kv, head_dim)")


def _out_shape(q, v) -> tuple:
    """out's shape: q's, with v's last dimension (head_dim_v, V's head dim, which may differ from q's
    head_dim). A v of no dimensions gives q's without its last, for the library's rank error."""
    return (*q.shape[:-1], *v.shape[-1:])


def _check_index_array(name: str, t, device, dims: int = 1) -> None:
    """An int32 tensor of `dims` dimensions on `device` (1: cu_seqlens and the like; 2: a page table)."""
    if not isinstance(t, Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor of int32, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ArgumentTypeError(f"{name}.dtype is {t.dtype} but must be torch.int32")
    if t.dim() != dims:
        raise InvalidArgumentError(f"{name} has shape {tuple(t.shape)} but must be {dims}-D")
    if t.device != device:
        raise InvalidArgumentError(f"{name} is on {t.device} but q is on {device}; all tensors must share a device")


def _check_varlen(q, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k) -> None:
    _check_index_array("cu_seqlens_q", cu_seqlens_q, q.device)
    if cu_seqlens_k is not None:  # absent with a page table (the library names it where it is missing)
        _check_index_array("cu_seqlens_k", cu_seqlens_k, q.device)
    if seqused_q is not None:
        _check_index_array("seqused_q", seqused_q, q.device)
    if seqused_k is not None:
        _check_index_array("seqused_k", seqused_k, q.device)
    _check_max_seqlens(max_seqlen_q, max_seqlen_k)


def _check_max_seqlens(max_seqlen_q, max_seqlen_k) -> None:
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, Tensor) or not isinstance(value, (int, torch.SymInt)) or isinstance(value, bool):
            raise ArgumentTypeError(
                f"{name} must be a Python int (no tensor: reading one back would synchronise), got {type(value).__name__}"
            )


def _check_float32_tensor(name: str, t, q) -> None:
    """A float32 tensor argument on q's device (learnable_sink, the descales): its type, dtype and
    device, each with its own error."""
    if not isinstance(t, Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor of float32, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise ArgumentTypeError(f"{name}.dtype is {t.dtype} but must be torch.float32")
    if t.device != q.device:
        raise InvalidArgumentError(f"{name} is on {t.device} but q is on {q.device}; all tensors must share a device")


def _check_sink(sink, q) -> None:
    """learnable_sink: a float32 tensor of one logit per query head, on q's device. Checked here
    rather than left to the library, whose messages call it `sinks`, and so that the fake
    implementations reject the same arguments."""
    _check_float32_tensor("learnable_sink", sink, q)
    if sink.dim() != 1:
        raise InvalidArgumentError(f"learnable_sink has shape {tuple(sink.shape)} but must be (heads,): one logit per "
                                   "query head")
    # q is (..., heads, head_dim) in every layout; a q of fewer dimensions is q's error, reported by its checks.
    if q.dim() >= 3 and sink.shape[0] != q.shape[-2]:
        raise InvalidArgumentError(f"learnable_sink has shape {tuple(sink.shape)} but must be (heads,) = "
                                   f"({q.shape[-2]},): one logit per query head")


def _window(window_size) -> Tuple[int, int]:
    try:
        left, right = window_size
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}") from None
    return left, right


def _softcap(softcap) -> float:
    """softcap as a float: 0 (off) or a positive, finite cap, the library's rule, checked here too
    so that the fake implementations (meta tensors, torch.compile) reject what a real call would."""
    if type(softcap) is not float:  # the common case skips the slower isinstance checks below
        if isinstance(softcap, (bool, Tensor)) or not isinstance(softcap, (numbers.Real, torch.SymFloat)):
            # A tensor would have to be read back (a synchronisation); a bool is a mistake.
            raise ArgumentTypeError(f"softcap must be a Python float, got {type(softcap).__name__}")
        softcap = float(softcap)
    if not 0.0 <= softcap < math.inf:  # NaN fails both comparisons
        raise InvalidArgumentError(f"softcap is {softcap} but must be 0 (off) or a positive finite cap: scores "
                                   "become softcap * tanh(score / softcap)")
    return softcap


def _out_dtype(q, out_dtype) -> torch.dtype:
    """out's dtype: q's for float16/bfloat16 inputs; for float8_e4m3fn inputs out_dtype, None meaning
    bfloat16 (FlashAttention-3's), which must be 16-bit: there is no FP8 output."""
    if q.dtype != _FP8:
        if out_dtype is not None and out_dtype != q.dtype:
            raise ArgumentTypeError(f"out_dtype is {out_dtype} but q.dtype is {q.dtype}: float16 and bfloat16 inputs "
                                    "give an out of their own dtype (out_dtype is for float8_e4m3fn inputs)")
        return q.dtype
    if out_dtype is None:
        return torch.bfloat16
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise ArgumentTypeError(f"out_dtype is {out_dtype} but must be torch.bfloat16 or torch.float16: "
                                "float8_e4m3fn inputs give a 16-bit out (there is no FP8 output)")
    return out_dtype


def _check_descales(q, q_descale, k_descale, v_descale) -> None:
    """FP8 inputs' descale factors: each None (1) or a float32 (batch, heads_kv) tensor on q's
    device, for float8_e4m3fn inputs only (FlashAttention-3's q_descale, k_descale, v_descale).
    Checked here too so that the fake implementations reject what the library would; the library
    checks the shape against the problem."""
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            continue
        if q.dtype != _FP8:
            raise InvalidArgumentError(f"{name} is given but q.dtype is {q.dtype}: descale factors belong to "
                                       "torch.float8_e4m3fn inputs only")
        _check_float32_tensor(name, t, q)
        if t.dim() != 2:
            raise InvalidArgumentError(f"{name} has shape {tuple(t.shape)} but must be (batch, heads_kv)")


def _descale(t: Optional[Tensor]) -> Optional[Tensor]:
    """A descale as the library reads it: the heads contiguous (a copy of, say, a tensor expanded
    from one value). Callers hold the result until the launch, as with _sink."""
    return t if t is None or t.shape[1] <= 1 or t.stride(1) == 1 else t.contiguous()


def _descale_fields(t: Optional[Tensor]) -> tuple:
    return _capi.EMPTY_TENSOR if t is None else _fields(t, _capi.FLOAT32)


def _refuse_fp8_backward(q) -> None:
    """The backward's (and its fake's) refusal of FP8 inputs, which have a forward only."""
    if q.dtype == _FP8:
        raise NotSupportedError(_FP8_NO_BACKWARD)


# --- launches -------------------------------------------------------------------------------------


def _fields(t: Tensor, code: int) -> tuple:
    return _capi.tensor_fields(t.data_ptr(), code, t.shape, t.stride())


def _index_fields(t: Optional[Tensor]) -> tuple:
    if t is None:
        return (0, 0)
    return (t.data_ptr(), t.shape[0])


def _index_array(t: Optional[Tensor]) -> Optional[Tensor]:
    return t if t is None or t.stride(0) == 1 else t.contiguous()


def _varlen_fields(cu_q, cu_k, used_q, used_k, max_q, max_k) -> tuple:
    return (*_index_fields(cu_q), *_index_fields(cu_k), *_index_fields(used_q), *_index_fields(used_k), max_q, max_k)


def _page_table(t: Optional[Tensor]) -> Optional[Tensor]:
    """The page table as the library reads it: contiguous rows, each row_stride >= max_pages
    elements after the last (a copy otherwise, for example of a broadcast table)."""
    if t is None:
        return None
    rows, pages = t.shape
    if (pages > 1 and t.stride(1) != 1) or (rows > 1 and t.stride(0) < pages):
        return t.contiguous()
    return t


def _page_table_fields(t: Optional[Tensor]) -> tuple:
    if t is None:
        return _capi.EMPTY_PAGE_TABLE
    # A single row's stride is never used; 0 tells the library so (it means max_pages).
    return (t.data_ptr(), t.shape[0], t.shape[1], t.stride(0) if t.shape[0] > 1 else 0)


def _sink(t: Optional[Tensor]) -> Optional[Tensor]:
    """learnable_sink as the library reads it: one contiguous logit per head (a copy of a strided
    view). Callers hold the result until the launch, so that no allocation in between reuses a
    copy's memory."""
    return t if t is None or t.stride(0) == 1 or t.shape[0] <= 1 else t.contiguous()


def _sink_fields(t: Optional[Tensor]) -> tuple:
    return _capi.EMPTY_TENSOR if t is None else _fields(t, _capi.FLOAT32)


class _OnDevice:
    """Makes the tensors' device current for the library (it launches on the current device) and
    gives its current stream; restores the previous device afterwards."""

    __slots__ = ("index", "previous")

    def __init__(self, device: torch.device):
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.previous = -1

    def __enter__(self) -> int:
        current = torch.cuda.current_device()
        if current != self.index:
            self.previous = current
            torch.cuda.set_device(self.index)
        return _current_stream(self.index)

    def __exit__(self, *exc) -> None:
        if self.previous >= 0:
            torch.cuda.set_device(self.previous)


def _accepted_as_is(t: Tensor) -> bool:
    """Whether the library accepts `t` as it is (16-byte aligned, last dim contiguous, other
    strides multiples of 8 elements), so that dout never needs a copy when it does not have to."""
    if t.data_ptr() % 16:
        return False
    stride = t.stride()
    if stride[-1] != 1 and t.shape[-1] > 1:
        return False
    return all(s % 8 == 0 for s, n in zip(stride[:-1], t.shape[:-1]) if n > 1)


def forward_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    seqused_q: Optional[Tensor],
    seqused_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    num_splits: int = 0,
    pack_gqa: int = _capi.PACK_GQA_AUTO,
    page_table: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    softcap: float = 0.0,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    with_lse: bool = True,
) -> Tuple[Tensor, Optional[Tensor]]:
    """(out, lse); with_lse=False skips the LSE (None): one allocation less per call where nobody
    needs it (inference without gradients). With page_table, k and v are pages (chunked prefill);
    sinks: the float32 (heads,) attention sinks (learnable_sink) or None; softcap: the score cap
    (0: off), which the library validates; q/k/v_descale and out_dtype: float8_e4m3fn inputs'
    descale factors and out's dtype (see _check_descales, _out_dtype)."""
    _check_qkv(q, k, v)
    out_dtype = _out_dtype(q, out_dtype)
    _check_descales(q, q_descale, k_descale, v_descale)
    q_descale, k_descale, v_descale = _descale(q_descale), _descale(k_descale), _descale(v_descale)
    if sinks is not None:
        _check_sink(sinks, q)
        sinks = _sink(sinks)
    if page_table is not None:
        _check_index_array("page_table", page_table, q.device, dims=2)
        page_table = _page_table(page_table)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    code = _DTYPE_CODES[q.dtype]
    if varlen:
        _check_varlen(q, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
        cu_seqlens_q, cu_seqlens_k = _index_array(cu_seqlens_q), _index_array(cu_seqlens_k)
        seqused_q, seqused_k = _index_array(seqused_q), _index_array(seqused_k)
        # Rows that no sequence covers (or beyond seqused) read as rows that see no key, O = 0 and
        # LSE = -inf: the library sets them, except with a page table (its KV-cache path), where
        # they are filled here (zero-filling costs a pass over O: ~22 us at 16k tokens x 16 heads
        # x d128 on the H100).
        lse_shape = (q.shape[1], q.shape[0])
        if page_table is None:
            out = torch.empty(_out_shape(q, v), dtype=out_dtype, device=q.device)
            lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device) if with_lse else None
        else:
            out = torch.zeros(_out_shape(q, v), dtype=out_dtype, device=q.device)
            lse = torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device) if with_lse else None
        varlen_fields = _varlen_fields(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
    else:
        out = torch.empty(_out_shape(q, v), dtype=out_dtype, device=q.device)
        lse = None
        if with_lse:
            lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
        varlen_fields = _capi.EMPTY_VARLEN
    args = _capi.pack_forward(
        _fields(q, code),
        _fields(k, code),
        _fields(v, code),
        _fields(out, _DTYPE_CODES[out_dtype]),
        _fields(lse, _capi.FLOAT32) if with_lse else _capi.EMPTY_TENSOR,
        float(softmax_scale),
        int(bool(causal)),
        int(window_left),
        int(window_right),
        varlen_fields,
        int(num_splits),
        int(pack_gqa),
        _page_table_fields(page_table),
        _sink_fields(sinks),
        float(softcap),
        _descale_fields(q_descale),
        _descale_fields(k_descale),
        _descale_fields(v_descale),
    )
    with _OnDevice(q.device) as stream:
        # The size depends on the device (its SM count), hence inside the device scope.
        workspace_bytes = _capi.forward_workspace_size(args)
        if workspace_bytes:
            # From the caching allocator: no cudaMalloc per call, and capturable in a CUDA graph.
            workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device)
            _capi.forward_with_workspace(args, workspace.data_ptr(), workspace_bytes, stream)
        else:
            _capi.forward(args, stream)
    return out, lse


def backward_impl(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    seqused_q: Optional[Tensor],
    seqused_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    deterministic: bool,
    sinks: Optional[Tensor] = None,
    softcap: float = 0.0,
) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """(dq, dk, dv, dsinks): dsinks, the gradient of the float32 (heads,) attention sinks, is None
    without sinks. softcap is the forward's."""
    _check_qkv(q, k, v)
    _refuse_fp8_backward(q)
    if sinks is not None:
        _check_sink(sinks, q)
        sinks = _sink(sinks)
    for name, t in (("dout", dout), ("out", out), ("lse", lse)):
        if not isinstance(t, Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != q.device:
            raise InvalidArgumentError(f"{name} is on {t.device} but q is on {q.device}; all tensors must share a device")
    if dout.dtype != q.dtype:
        dout = dout.to(q.dtype)
    if not _accepted_as_is(dout):
        dout = dout.contiguous()
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    code = _DTYPE_CODES[q.dtype]
    if varlen:
        _check_varlen(q, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
        cu_seqlens_q, cu_seqlens_k = _index_array(cu_seqlens_q), _index_array(cu_seqlens_k)
        seqused_q, seqused_k = _index_array(seqused_q), _index_array(seqused_k)
        varlen_fields = _varlen_fields(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
    else:
        varlen_fields = _capi.EMPTY_VARLEN
    # Uninitialized: the library writes every row, zeros where no sequence covers it (zero-filling
    # them here cost ~70 us a call at 16k tokens x 16 heads x d128 on the H100).
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    # Not zeroed: the library writes every head's gradient, 0 for heads without query rows.
    dsinks = torch.empty(sinks.shape, dtype=torch.float32, device=q.device) if sinks is not None else None
    args = _capi.pack_backward(
        _fields(q, code),
        _fields(k, code),
        _fields(v, code),
        _fields(out, code),
        _fields(lse, _capi.FLOAT32),
        _fields(dout, code),
        _fields(dq, code),
        _fields(dk, code),
        _fields(dv, code),
        float(softmax_scale),
        int(bool(causal)),
        int(window_left),
        int(window_right),
        varlen_fields,
        int(bool(deterministic)),
        _sink_fields(sinks),
        _sink_fields(dsinks),
        float(softcap),
    )
    workspace_bytes = _capi.backward_workspace_size(args)
    # From the caching allocator: no cudaMalloc per call, and capturable in a CUDA graph.
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device) if workspace_bytes else None
    with _OnDevice(q.device) as stream:
        _capi.backward(args, workspace.data_ptr() if workspace is not None else 0, workspace_bytes, stream)
    return dq, dk, dv, dsinks


_NO_ROTARY = (*_capi.EMPTY_TENSOR, *_capi.EMPTY_TENSOR)


def _check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, page_table, index_arrays, sinks) -> None:
    """forward_kvcache's types, devices and dtypes (index_arrays: (name, tensor or None) pairs), and
    the pairs that come together."""
    for a, b, name_a, name_b in ((k, v, "k", "v"), (rotary_cos, rotary_sin, "rotary_cos", "rotary_sin")):
        if (a is None) != (b is None):
            given, missing = (name_a, name_b) if b is None else (name_b, name_a)
            raise InvalidArgumentError(f"{given} is given but {missing} is None; they come together")
    tensors = [("k_cache", k_cache), ("v_cache", v_cache)]
    tensors += [(name, t) for name, t in (("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin))
                if t is not None]  # fmt: skip
    _check_tensors(q, tensors, "at most 4 (see hopattn.attention_with_kvcache)")
    for name, t in index_arrays:
        if t is not None:
            _check_index_array(name, t, q.device)
    if page_table is not None:
        _check_index_array("page_table", page_table, q.device, dims=2)
    if sinks is not None:
        _check_sink(sinks, q)


def forward_kvcache_impl(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor],
    v: Optional[Tensor],
    rotary_cos: Optional[Tensor],
    rotary_sin: Optional[Tensor],
    cache_seqlens: Tensor,
    cache_batch_idx: Optional[Tensor],
    cache_leftpad: Optional[Tensor],
    page_table: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k_new: Optional[Tensor],
    max_seqlen_q: int,
    rotary_seqlens: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    rotary_interleaved: bool,
    num_splits: int,
    pack_gqa: int,
    sinks: Optional[Tensor] = None,
    softcap: float = 0.0,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    with_lse: bool = True,
) -> Tuple[Tensor, Optional[Tensor]]:
    """(out, lse) of one step against a KV cache; k_cache and v_cache are updated in place where
    k and v are given. with_lse=False skips the LSE (None); sinks, softcap and the descales (of an
    FP8 cache, whose out is bfloat16) as in forward_impl."""
    index_arrays = (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                    ("cache_leftpad", cache_leftpad), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k_new", cu_seqlens_k_new), ("rotary_seqlens", rotary_seqlens))  # fmt: skip
    _check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, page_table, index_arrays, sinks)
    _check_descales(q, q_descale, k_descale, v_descale)
    sinks = _sink(sinks)
    q_descale, k_descale, v_descale = _descale(q_descale), _descale(k_descale), _descale(v_descale)
    code = _DTYPE_CODES[q.dtype]
    out_dtype = _out_dtype(q, None)  # an FP8 cache's out is bfloat16
    lse = None
    if cu_seqlens_q is not None:
        _check_max_seqlens(max_seqlen_q, 0)
        # As in the varlen forward: rows of no sequence are not written (out = 0, lse = -inf).
        out = torch.zeros(_out_shape(q, v_cache), dtype=out_dtype, device=q.device)
        if with_lse:
            lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    else:
        max_seqlen_q = 0
        out = torch.empty(_out_shape(q, v_cache), dtype=out_dtype, device=q.device)
        if with_lse:
            lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    # rotary_seqlens goes along without the tables too, so that the library names that mistake.
    tables = (*_fields(rotary_cos, code), *_fields(rotary_sin, code)) if rotary_cos is not None else _NO_ROTARY
    rotary = (*tables, int(bool(rotary_interleaved)), *_index_fields(_index_array(rotary_seqlens)))
    args = _capi.pack_kvcache(
        _fields(q, code),
        _fields(k_cache, code),
        _fields(v_cache, code),
        _fields(out, _DTYPE_CODES[out_dtype]),
        _fields(lse, _capi.FLOAT32) if with_lse else _capi.EMPTY_TENSOR,
        float(softmax_scale),
        int(bool(causal)),
        int(window_left),
        int(window_right),
        cache_seqlens=_index_fields(_index_array(cache_seqlens)),
        page_table=_page_table_fields(_page_table(page_table)),
        cache_batch_idx=_index_fields(_index_array(cache_batch_idx)),
        cache_leftpad=_index_fields(_index_array(cache_leftpad)),
        k_new=_fields(k, code) if k is not None else _capi.EMPTY_TENSOR,
        v_new=_fields(v, code) if v is not None else _capi.EMPTY_TENSOR,
        cu_seqlens_new=_index_fields(_index_array(cu_seqlens_k_new)),
        rotary=rotary,
        cu_seqlens_q=_index_fields(_index_array(cu_seqlens_q)),
        max_seqlen_q=int(max_seqlen_q),
        num_splits=int(num_splits),
        pack_gqa=int(pack_gqa),
        sinks=_sink_fields(sinks),
        softcap=float(softcap),
        q_descale=_descale_fields(q_descale),
        k_descale=_descale_fields(k_descale),
        v_descale=_descale_fields(v_descale),
    )
    with _OnDevice(q.device) as stream:
        workspace_bytes = _capi.forward_kvcache_workspace_size(args)
        # From the caching allocator, as the forward's: no cudaMalloc per call, capturable in a graph.
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device) if workspace_bytes else None
        _capi.forward_kvcache(args, workspace.data_ptr() if workspace is not None else 0, workspace_bytes, stream)
    return out, lse


# --- torch.library operators (torch.compile, tracing) --------------------------------------------
#
# learnable_sink and then softcap come last in each schema, with defaults, so that calls written for
# the schemas from before them keep working; the backward operators also return the sink's
# gradient as a fourth tensor (empty without a sink), so their callers unpack four now.


@torch.library.custom_op("hopattn::forward", mutates_args=())
def _forward_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    deterministic: bool,
    num_splits: int,
    pack_gqa: int,
    learnable_sink: Optional[Tensor] = None,
    softcap: float = 0.0,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> Tuple[Tensor, Tensor]:
    return forward_impl(
        q, k, v, None, None, None, None, 0, 0, softmax_scale, causal, window_left, window_right, num_splits, pack_gqa,
        None, learnable_sink, softcap, q_descale, k_descale, v_descale, out_dtype,
    )  # fmt: skip


def _fake_out(q, v, q_descale, k_descale, v_descale, out_dtype) -> Tensor:
    """The fake implementations' out, after the checks of the FP8 arguments."""
    _check_descales(q, q_descale, k_descale, v_descale)
    return q.new_empty(_out_shape(q, v), dtype=_out_dtype(q, out_dtype))


@_forward_op.register_fake
def _forward_fake(
    q, k, v, softmax_scale, causal, window_left, window_right, deterministic, num_splits, pack_gqa, learnable_sink=None,
    softcap=0.0, q_descale=None, k_descale=None, v_descale=None, out_dtype=None,
):  # fmt: skip
    _check_qkv(q, k, v)
    _check_rank(q, k, v, varlen=False)
    if learnable_sink is not None:
        _check_sink(learnable_sink, q)
    _softcap(softcap)
    out = _fake_out(q, v, q_descale, k_descale, v_descale, out_dtype)
    return out, q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


@torch.library.custom_op("hopattn::forward_varlen", mutates_args=())
def _forward_varlen_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Optional[Tensor],
    seqused_q: Optional[Tensor],
    seqused_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    deterministic: bool,
    num_splits: int,
    pack_gqa: int,
    page_table: Optional[Tensor] = None,
    learnable_sink: Optional[Tensor] = None,
    softcap: float = 0.0,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
) -> Tuple[Tensor, Tensor]:
    return forward_impl(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, causal, window_left, window_right, num_splits, pack_gqa, page_table, learnable_sink, softcap,
        q_descale, k_descale, v_descale, out_dtype,
    )  # fmt: skip


@_forward_varlen_op.register_fake
def _forward_varlen_fake(
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
    softmax_scale, causal, window_left, window_right, deterministic, num_splits, pack_gqa, page_table=None,
    learnable_sink=None, softcap=0.0, q_descale=None, k_descale=None, v_descale=None, out_dtype=None,
):  # fmt: skip
    _check_qkv(q, k, v)
    if page_table is None:
        _check_rank(q, k, v, varlen=True)
    else:
        _check_index_array("page_table", page_table, q.device, dims=2)
        _check_paged_rank(q, k, v)
    _check_varlen(q, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
    if learnable_sink is not None:
        _check_sink(learnable_sink, q)
    _softcap(softcap)
    out = _fake_out(q, v, q_descale, k_descale, v_descale, out_dtype)
    return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("hopattn::forward_kvcache", mutates_args=("k_cache", "v_cache"))
def _forward_kvcache_op(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor],
    v: Optional[Tensor],
    rotary_cos: Optional[Tensor],
    rotary_sin: Optional[Tensor],
    cache_seqlens: Tensor,
    cache_batch_idx: Optional[Tensor],
    cache_leftpad: Optional[Tensor],
    page_table: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k_new: Optional[Tensor],
    max_seqlen_q: int,
    rotary_seqlens: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    rotary_interleaved: bool,
    num_splits: int,
    pack_gqa: int,
    learnable_sink: Optional[Tensor] = None,
    softcap: float = 0.0,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    return forward_kvcache_impl(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, page_table,
        cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, rotary_seqlens, softmax_scale, causal, window_left,
        window_right, rotary_interleaved, num_splits, pack_gqa, learnable_sink, softcap, q_descale, k_descale,
        v_descale,
    )  # fmt: skip


@_forward_kvcache_op.register_fake
def _forward_kvcache_fake(
    q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, page_table,
    cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, rotary_seqlens, softmax_scale, causal, window_left, window_right,
    rotary_interleaved, num_splits, pack_gqa, learnable_sink=None, softcap=0.0, q_descale=None, k_descale=None,
    v_descale=None,
):  # fmt: skip
    index_arrays = (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                    ("cache_leftpad", cache_leftpad), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k_new", cu_seqlens_k_new), ("rotary_seqlens", rotary_seqlens))  # fmt: skip
    _check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, page_table, index_arrays, learnable_sink)
    _check_descales(q, q_descale, k_descale, v_descale)
    _softcap(softcap)
    varlen = cu_seqlens_q is not None
    want, dims = (3, "(total_q, heads, head_dim)") if varlen else (4, "(batch, seqlen_q, heads, head_dim)")
    if q.dim() != want:
        raise InvalidArgumentError(f"q.rank is {q.dim()} but must be {want}: {dims}")
    out = q.new_empty(_out_shape(q, v_cache), dtype=_out_dtype(q, None))
    if varlen:
        return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return out, q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def _sink_gradient(dsink: Optional[Tensor], q: Tensor) -> Tensor:
    """The backward operators' last output: the sink's gradient, or an empty (0,) tensor without
    a sink (an operator returns tensors, never None)."""
    return dsink if dsink is not None else q.new_empty((0,), dtype=torch.float32)


def _sink_gradient_fake(sink: Optional[Tensor], q: Tensor) -> Tensor:
    return q.new_empty((sink.shape[0] if sink is not None else 0,), dtype=torch.float32)


@torch.library.custom_op("hopattn::backward", mutates_args=())
def _backward_op(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    deterministic: bool,
    learnable_sink: Optional[Tensor] = None,
    softcap: float = 0.0,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv, dsink = backward_impl(
        dout, q, k, v, out, lse, None, None, None, None, 0, 0,
        softmax_scale, causal, window_left, window_right, deterministic, learnable_sink, softcap,
    )  # fmt: skip
    return dq, dk, dv, _sink_gradient(dsink, q)


@_backward_op.register_fake
def _backward_fake(
    dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, deterministic, learnable_sink=None,
    softcap=0.0,
):  # fmt: skip
    _refuse_fp8_backward(q)
    _softcap(softcap)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), _sink_gradient_fake(learnable_sink, q)


@torch.library.custom_op("hopattn::backward_varlen", mutates_args=())
def _backward_varlen_op(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    seqused_q: Optional[Tensor],
    seqused_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    deterministic: bool,
    learnable_sink: Optional[Tensor] = None,
    softcap: float = 0.0,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv, dsink = backward_impl(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, causal, window_left, window_right, deterministic, learnable_sink, softcap,
    )  # fmt: skip
    return dq, dk, dv, _sink_gradient(dsink, q)


@_backward_varlen_op.register_fake
def _backward_varlen_fake(
    dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
    softmax_scale, causal, window_left, window_right, deterministic, learnable_sink=None, softcap=0.0,
):  # fmt: skip
    _refuse_fp8_backward(q)
    _softcap(softcap)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), _sink_gradient_fake(learnable_sink, q)


# The FP8 arguments (q/k/v_descale, out_dtype) come last in the forward operators; FP8 inputs have
# no backward, which backward_impl (and the backward operators' fakes) refuse.
_FP8_ARGUMENTS = 4


def _setup_forward(ctx, inputs, output):
    (q, k, v, softmax_scale, causal, window_left, window_right, deterministic, _num_splits, _pack_gqa, sink,
     softcap) = inputs[:-_FP8_ARGUMENTS]  # fmt: skip
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sink)
    ctx.params = (softmax_scale, causal, window_left, window_right, deterministic)
    ctx.softcap = softcap
    ctx.mark_non_differentiable(lse)


def _backward_forward(ctx, dout, dlse):
    q, k, v, out, lse, sink = ctx.saved_tensors
    dq, dk, dv, dsink = torch.ops.hopattn.backward(dout, q, k, v, out, lse, *ctx.params, sink, ctx.softcap)
    return (dq, dk, dv) + (None,) * 7 + (dsink if sink is not None else None, None) + (None,) * _FP8_ARGUMENTS


_forward_op.register_autograd(_backward_forward, setup_context=_setup_forward)


def _setup_forward_varlen(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, used_q, used_k, max_q, max_k, softmax_scale, causal, window_left, window_right,
     deterministic, _num_splits, _pack_gqa, page_table, sink, softcap) = inputs[:-_FP8_ARGUMENTS]  # fmt: skip
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, used_q, used_k, sink)
    ctx.params = (max_q, max_k, softmax_scale, causal, window_left, window_right, deterministic)
    ctx.softcap = softcap
    ctx.paged = page_table is not None
    ctx.mark_non_differentiable(lse)


def _backward_forward_varlen(ctx, dout, dlse):
    if ctx.paged:
        raise NotSupportedError("hopattn: attention over paged K/V (page_table) is forward only; it has no backward")
    q, k, v, out, lse, cu_q, cu_k, used_q, used_k, sink = ctx.saved_tensors
    dq, dk, dv, dsink = torch.ops.hopattn.backward_varlen(
        dout, q, k, v, out, lse, cu_q, cu_k, used_q, used_k, *ctx.params, sink, ctx.softcap
    )
    return (dq, dk, dv) + (None,) * 14 + (dsink if sink is not None else None, None) + (None,) * _FP8_ARGUMENTS


_forward_varlen_op.register_autograd(_backward_forward_varlen, setup_context=_setup_forward_varlen)


# --- eager path -----------------------------------------------------------------------------------


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, window_left, window_right, deterministic, num_splits, pack_gqa,
                sink, softcap, q_descale, k_descale, v_descale, out_dtype):  # fmt: skip
        out, lse = forward_impl(
            q, k, v, None, None, None, None, 0, 0, softmax_scale, causal, window_left, window_right, num_splits,
            pack_gqa, None, sink, softcap, q_descale, k_descale, v_descale, out_dtype,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.params = (softmax_scale, causal, window_left, window_right, deterministic)
        ctx.softcap = softcap
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no zero tensor for lse's (ignored) gradient
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        if dout is None:  # out did not reach the loss
            return (None,) * (12 + _FP8_ARGUMENTS)
        q, k, v, out, lse, sink = ctx.saved_tensors
        s, c, wl, wr, det = ctx.params
        dq, dk, dv, dsink = backward_impl(dout, q, k, v, out, lse, None, None, None, None, 0, 0, s, c, wl, wr, det,
                                          sink, ctx.softcap)  # fmt: skip
        return (dq, dk, dv) + (None,) * 7 + (dsink, None) + (None,) * _FP8_ARGUMENTS


class _AttentionVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, used_q, used_k, max_q, max_k, softmax_scale, causal, wl, wr, det, splits,
                pack, sink, softcap, q_descale, k_descale, v_descale, out_dtype):  # fmt: skip
        out, lse = forward_impl(
            q, k, v, cu_q, cu_k, used_q, used_k, max_q, max_k, softmax_scale, causal, wl, wr, splits, pack, None, sink,
            softcap, q_descale, k_descale, v_descale, out_dtype,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, used_q, used_k, sink)
        ctx.params = (max_q, max_k, softmax_scale, causal, wl, wr, det)
        ctx.softcap = softcap
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        if dout is None:
            return (None,) * (18 + _FP8_ARGUMENTS)
        q, k, v, out, lse, cu_q, cu_k, used_q, used_k, sink = ctx.saved_tensors
        max_q, max_k, s, c, wl, wr, det = ctx.params
        dq, dk, dv, dsink = backward_impl(dout, q, k, v, out, lse, cu_q, cu_k, used_q, used_k, max_q, max_k, s, c, wl,
                                          wr, det, sink, ctx.softcap)  # fmt: skip
        return (dq, dk, dv) + (None,) * 13 + (dsink, None) + (None,) * _FP8_ARGUMENTS


def _use_ops(*tensors) -> bool:
    """Whether to go through the torch.library operators: while compiling or tracing (fake tensors,
    tensor subclasses, dispatch modes), where only operators are seen, and for meta tensors (their
    shapes come from the fake implementations)."""
    if torch.compiler.is_compiling():
        return True
    if _len_dispatch_modes is not None and _len_dispatch_modes() > 0:
        return True
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, Tensor):
            return False  # the eager path's checks reject it with a TypeError
        # nn.Parameter (a learned sink) is a plain tensor for this purpose: the eager path is faster.
        if type(t) not in (Tensor, torch.nn.Parameter) or t.device.type == "meta":
            return True
    return False


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


# --- public functions -----------------------------------------------------------------------------


def _pack_gqa_code(pack_gqa) -> int:
    """The C ABI's pack_gqa: -1 chosen by the library (None), 0 off, 1 on."""
    return _capi.PACK_GQA_AUTO if pack_gqa is None else int(bool(pack_gqa))


def _scale(softmax_scale) -> float:
    # 0 is the library's "default" (1/sqrt(head_dim)); None means the same.
    return 0.0 if softmax_scale is None else float(softmax_scale)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    deterministic: bool = False,
    return_lse: bool = False,
    num_splits: int = 0,
    pack_gqa: Optional[bool] = None,
    learnable_sink: Optional[Tensor] = None,
    softcap: float = 0.0,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
):
    """Exact attention softmax(scale * Q K^T + mask) V on a Hopper GPU, differentiable in q, k, v
    (and learnable_sink) but for FP8 inputs.

    Args:
        q: (batch, seqlen_q, heads, head_dim), float16 or bfloat16 (or float8_e4m3fn, forward
            only: see q_descale), on a CUDA (sm_90) device.
        k: (batch, seqlen_k, heads_kv, head_dim); v: (batch, seqlen_k, heads_kv, head_dim_v), same
            dtype and device. heads must be a multiple of heads_kv: query head h reads key/value
            head h // (heads // heads_kv) (GQA; MQA when heads_kv == 1). head_dim and head_dim_v
            (V's own head dim, out's too: smaller than, equal to or larger than head_dim, e.g.
            DeepSeek's 192 and 128) are each a multiple of 8 in [8, 256].
            Strided views are accepted as they are (no copy) when the last dimension is contiguous,
            every other stride is a multiple of 8 elements and the data is 16-byte aligned, for
            example q, k, v sliced out of one packed qkv tensor; anything else raises ValueError.
        softmax_scale: None (or 0) for 1/sqrt(head_dim) (q's).
        causal: mask future keys; the mask is aligned to the bottom right when seqlen_q != seqlen_k.
        window_size: (left, right) sliding window, -1 for unbounded on that side. With
            shift = seqlen_k - seqlen_q, query i sees key j iff
            i + shift - left <= j <= i + shift + right. causal=True is right = 0 (left stays, so
            causal with left >= 0 is a causal sliding window); causal with right > 0 is rejected.
            A query that sees no key gets out = 0 and lse = -inf (lse = the sink with
            learnable_sink).
        deterministic: bitwise-reproducible backward.
        return_lse: also return the log-sum-exp.
        num_splits: the forward's key splits per query tile (decode): 0 lets the library choose,
            1 never splits, n > 1 splits into up to n pieces. Results agree within rounding and
            repeat bitwise whatever it is.
        pack_gqa: whether the forward packs a GQA group's query heads into one tile (decode);
            None lets the library choose.
        learnable_sink: optional attention sinks (gpt-oss; FlashAttention-4's argument of this
            name): float32 (heads,) on q's device, one logit per query head that joins every
            row's softmax denominator without a value and without softmax_scale, so out shrinks
            by the sink's share: out_i = sum_j p_ij v_j with
            p_ij = exp(s_ij) / (exp(sink_h) + sum_j' exp(s_ij')). Differentiable: its gradient is
            summed over the batch and the query rows (bitwise the same on every run).
        softcap: score softcapping (Gemma 2; FlashAttention's argument of this name): a float
            > 0 caps every score at s_ij = softcap * tanh(scale * q_i . k_j / softcap) before the
            mask and the softmax (the gradients follow the cap); 0 (the default) leaves the scores
            alone. Negative, NaN or infinite caps raise ValueError.
        q_descale, k_descale, v_descale: FP8 inputs (q, k, v all torch.float8_e4m3fn;
            FlashAttention-3's arguments of these names): optional float32 (batch, heads_kv)
            descale factors on q's device; an element of batch b and KV head g stands for element * descale[b, g] (q's
            heads take their KV head's), None means 1. FP8 head dims are multiples of 16. FP8 has a
            forward only: a backward through it raises NotImplementedError.
        out_dtype: out's dtype for FP8 inputs, torch.bfloat16 (None, FlashAttention-3's) or
            torch.float16; 16-bit inputs give out in their own dtype.

    Returns:
        out, (batch, seqlen_q, heads, head_dim_v) in q's dtype (out_dtype for FP8); with
        return_lse=True the pair (out, lse), lse float32 of shape (batch, heads, seqlen_q) (note:
        heads before seqlen), natural log of sum_j exp(s_ij) over visible keys,
        s_ij = scale * q_i . k_j (capped with softcap), plus exp(sink) with learnable_sink. lse is
        not differentiable (a gradient flowing into it is ignored).

    Raises:
        TypeError (ArgumentTypeError) for non-tensors or wrong dtypes; ValueError
        (InvalidArgumentError) for bad shapes, strides, masks, CPU tensors or tensors on different
        devices; RuntimeError (DeviceUnavailableError) when the device is not a Hopper GPU;
        NotImplementedError (NotSupportedError) when this build has no kernel for the head dim or
        dtype. Messages are the library's and name the argument and the rule.
    """
    window_left, window_right = _window(window_size)
    scale = _scale(softmax_scale)
    softcap = _softcap(softcap)
    layout = (int(num_splits), _pack_gqa_code(pack_gqa))
    args = (q, k, v, scale, bool(causal), window_left, window_right, bool(deterministic))
    fp8 = (q_descale, k_descale, v_descale, out_dtype)
    if _use_ops(q, k, v, learnable_sink, q_descale, k_descale, v_descale):
        out, lse = torch.ops.hopattn.forward(*args, *layout, learnable_sink, softcap, *fp8)
    elif _needs_grad(q, k, v, learnable_sink):
        out, lse = _Attention.apply(*args, *layout, learnable_sink, softcap, *fp8)
    else:
        out, lse = forward_impl(q, k, v, None, None, None, None, 0, 0, scale, causal, window_left, window_right, *layout,
                                None, learnable_sink, softcap, *fp8, with_lse=return_lse)
    return (out, lse) if return_lse else out


def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    seqused_q: Optional[Tensor] = None,
    seqused_k: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    deterministic: bool = False,
    return_lse: bool = False,
    num_splits: int = 0,
    pack_gqa: Optional[bool] = None,
    page_table: Optional[Tensor] = None,
    learnable_sink: Optional[Tensor] = None,
    softcap: float = 0.0,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
):
    """Attention over a packed batch of variable-length sequences; differentiable in q, k, v (and
    learnable_sink) but for FP8 inputs.

    Args:
        q: (total_q, heads, head_dim); k: (total_k, heads_kv, head_dim); v: (total_k, heads_kv,
            head_dim_v); dtypes, head dims, GQA and strides as in attention().
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) prefix sums on q's device: sequence b holds
            tokens [cu_seqlens[b], cu_seqlens[b + 1]). Sequences of length 0 are allowed.
        max_seqlen_q, max_seqlen_k: Python ints, at least every sequence's length (ints, not
            tensors, so that nothing synchronises and torch.compile needs no .item()).
        seqused_q, seqused_k: optional int32 (batch,): how many tokens of each sequence are real;
            the rest are neither read nor attended to.
        softmax_scale, causal, window_size, deterministic: as in attention(), with the mask
            aligned per sequence (shift = len_k(b) - len_q(b)).
        num_splits, pack_gqa: as in attention(); the split layout depends only on the shapes and
            max_seqlen_*, so a captured graph serves any seqused_k.
        page_table: optional int32 (batch, max_pages): paged K/V (chunked prefill against a paged
            KV cache). k and v are then (num_pages, page_size, heads_kv, head_dim) (head_dim_v for
            v), key j of sequence b is row j % page_size of page page_table[b, j // page_size],
            cu_seqlens_k must be None and seqused_k gives each sequence's key count (default: all
            max_pages * page_size; max_seqlen_k is not used). Forward only: NotImplementedError
            when a gradient is asked for.
        learnable_sink: optional float32 (heads,) attention sinks, as in attention().
        softcap: score softcapping, as in attention().
        q_descale, k_descale, v_descale, out_dtype: FP8 inputs, as in attention(); the descales
            are (batch, heads_kv), a row per sequence. Not with page_table yet (NotImplementedError).

    Returns:
        out (total_q, heads, head_dim_v), or (out, lse) with return_lse=True, lse float32 of shape
        (heads, total_q) (heads first, tokens packed as in q). Rows that belong to no sequence or
        lie beyond seqused get out = 0 and lse = -inf, like rows that see no key (whose lse is the
        sink with learnable_sink), and zero gradients.

    Raises:
        As attention(); also TypeError when cu_seqlens/seqused are not int32 or max_seqlen is not
        a Python int.
    """
    window_left, window_right = _window(window_size)
    if page_table is None and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ArgumentTypeError("attention_varlen needs cu_seqlens_q and cu_seqlens_k (int32 tensors); "
                                "for fixed-length batches use attention()")
    if page_table is not None:
        if cu_seqlens_q is None:
            raise ArgumentTypeError("attention_varlen needs cu_seqlens_q (an int32 tensor), also with page_table")
        if cu_seqlens_k is not None:
            raise InvalidArgumentError("cu_seqlens_k must be None with page_table: the page table locates each "
                                       "sequence's keys and seqused_k counts them")
        if _needs_grad(q, k, v, learnable_sink):
            raise NotSupportedError("hopattn: attention over paged K/V (page_table) is forward only; call it under "
                                    "torch.no_grad() or on tensors that do not require grad")
    _check_max_seqlens(max_seqlen_q, max_seqlen_k)  # before the dispatcher, which would convert a tensor
    scale = _scale(softmax_scale)
    softcap = _softcap(softcap)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, scale,
            bool(causal), window_left, window_right)  # fmt: skip
    layout = (int(num_splits), _pack_gqa_code(pack_gqa))
    fp8 = (q_descale, k_descale, v_descale, out_dtype)
    if _use_ops(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, page_table, learnable_sink, q_descale,
                k_descale, v_descale):  # fmt: skip
        out, lse = torch.ops.hopattn.forward_varlen(*args, bool(deterministic), *layout, page_table, learnable_sink,
                                                    softcap, *fp8)  # fmt: skip
    elif _needs_grad(q, k, v, learnable_sink):
        out, lse = _AttentionVarlen.apply(*args, bool(deterministic), *layout, learnable_sink, softcap, *fp8)
    else:
        out, lse = forward_impl(*args, *layout, page_table, learnable_sink, softcap, *fp8, with_lse=return_lse)
    return (out, lse) if return_lse else out


def attention_with_kvcache(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k: Optional[Tensor] = None,
    v: Optional[Tensor] = None,
    *,
    rotary_cos: Optional[Tensor] = None,
    rotary_sin: Optional[Tensor] = None,
    cache_seqlens=None,
    cache_batch_idx: Optional[Tensor] = None,
    cache_leftpad: Optional[Tensor] = None,
    page_table: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k_new: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    rotary_seqlens: Optional[Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    rotary_interleaved: bool = True,
    num_splits: int = 0,
    pack_gqa: Optional[bool] = None,
    return_lse: bool = False,
    learnable_sink: Optional[Tensor] = None,
    softcap: float = 0.0,
    q_descale: Optional[Tensor] = None,
    k_descale: Optional[Tensor] = None,
    v_descale: Optional[Tensor] = None,
):
    """One inference step against a KV cache (FlashAttention-3's flash_attn_with_kvcache): the new
    keys and values k, v (if given) are written into the cache at cache_seqlens, in place, rotary
    embedding applied to them and to q (if rotary_cos/rotary_sin are given), then q attends to each
    sequence's cache [cache_leftpad[b], cache_seqlens[b] + new keys). Forward only, as in
    FlashAttention-3: there is no backward. See docs/semantics.md, "KV caches".

    Args:
        q: (batch, seqlen_q, heads, head_dim), or (total_q, heads, head_dim) with cu_seqlens_q;
            float16 or bfloat16 on a CUDA (sm_90) device.
        k_cache, v_cache: (cache_rows, capacity, heads_kv, head_dim), or with page_table
            (num_pages, page_size, heads_kv, head_dim), q's dtype; v_cache with head_dim_v (V's own
            head dim, as in attention()) in place of head_dim. Updated in place where k and v are
            given. Any page_size >= 1.
        k, v: optional new keys and values, (batch, seqlen_new, heads_kv, head_dim), or
            (total_new, heads_kv, head_dim) with cu_seqlens_k_new; v with head_dim_v. Both or
            neither.
        rotary_cos, rotary_sin: optional (max_position, rotary_dim / 2) of q's dtype, rotary_dim a
            multiple of 16 up to head_dim (q's and k's; v is not rotated); need k and v. New key t
            of sequence b is rotated at position rotary_seqlens[b] + t (default
            cache_seqlens[b] + t); query i at that start + i under a causal or local mask, at the
            start itself otherwise.
        cache_seqlens: int32 (batch,) tokens in each sequence's cache before this call; a Python
            int for all sequences; None for full caches (capacity tokens: k_cache.shape[1], or
            page_table.shape[1] * page_size), which then take no new keys.
        cache_batch_idx: optional int32 (batch,): the cache row (page table row) of sequence b.
        cache_leftpad: optional int32 (batch,): the first cache position of sequence b.
        page_table: optional int32 (rows, max_pages): a paged cache; position j of row r is row
            j % page_size of page page_table[r, j // page_size].
        cu_seqlens_q, max_seqlen_q: varlen queries (chunked prefill): int32 (batch + 1,) prefix
            sums and a Python int at least every query sequence's length.
        cu_seqlens_k_new: optional int32 (batch + 1,) prefix sums of the new keys per sequence.
        softmax_scale, causal, window_size, num_splits, pack_gqa: as in attention(), the mask
            aligned to each sequence's keys [cache_leftpad[b], cache_seqlens[b] + new keys).
        rotary_interleaved: True rotates pairs (2i, 2i + 1) (GPT-J), False (i, i + rotary_dim / 2)
            (GPT-NeoX).
        return_lse: also return the log-sum-exp.
        learnable_sink: optional float32 (heads,) attention sinks, as in attention() (no
            gradient: this call is forward only).
        softcap: score softcapping, as in attention().
        q_descale, k_descale, v_descale: an FP8 cache's descale factors, as in attention(): q,
            k_cache and v_cache (and k, v) in torch.float8_e4m3fn, out bfloat16. Not with rotary
            embedding, softcap or cache_leftpad, and pages must hold a multiple of 128 keys (FP8
            caches raise NotSupportedError for these).

    Returns:
        out like q but with v_cache's head_dim_v (bfloat16 for an FP8 cache), or (out, lse) with return_lse=True, lse float32
        (batch, heads, seqlen_q), or (heads, total_q) with cu_seqlens_q. A sequence whose indices
        (cache_seqlens, pages, cache_batch_idx, rotary positions) only the device can find invalid
        gets NaN rows.

    Raises:
        As attention(); also TypeError when index arrays are not int32 or max_seqlen_q is not a
        Python int, and ValueError for k without v, rotary_cos without rotary_sin, or new keys
        for full caches (cache_seqlens=None).
    """
    window_left, window_right = _window(window_size)
    if _needs_grad(learnable_sink):
        raise NotSupportedError("hopattn: attention_with_kvcache is forward only; learnable_sink gets no gradient "
                                "here (call it under torch.no_grad() or with a sink that does not require grad)")
    if cu_seqlens_q is not None:
        _check_max_seqlens(max_seqlen_q, 0)  # before the dispatcher, which would convert a tensor
    else:
        max_seqlen_q = 0
    if cache_seqlens is None or (isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool)):
        cache_seqlens = _cache_seqlens_tensor(q, k_cache, k, cache_seqlens, page_table, cu_seqlens_q)
    args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
            page_table, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, rotary_seqlens, _scale(softmax_scale),
            bool(causal), window_left, window_right, bool(rotary_interleaved), int(num_splits),
            _pack_gqa_code(pack_gqa), learnable_sink, _softcap(softcap), q_descale, k_descale, v_descale)  # fmt: skip
    if _use_ops(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                page_table, cu_seqlens_q, cu_seqlens_k_new, rotary_seqlens, learnable_sink, q_descale, k_descale,
                v_descale):  # fmt: skip
        out, lse = torch.ops.hopattn.forward_kvcache(*args)
    else:
        out, lse = forward_kvcache_impl(*args, with_lse=return_lse)
    return (out, lse) if return_lse else out


def _cache_seqlens_tensor(q, k_cache, k, cache_seqlens: Optional[int], page_table, cu_seqlens_q) -> Tensor:
    """cache_seqlens given as one int for every sequence, or None for full caches, as the int32
    (batch,) tensor the library reads (FlashAttention-3 makes the same tensor)."""
    for name, t in (("q", q), ("k_cache", k_cache)):
        if not isinstance(t, Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if cu_seqlens_q is not None:
        _check_index_array("cu_seqlens_q", cu_seqlens_q, q.device)
        batch = cu_seqlens_q.shape[0] - 1
    else:
        batch = q.shape[0]
    if cache_seqlens is None:
        if k is not None:
            raise InvalidArgumentError("cache_seqlens is None (every cache is full) but k/v are given; pass "
                                       "cache_seqlens, the tokens each cache holds before the new ones")
        if page_table is not None:
            _check_index_array("page_table", page_table, q.device, dims=2)
            cache_seqlens = page_table.shape[1] * k_cache.shape[1]
        else:
            cache_seqlens = k_cache.shape[1]
    return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
