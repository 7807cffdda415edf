"""The C ABI of libhopattn (include/hopattn/hopattn.h) through ctypes. Needs no PyTorch.

Why ctypes and not a compiled extension: the library already has a C ABI, so binding it needs no
PyTorch C++ headers at build time and no CPython extension module. The wheel holds one plain shared
library (no CPython-version tag), and the same package works with any Python 3 and any
PyTorch >= 2.4, which is what lets a package built on one machine run on another whose Python and
PyTorch differ.

The argument structs are declared twice, on purpose: as ctypes.Structure (the layout, checked
against the C compiler's offsets by the tests) and as a `struct` format that packs all fields of a
call in one C-level call; filling a ctypes.Structure field by field costs several microseconds
per call. The two are checked against each other below, at import.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from pathlib import Path

__all__ = [
    "HopattnError",
    "InvalidArgumentError",
    "NotSupportedError",
    "DeviceUnavailableError",
    "CudaError",
    "ArgumentTypeError",
    "library",
    "library_path",
    "library_version",
]

# hopattn_status
OK = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_NOT_SUPPORTED = 2
ERROR_DEVICE_UNAVAILABLE = 3
ERROR_CUDA = 4

# hopattn_dtype
FLOAT16 = 0
BFLOAT16 = 1
FLOAT32 = 2
FLOAT8_E4M3 = 3

MAX_RANK = 4


class HopattnError(Exception):
    """Base of every error hopattn raises; `code` is the library's hopattn_status (0 for errors
    found in Python before the library was called) and `message` the library's message."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.message = message
        self.code = code


class InvalidArgumentError(HopattnError, ValueError):
    """HOPATTN_ERROR_INVALID_ARGUMENT: an argument breaks a documented rule (shape, stride,
    alignment, mask, device placement); the message names the argument and the rule."""


class ArgumentTypeError(HopattnError, TypeError):
    """An argument has the wrong type or dtype (not a tensor, float32 inputs, int64 cu_seqlens)."""


class NotSupportedError(HopattnError, NotImplementedError):
    """HOPATTN_ERROR_NOT_SUPPORTED: valid, but this build or device cannot run it (for example a
    head dim whose kernel this build did not compile). NotImplementedError is a RuntimeError."""


class DeviceUnavailableError(HopattnError, RuntimeError):
    """HOPATTN_ERROR_DEVICE_UNAVAILABLE: no CUDA device, or not a Hopper (sm_90) GPU."""


class CudaError(HopattnError, RuntimeError):
    """HOPATTN_ERROR_CUDA: the CUDA runtime reported an error."""


_ERRORS = {
    ERROR_INVALID_ARGUMENT: InvalidArgumentError,
    ERROR_NOT_SUPPORTED: NotSupportedError,
    ERROR_DEVICE_UNAVAILABLE: DeviceUnavailableError,
    ERROR_CUDA: CudaError,
}


# --- struct layouts (mirror hopattn.h field by field) ---------------------------------------------


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_RANK),
        ("stride", ctypes.c_int64 * MAX_RANK),
    ]


class IntArray(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_int64)]


class Varlen(ctypes.Structure):
    _fields_ = [
        ("cu_seqlens_q", IntArray),
        ("cu_seqlens_k", IntArray),
        ("seqused_q", IntArray),
        ("seqused_k", IntArray),
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
    ]


class PageTable(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("max_pages", ctypes.c_int64),
        ("row_stride", ctypes.c_int64),
    ]


class Rotary(ctypes.Structure):
    _fields_ = [
        ("cos", Tensor),
        ("sin", Tensor),
        ("interleaved", ctypes.c_int32),
        ("positions", IntArray),
    ]


class ForwardArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("o", Tensor),
        ("lse", Tensor),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("varlen", Varlen),
        ("num_splits", ctypes.c_int32),
        ("pack_gqa", ctypes.c_int32),
        ("page_table", PageTable),
        ("sinks", Tensor),
        ("softcap", ctypes.c_float),
        ("q_descale", Tensor),
        ("k_descale", Tensor),
        ("v_descale", Tensor),
    ]


class BackwardArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("o", Tensor),
        ("lse", Tensor),
        ("dout", Tensor),
        ("dq", Tensor),
        ("dk", Tensor),
        ("dv", Tensor),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("varlen", Varlen),
        ("deterministic", ctypes.c_int32),
        ("sinks", Tensor),
        ("dsinks", Tensor),
        ("softcap", ctypes.c_float),
    ]


class KVCacheArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("q", Tensor),
        ("k_cache", Tensor),
        ("v_cache", Tensor),
        ("page_table", PageTable),
        ("cache_seqlens", IntArray),
        ("cache_batch_idx", IntArray),
        ("cache_leftpad", IntArray),
        ("k_new", Tensor),
        ("v_new", Tensor),
        ("cu_seqlens_new", IntArray),
        ("rotary", Rotary),
        ("cu_seqlens_q", IntArray),
        ("max_seqlen_q", ctypes.c_int32),
        ("o", Tensor),
        ("lse", Tensor),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        ("pack_gqa", ctypes.c_int32),
        ("sinks", Tensor),
        ("softcap", ctypes.c_float),
        ("q_descale", Tensor),
        ("k_descale", Tensor),
        ("v_descale", Tensor),
    ]


# The same layouts as `struct` formats (native alignment, like the C compiler's), padded at the end
# to the struct's size so that the library may read struct_size bytes.
_TENSOR_FMT = "P2i4q4q"
_INT_ARRAY_FMT = "Pq"
_VARLEN_FMT = _INT_ARRAY_FMT * 4 + "2i"
_COMMON_TAIL_FMT = "f3i" + _VARLEN_FMT
_PAGE_TABLE_FMT = "P3q"
_ROTARY_FMT = _TENSOR_FMT * 2 + "i" + _INT_ARRAY_FMT
# q, k_cache, v_cache, page_table, cache_seqlens, cache_batch_idx, cache_leftpad: the cache.
_KVCACHE_CACHE_FMT = "N" + _TENSOR_FMT * 3 + _PAGE_TABLE_FMT + _INT_ARRAY_FMT * 3
# k_new, v_new, cu_seqlens_new, rotary, cu_seqlens_q, max_seqlen_q: the append and the queries.
_KVCACHE_APPEND_FMT = _TENSOR_FMT * 2 + _INT_ARRAY_FMT + _ROTARY_FMT + _INT_ARRAY_FMT + "i"


def _padded(fmt: str, ctype) -> struct.Struct:
    pad = ctypes.sizeof(ctype) - struct.calcsize("@" + fmt)
    if pad < 0:
        raise ImportError(f"hopattn: the struct format of {ctype.__name__} is larger than the C struct")
    return struct.Struct("@" + fmt + (f"{pad}x" if pad else ""))


# q..lse, the common tail, num_splits and pack_gqa, page_table, sinks, softcap, q/k/v_descale.
_FORWARD_FMT = "N" + _TENSOR_FMT * 5 + _COMMON_TAIL_FMT + "2i" + _PAGE_TABLE_FMT + _TENSOR_FMT + "f" + _TENSOR_FMT * 3
_FORWARD = _padded(_FORWARD_FMT, ForwardArgs)
_BACKWARD = _padded("N" + _TENSOR_FMT * 9 + _COMMON_TAIL_FMT + "i" + _TENSOR_FMT * 2 + "f", BackwardArgs)
_KVCACHE = _padded(
    _KVCACHE_CACHE_FMT + _KVCACHE_APPEND_FMT + _TENSOR_FMT * 2 + "f5i" + _TENSOR_FMT + "f" + _TENSOR_FMT * 3, KVCacheArgs
)
FORWARD_ARGS_SIZE = ctypes.sizeof(ForwardArgs)
BACKWARD_ARGS_SIZE = ctypes.sizeof(BackwardArgs)
KVCACHE_ARGS_SIZE = ctypes.sizeof(KVCacheArgs)


