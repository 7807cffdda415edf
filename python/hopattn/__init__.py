"""hopattn: exact fused attention (forward and backward) for NVIDIA Hopper GPUs, from PyTorch.

    import hopattn
    out = hopattn.attention(q, k, v, causal=True)          # q, k, v: (batch, seqlen, heads, head_dim)
    out, lse = hopattn.attention(q, k, v, return_lse=True)  # lse: (batch, heads, seqlen_q), float32
    out = hopattn.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out = hopattn.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens)  # decode step

For FlashAttention-3 users, `from hopattn import flash_attn_func, flash_attn_varlen_func,
flash_attn_with_kvcache` takes the place of `from flash_attn_interface import ...` (same argument
names and return values).

The package binds the library's C ABI with ctypes: no PyTorch C++ headers at build time and no
CPython extension, so one built package works with any Python 3 and any PyTorch >= 2.4. Importing
needs neither PyTorch nor a GPU; calling needs both (PyTorch >= 2.4 and a Hopper GPU, sm_90), and
says which is missing. Errors raise the library's message (see HopattnError and its subclasses,
which are also ValueError, TypeError or RuntimeError).
"""

from ._capi import (
    ArgumentTypeError,
    CudaError,
    DeviceUnavailableError,
    HopattnError,
    InvalidArgumentError,
    NotSupportedError,
    library_path,
    library_version,
)

try:
    from ._version import __version__
except ImportError:  # running from the source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "attention",
    "attention_varlen",
    "attention_with_kvcache",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "HopattnError",
    "InvalidArgumentError",
    "ArgumentTypeError",
    "NotSupportedError",
    "DeviceUnavailableError",
    "CudaError",
    "library_path",
    "library_version",
    "torch_available",
    "__version__",
]

MIN_TORCH = (2, 4)


def _torch_problem():
    """Why the PyTorch functions cannot be used here (None when they can)."""
    try:
        import torch
    except ImportError as e:
        return f"PyTorch is not installed ({e}); hopattn's functions need PyTorch >= 2.4"
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    if version < MIN_TORCH or not hasattr(torch.library, "custom_op"):
        return f"PyTorch {torch.__version__} is too old; hopattn's functions need PyTorch >= 2.4"
    return None


_TORCH_PROBLEM = _torch_problem()


def torch_available() -> bool:
    """Whether a usable PyTorch (>= 2.4) was found at import."""
    return _TORCH_PROBLEM is None


if _TORCH_PROBLEM is None:
    from ._torch import attention, attention_varlen, attention_with_kvcache
    from .flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
else:

    def _unavailable(name):
        def function(*args, **kwargs):
            raise ImportError(f"hopattn.{name}: {_TORCH_PROBLEM}")

        function.__name__ = name
        function.__doc__ = f"Unavailable: {_TORCH_PROBLEM}."
        return function

    attention = _unavailable("attention")
    attention_varlen = _unavailable("attention_varlen")
    attention_with_kvcache = _unavailable("attention_with_kvcache")
    flash_attn_func = _unavailable("flash_attn_func")
    flash_attn_varlen_func = _unavailable("flash_attn_varlen_func")
    flash_attn_with_kvcache = _unavailable("flash_attn_with_kvcache")