def _check_layouts() -> None:
    """The struct formats must put every field where ctypes (the C layout) does."""

    def offset_of(fmt_prefix: str) -> int:
        return struct.calcsize("@" + fmt_prefix)

    tensor = _TENSOR_FMT
    expected = {
        ForwardArgs: [
            ("q", "N"),
            ("lse", "N" + tensor * 4),
            ("softmax_scale", "N" + tensor * 5),
            ("varlen", "N" + tensor * 5 + "f3i"),
            ("num_splits", "N" + tensor * 5 + _COMMON_TAIL_FMT),
            ("pack_gqa", "N" + tensor * 5 + _COMMON_TAIL_FMT + "i"),
            ("page_table", "N" + tensor * 5 + _COMMON_TAIL_FMT + "2i"),
            ("sinks", "N" + tensor * 5 + _COMMON_TAIL_FMT + "2i" + _PAGE_TABLE_FMT + "0P"),
            ("softcap", "N" + tensor * 5 + _COMMON_TAIL_FMT + "2i" + _PAGE_TABLE_FMT + "0P" + tensor),
            ("q_descale", _FORWARD_FMT[: -len(tensor) * 3] + "0P"),
            ("v_descale", _FORWARD_FMT[: -len(tensor)] + "0P"),
        ],
        BackwardArgs: [
            ("dv", "N" + tensor * 8),
            ("softmax_scale", "N" + tensor * 9),
            ("varlen", "N" + tensor * 9 + "f3i"),
            ("deterministic", "N" + tensor * 9 + _COMMON_TAIL_FMT),
            ("sinks", "N" + tensor * 9 + _COMMON_TAIL_FMT + "i0P"),
            ("dsinks", "N" + tensor * 9 + _COMMON_TAIL_FMT + "i0P" + tensor),
            ("softcap", "N" + tensor * 9 + _COMMON_TAIL_FMT + "i0P" + tensor * 2),
        ],
        KVCacheArgs: [
            ("page_table", "N" + tensor * 3),
            ("cache_leftpad", "N" + tensor * 3 + _PAGE_TABLE_FMT + _INT_ARRAY_FMT * 2),
            ("k_new", _KVCACHE_CACHE_FMT),
            ("rotary", _KVCACHE_CACHE_FMT + tensor * 2 + _INT_ARRAY_FMT),
            ("cu_seqlens_q", _KVCACHE_CACHE_FMT + tensor * 2 + _INT_ARRAY_FMT + _ROTARY_FMT),
            ("max_seqlen_q", _KVCACHE_CACHE_FMT + _KVCACHE_APPEND_FMT[:-1]),
            ("o", _KVCACHE_CACHE_FMT + _KVCACHE_APPEND_FMT + "0P"),  # "0P": the padding before a pointer
            ("softmax_scale", _KVCACHE_CACHE_FMT + _KVCACHE_APPEND_FMT + tensor * 2),
            ("num_splits", _KVCACHE_CACHE_FMT + _KVCACHE_APPEND_FMT + tensor * 2 + "f3i"),
            ("pack_gqa", _KVCACHE_CACHE_FMT + _KVCACHE_APPEND_FMT + tensor * 2 + "f4i"),
            ("sinks", _KVCACHE_CACHE_FMT + _KVCACHE_APPEND_FMT + tensor * 2 + "f5i0P"),
            ("softcap", _KVCACHE_CACHE_FMT + _KVCACHE_APPEND_FMT + tensor * 2 + "f5i0P" + tensor),
        ],
        Rotary: [("interleaved", tensor * 2), ("positions", tensor * 2 + "i0P")],
    }
    for ctype, fields in expected.items():
        for name, prefix in fields:
            if getattr(ctype, name).offset != offset_of(prefix):
                raise ImportError(f"hopattn: {ctype.__name__}.{name} offset mismatch between ctypes and struct")
    if _FORWARD.size != FORWARD_ARGS_SIZE or _BACKWARD.size != BACKWARD_ARGS_SIZE or _KVCACHE.size != KVCACHE_ARGS_SIZE:
        raise ImportError("hopattn: argument struct size mismatch between ctypes and struct")


_check_layouts()

_ZEROS = ((0, 0, 0, 0), (0, 0, 0), (0, 0), (0,), ())


def tensor_fields(data: int, dtype: int, shape, stride) -> tuple:
    """The 10 packed values of one hopattn_tensor (shape and stride padded with zeros)."""
    pad = _ZEROS[len(shape)]
    return (data, dtype, len(shape), *shape, *pad, *stride, *pad)


EMPTY_TENSOR = tensor_fields(0, BFLOAT16, (), ())
EMPTY_VARLEN = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
EMPTY_INT_ARRAY = (0, 0)
EMPTY_PAGE_TABLE = (0, 0, 0, 0)
EMPTY_ROTARY = (*EMPTY_TENSOR, *EMPTY_TENSOR, 0, *EMPTY_INT_ARRAY)
PACK_GQA_AUTO = -1


def pack_forward(
    q, k, v, o, lse, softmax_scale, causal, window_left, window_right, varlen=EMPTY_VARLEN, num_splits=0,
    pack_gqa=PACK_GQA_AUTO, page_table=EMPTY_PAGE_TABLE, sinks=EMPTY_TENSOR, softcap=0.0, q_descale=EMPTY_TENSOR,
    k_descale=EMPTY_TENSOR, v_descale=EMPTY_TENSOR,
) -> bytes:  # fmt: skip
    """hopattn_forward_args as bytes: q..lse are tensor_fields() tuples, varlen 10 values
    (cu_seqlens_q ptr, size, cu_seqlens_k ptr, size, seqused_q ptr, size, seqused_k ptr, size,
    max_seqlen_q, max_seqlen_k); num_splits (0: chosen) and pack_gqa (-1: chosen, 0: off, 1: on)
    as in hopattn.h; page_table 4 values (ptr, batch, max_pages, row_stride); sinks the
    tensor_fields() of the float32 (heads,) attention sinks (EMPTY_TENSOR: none); softcap the
    score cap (0.0: off); q/k/v_descale the tensor_fields() of FP8 inputs' float32
    (batch, heads_kv) descale factors (EMPTY_TENSOR: 1)."""
    return _FORWARD.pack(
        FORWARD_ARGS_SIZE, *q, *k, *v, *o, *lse, softmax_scale, causal, window_left, window_right, *varlen,
        num_splits, pack_gqa, *page_table, *sinks, softcap, *q_descale, *k_descale, *v_descale,
    )  # fmt: skip


def pack_kvcache(
    q, k_cache, v_cache, o, lse, softmax_scale, causal, window_left, window_right, *, cache_seqlens,
    page_table=EMPTY_PAGE_TABLE, cache_batch_idx=EMPTY_INT_ARRAY, cache_leftpad=EMPTY_INT_ARRAY,
    k_new=EMPTY_TENSOR, v_new=EMPTY_TENSOR, cu_seqlens_new=EMPTY_INT_ARRAY, rotary=EMPTY_ROTARY,
    cu_seqlens_q=EMPTY_INT_ARRAY, max_seqlen_q=0, num_splits=0, pack_gqa=PACK_GQA_AUTO, sinks=EMPTY_TENSOR,
    softcap=0.0, q_descale=EMPTY_TENSOR, k_descale=EMPTY_TENSOR, v_descale=EMPTY_TENSOR,
) -> bytes:  # fmt: skip
    """hopattn_kvcache_args as bytes: tensors are tensor_fields() tuples, index arrays (ptr, size)
    pairs, page_table, sinks, softcap and the descales as in pack_forward, rotary 23 values (cos
    and sin tensor_fields(), interleaved, positions ptr, size)."""
    return _KVCACHE.pack(
        KVCACHE_ARGS_SIZE, *q, *k_cache, *v_cache, *page_table, *cache_seqlens, *cache_batch_idx, *cache_leftpad,
        *k_new, *v_new, *cu_seqlens_new, *rotary, *cu_seqlens_q, max_seqlen_q, *o, *lse,
        softmax_scale, causal, window_left, window_right, num_splits, pack_gqa, *sinks, softcap,
        *q_descale, *k_descale, *v_descale,
    )  # fmt: skip


def pack_backward(
    q, k, v, o, lse, dout, dq, dk, dv, softmax_scale, causal, window_left, window_right, varlen, deterministic,
    sinks=EMPTY_TENSOR, dsinks=EMPTY_TENSOR, softcap=0.0,
) -> bytes:  # fmt: skip
    """hopattn_backward_args as bytes; see pack_forward. dsinks (the sinks' gradient, float32
    (heads,), written) comes with sinks, and only with them; softcap is the forward's."""
    return _BACKWARD.pack(
        BACKWARD_ARGS_SIZE,
        *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv,
        softmax_scale, causal, window_left, window_right, *varlen, deterministic, *sinks, *dsinks, softcap,
    )  # fmt: skip


# --- the library ----------------------------------------------------------------------------------

_LIBRARY_NAME = "libhopattn.so"
_lock = threading.Lock()
_library = None


def library_path() -> Path:
    """Where libhopattn.so is loaded from: $HOPATTN_LIBRARY if set (a build tree, say), else the
    copy installed inside this package."""
    override = os.environ.get("HOPATTN_LIBRARY")
    return Path(override) if override else Path(__file__).with_name(_LIBRARY_NAME)


def library() -> ctypes.CDLL:
    """The loaded library with its function prototypes (loaded on first use, so that importing
    hopattn never fails for lack of it)."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            path = library_path()
            if not path.is_file():
                raise ImportError(
                    f"hopattn: {path} does not exist. Install the package with `pip install .` from the "
                    "hopattn repository (it builds the library), or point HOPATTN_LIBRARY at a built "
                    "libhopattn.so (CMake target hopattn_shared)."
                )
            lib = ctypes.CDLL(str(path))
            lib.hopattn_forward.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
            lib.hopattn_forward.restype = ctypes.c_int
            if hasattr(lib, "hopattn_forward_workspace_size"):  # older libraries have none
                lib.hopattn_forward_workspace_size.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
                lib.hopattn_forward_workspace_size.restype = ctypes.c_int
                lib.hopattn_forward_with_workspace.argtypes = [
                    ctypes.c_char_p,
                    ctypes.c_void_p,
                    ctypes.c_size_t,
                    ctypes.c_void_p,
                ]
                lib.hopattn_forward_with_workspace.restype = ctypes.c_int
            if hasattr(lib, "hopattn_forward_kvcache"):  # older libraries have none
                kvcache_size = lib.hopattn_forward_kvcache_workspace_size
                kvcache_size.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
                kvcache_size.restype = ctypes.c_int
                lib.hopattn_forward_kvcache.argtypes = [
                    ctypes.c_char_p,
                    ctypes.c_void_p,
                    ctypes.c_size_t,
                    ctypes.c_void_p,
                ]
                lib.hopattn_forward_kvcache.restype = ctypes.c_int
                lib.hopattn_kvcache_args_init_sized.argtypes = [ctypes.POINTER(KVCacheArgs), ctypes.c_size_t]
                lib.hopattn_kvcache_args_init_sized.restype = None
            lib.hopattn_backward_workspace_size.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
            lib.hopattn_backward_workspace_size.restype = ctypes.c_int
            lib.hopattn_backward.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            lib.hopattn_backward.restype = ctypes.c_int
            lib.hopattn_last_error.argtypes = []
            lib.hopattn_last_error.restype = ctypes.c_char_p
            lib.hopattn_version.argtypes = []
            lib.hopattn_version.restype = ctypes.c_char_p
            for name, ctype in (
                ("hopattn_forward_args_init_sized", ForwardArgs),
                ("hopattn_backward_args_init_sized", BackwardArgs),
            ):
                if hasattr(lib, name):  # else _check_library_layout says the versions differ
                    init = getattr(lib, name)
                    init.argtypes = [ctypes.POINTER(ctype), ctypes.c_size_t]
                    init.restype = None
            _check_library_layout(lib)
            _library = lib
    return _library


def _check_library_layout(lib) -> None:
    """The library's *_args_init_sized must agree with this module about every default field, which
    catches a header that changed without this module (struct_size is the C sizeof)."""
    for name, ctype, size in (
        ("hopattn_forward_args_init_sized", ForwardArgs, FORWARD_ARGS_SIZE),
        ("hopattn_backward_args_init_sized", BackwardArgs, BACKWARD_ARGS_SIZE),
        ("hopattn_kvcache_args_init_sized", KVCacheArgs, KVCACHE_ARGS_SIZE),
    ):
        if not hasattr(lib, name):
            if ctype is KVCacheArgs:
                continue  # a library without the call (forward_kvcache then says so)
            raise ImportError(f"hopattn: the library has no {name}: it is older than this Python package")
        args = ctype()
        ctypes.memset(ctypes.byref(args), 0x5A, ctypes.sizeof(args))
        getattr(lib, name)(ctypes.byref(args), ctypes.sizeof(args))
        defaults_differ = args.window_left != -1 or args.window_right != -1 or args.causal != 0
        defaults_differ |= args.sinks.data is not None or args.sinks.rank != 0 or args.softcap != 0
        if ctype is BackwardArgs:
            defaults_differ |= args.dsinks.data is not None or args.dsinks.rank != 0
        else:
            defaults_differ |= args.num_splits != 0 or args.pack_gqa != PACK_GQA_AUTO
            defaults_differ |= args.page_table.data is not None or args.page_table.row_stride != 0
        if ctype is ForwardArgs:
            for descale in (args.q_descale, args.k_descale, args.v_descale):
                defaults_differ |= descale.data is not None or descale.rank != 0
        if args.struct_size != size or defaults_differ:
            raise ImportError(
                f"hopattn: {name} sets struct_size {args.struct_size} (Python expects {size}) or other defaults "
                "this module does not expect: the library and the Python package come from different versions"
            )


def library_version() -> str:
    """hopattn_version() of the loaded library."""
    return library().hopattn_version().decode()


def library_commit() -> str:
    """hopattn_build_commit() of the loaded library: the commit it was built from ("unknown" for a
    library that predates the function)."""
    function = getattr(library(), "hopattn_build_commit", None)
    if function is None:
        return "unknown"
    function.argtypes = []
    function.restype = ctypes.c_char_p
    return function().decode()


def last_error() -> str:
    return library().hopattn_last_error().decode(errors="replace")


def raise_for_status(status: int, what: str) -> None:
    """Raises the exception for a non-zero hopattn_status, with the library's message."""
    if status == OK:
        return
    message = last_error()
    error = _ERRORS.get(status)
    if error is None:
        raise HopattnError(f"{what}: unknown hopattn_status {status}: {message}", status)
    raise error(f"{what}: {message}", status)


def forward(args: bytes, stream: int) -> None:
    """hopattn_forward on packed arguments; raises on error."""
    lib = _library if _library is not None else library()
    status = lib.hopattn_forward(args, stream)
    if status:
        raise_for_status(status, "hopattn forward")


def forward_workspace_size(args: bytes) -> int:
    """hopattn_forward_workspace_size (the current CUDA device's; 0 for a library without the
    function); raises on error."""
    lib = _library if _library is not None else library()
    if not hasattr(lib, "hopattn_forward_workspace_size"):
        return 0
    size = ctypes.c_size_t(0)
    status = lib.hopattn_forward_workspace_size(args, ctypes.byref(size))
    if status:
        raise_for_status(status, "hopattn forward")
    return size.value


def forward_with_workspace(args: bytes, workspace: int, workspace_bytes: int, stream: int) -> None:
    lib = _library if _library is not None else library()
    status = lib.hopattn_forward_with_workspace(args, workspace, workspace_bytes, stream)
    if status:
        raise_for_status(status, "hopattn forward")


def _kvcache_library():
    lib = _library if _library is not None else library()
    if not hasattr(lib, "hopattn_forward_kvcache"):
        raise NotSupportedError(
            f"hopattn: the library at {library_path()} predates forward_kvcache; rebuild or reinstall it",
            ERROR_NOT_SUPPORTED,
        )
    return lib


def forward_kvcache_workspace_size(args: bytes) -> int:
    """hopattn_forward_kvcache_workspace_size (the current CUDA device's); raises on error."""
    size = ctypes.c_size_t(0)
    status = _kvcache_library().hopattn_forward_kvcache_workspace_size(args, ctypes.byref(size))
    if status:
        raise_for_status(status, "hopattn forward_kvcache")
    return size.value


def forward_kvcache(args: bytes, workspace: int, workspace_bytes: int, stream: int) -> None:
    """hopattn_forward_kvcache on packed arguments (updates the cache in place); raises on error."""
    status = _kvcache_library().hopattn_forward_kvcache(args, workspace, workspace_bytes, stream)
    if status:
        raise_for_status(status, "hopattn forward_kvcache")


def backward_workspace_size(args: bytes) -> int:
    lib = _library if _library is not None else library()
    size = ctypes.c_size_t(0)
    status = lib.hopattn_backward_workspace_size(args, ctypes.byref(size))
    if status:
        raise_for_status(status, "hopattn backward")
    return size.value


def backward(args: bytes, workspace: int, workspace_bytes: int, stream: int) -> None:
    lib = _library if _library is not None else library()
    status = lib.hopattn_backward(args, workspace, workspace_bytes, stream)
    if status:
        raise_for_status(status, "hopattn backward")
