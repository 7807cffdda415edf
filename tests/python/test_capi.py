"""The ctypes binding of hopattn.h, without PyTorch and without a GPU: struct layouts against the C
compiler, and every field reaching the library (each wrong field gets the library's message
naming it). Only calls that the library rejects before looking for a device are made with
made-up pointers, so these tests are safe on a GPU machine too."""

import ctypes
import shutil
import subprocess

import pytest

from conftest import REPO
from hopattn import _capi

BF16, FP16, FP32 = _capi.BFLOAT16, _capi.FLOAT16, _capi.FLOAT32


# --- layout against the C compiler ---------------------------------------------------------------

_FIELDS = {
    "hopattn_tensor": (_capi.Tensor, ["data", "dtype", "rank", "shape", "stride"]),
    "hopattn_int_array": (_capi.IntArray, ["data", "size"]),
    "hopattn_varlen": (_capi.Varlen, ["cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k",
                                      "max_seqlen_q", "max_seqlen_k"]),
    "hopattn_forward_args": (_capi.ForwardArgs, [f for f, _ in _capi.ForwardArgs._fields_]),
    "hopattn_backward_args": (_capi.BackwardArgs, [f for f, _ in _capi.BackwardArgs._fields_]),
    "hopattn_page_table": (_capi.PageTable, ["data", "batch", "max_pages", "row_stride"]),
    "hopattn_rotary": (_capi.Rotary, ["cos", "sin", "interleaved", "positions"]),
    "hopattn_kvcache_args": (_capi.KVCacheArgs, [f for f, _ in _capi.KVCacheArgs._fields_]),
}


def test_struct_layouts_match_the_c_compiler(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to compare the layouts with")
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "hopattn/hopattn.h"', "int main(void) {"]
    for struct_name, (_, fields) in _FIELDS.items():
        lines.append(f'  printf("{struct_name} sizeof %zu\\n", sizeof({struct_name}));')
        for field in fields:
            lines.append(f'  printf("{struct_name} {field} %zu\\n", offsetof({struct_name}, {field}));')
    lines += ["  return 0;", "}"]
    source = tmp_path / "layout.c"
    source.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c99", "-I", str(REPO / "include"), str(source), "-o", str(exe)], check=True)
    c_layout = {}
    for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines():
        struct_name, field, value = line.split()
        c_layout[(struct_name, field)] = int(value)
    for struct_name, (ctype, fields) in _FIELDS.items():
        assert ctypes.sizeof(ctype) == c_layout[(struct_name, "sizeof")], struct_name
        for field in fields:
            assert getattr(ctype, field).offset == c_layout[(struct_name, field)], f"{struct_name}.{field}"


def test_packed_structs_agree_with_ctypes():
    """pack_forward fills the same bytes as setting the ctypes fields one by one."""
    q = _capi.tensor_fields(0x1000, BF16, (2, 3, 4, 8), (96, 32, 8, 1))
    lse = _capi.tensor_fields(0x2000, FP32, (2, 4, 3), (12, 3, 1))
    varlen = (0x3000, 3, 0x4000, 3, 0x5000, 2, 0, 0, 7, 9)
    packed = _capi.pack_forward(q, q, q, q, lse, 0.5, 1, 5, 0, varlen)
    args = _capi.ForwardArgs.from_buffer_copy(packed)
    assert args.struct_size == ctypes.sizeof(_capi.ForwardArgs) == len(packed)
    assert args.q.data == 0x1000 and args.q.rank == 4 and list(args.q.shape) == [2, 3, 4, 8]
    assert list(args.q.stride) == [96, 32, 8, 1]
    assert args.lse.dtype == FP32 and args.lse.rank == 3 and list(args.lse.shape) == [2, 4, 3, 0]
    assert args.softmax_scale == 0.5 and args.causal == 1 and args.window_left == 5 and args.window_right == 0
    assert args.varlen.cu_seqlens_q.data == 0x3000 and args.varlen.cu_seqlens_k.size == 3
    assert args.varlen.seqused_q.data == 0x5000 and not args.varlen.seqused_k.data
    assert args.varlen.max_seqlen_q == 7 and args.varlen.max_seqlen_k == 9
    assert args.num_splits == 0 and args.pack_gqa == _capi.PACK_GQA_AUTO  # the defaults
    assert not args.page_table.data and args.page_table.max_pages == 0  # no paging
    split = _capi.ForwardArgs.from_buffer_copy(_capi.pack_forward(q, q, q, q, lse, 0.5, 1, 5, 0, varlen, 7, 1))
    assert split.num_splits == 7 and split.pack_gqa == 1
    paged = _capi.ForwardArgs.from_buffer_copy(
        _capi.pack_forward(q, q, q, q, lse, 0.5, 1, 5, 0, varlen, 7, 1, (0x6000, 3, 9, 12))
    )
    table = paged.page_table
    assert (table.data, table.batch, table.max_pages, table.row_stride) == (0x6000, 3, 9, 12)
    assert paged.pack_gqa == 1
    assert not paged.sinks.data and paged.sinks.rank == 0  # no sinks
    sinks = _capi.tensor_fields(0x8000, FP32, (4,), (1,))
    with_sinks = _capi.ForwardArgs.from_buffer_copy(_capi.pack_forward(q, q, q, q, lse, 0.5, 1, 5, 0, sinks=sinks))
    assert with_sinks.sinks.data == 0x8000 and with_sinks.sinks.dtype == FP32 and with_sinks.sinks.rank == 1
    assert list(with_sinks.sinks.shape) == [4, 0, 0, 0] and with_sinks.sinks.stride[0] == 1
    assert paged.softcap == 0.0 and with_sinks.softcap == 0.0  # no softcapping
    capped = _capi.ForwardArgs.from_buffer_copy(_capi.pack_forward(q, q, q, q, lse, 0.5, 1, 5, 0, sinks=sinks,
                                                                   softcap=30.0))  # fmt: skip
    assert capped.softcap == 30.0 and capped.sinks.data == 0x8000

    cos = _capi.tensor_fields(0x7000, BF16, (64, 8), (8, 1))
    packed = _capi.pack_kvcache(
        q, q, q, q, lse, 0.5, 1, 5, 0, cache_seqlens=(0x1100, 2), page_table=(0x1200, 2, 4, 0),
        cache_batch_idx=(0x1300, 2), cache_leftpad=(0x1400, 2), k_new=q, v_new=q, cu_seqlens_new=(0x1500, 3),
        rotary=(*cos, *cos, 1, 0x1600, 2), cu_seqlens_q=(0x1700, 3), max_seqlen_q=11, num_splits=3, pack_gqa=0,
    )  # fmt: skip
    kv = _capi.KVCacheArgs.from_buffer_copy(packed)
    assert kv.struct_size == ctypes.sizeof(_capi.KVCacheArgs) == len(packed)
    assert kv.q.data == kv.k_cache.data == kv.v_cache.data == kv.k_new.data == kv.v_new.data == kv.o.data == 0x1000
    assert kv.lse.dtype == FP32 and list(kv.v_cache.stride) == [96, 32, 8, 1]
    assert (kv.page_table.data, kv.page_table.batch, kv.page_table.max_pages) == (0x1200, 2, 4)
    assert [a.data for a in (kv.cache_seqlens, kv.cache_batch_idx, kv.cache_leftpad, kv.cu_seqlens_new,
                             kv.cu_seqlens_q)] == [0x1100, 0x1300, 0x1400, 0x1500, 0x1700]  # fmt: skip
    assert kv.cu_seqlens_new.size == 3 and kv.max_seqlen_q == 11
    assert kv.rotary.cos.data == kv.rotary.sin.data == 0x7000 and list(kv.rotary.sin.shape) == [64, 8, 0, 0]
    assert kv.rotary.interleaved == 1 and kv.rotary.positions.data == 0x1600 and kv.rotary.positions.size == 2
    assert kv.softmax_scale == 0.5 and kv.causal == 1 and kv.window_left == 5 and kv.window_right == 0
    assert kv.num_splits == 3 and kv.pack_gqa == 0
    assert not kv.sinks.data
    packed = _capi.pack_kvcache(q, q, q, q, lse, 0.0, 0, -1, -1, cache_seqlens=(1, 2), pack_gqa=1, sinks=sinks)
    kv = _capi.KVCacheArgs.from_buffer_copy(packed)
    assert kv.pack_gqa == 1 and kv.sinks.data == 0x8000 and list(kv.sinks.shape) == [4, 0, 0, 0]
    assert kv.softcap == 0.0
    packed = _capi.pack_kvcache(q, q, q, q, lse, 0.0, 0, -1, -1, cache_seqlens=(1, 2), sinks=sinks, softcap=5.5)
    assert _capi.KVCacheArgs.from_buffer_copy(packed).softcap == 5.5
    packed = _capi.pack_kvcache(q, q, q, q, lse, 0.0, 0, -1, -1, cache_seqlens=(1, 2))
    empty = _capi.KVCacheArgs.from_buffer_copy(packed)
    assert not empty.page_table.data and not empty.k_new.data and not empty.rotary.cos.data
    assert empty.pack_gqa == _capi.PACK_GQA_AUTO and empty.num_splits == 0

    packed = _capi.pack_backward(q, q, q, q, lse, q, q, q, q, 0.25, 0, -1, 3, _capi.EMPTY_VARLEN, 1)
    bargs = _capi.BackwardArgs.from_buffer_copy(packed)
    assert bargs.struct_size == ctypes.sizeof(_capi.BackwardArgs) == len(packed)
    assert bargs.dv.data == 0x1000 and bargs.softmax_scale == 0.25 and bargs.window_right == 3
    assert bargs.deterministic == 1
    assert not bargs.sinks.data and not bargs.dsinks.data and bargs.softcap == 0.0
    dsinks = _capi.tensor_fields(0x9000, FP32, (4,), (1,))
    packed = _capi.pack_backward(q, q, q, q, lse, q, q, q, q, 0.25, 0, -1, 3, _capi.EMPTY_VARLEN, 1, sinks, dsinks)
    bargs = _capi.BackwardArgs.from_buffer_copy(packed)
    assert bargs.deterministic == 1 and bargs.sinks.data == 0x8000 and bargs.dsinks.data == 0x9000
    assert bargs.dsinks.rank == 1 and bargs.dsinks.shape[0] == 4
    packed = _capi.pack_backward(q, q, q, q, lse, q, q, q, q, 0.25, 0, -1, 3, _capi.EMPTY_VARLEN, 1, sinks, dsinks,
                                 softcap=30.0)  # fmt: skip
    bargs = _capi.BackwardArgs.from_buffer_copy(packed)
    assert bargs.softcap == 30.0 and bargs.dsinks.data == 0x9000


# --- every field reaches the library -------------------------------------------------------------

B, SQ, SK, H, HKV, D = 2, 64, 48, 4, 2, 64
DV = 32  # a value head dim of its own (V, O, dO, dV), next to D (Q, K, dQ, dK)
_next_address = [1 << 32]


def _address(nbytes=1 << 20):
    """Distinct, 256-byte aligned made-up device addresses (never dereferenced: validation fails
    or only computes a size)."""
    _next_address[0] += nbytes + 256
    return _next_address[0] & ~255


def _contiguous(shape):
    stride, s = [], 1
    for n in reversed(shape):
        stride.insert(0, s)
        s *= n
    return tuple(stride)


def _t(shape, dtype=BF16, stride=None, data=None):
    return _capi.tensor_fields(_address() if data is None else data, dtype, shape, stride or _contiguous(shape))


def _fixed_tensors(**override):
    tensors = {
        "q": _t((B, SQ, H, D)),
        "k": _t((B, SK, HKV, D)),
        "v": _t((B, SK, HKV, D)),
        "o": _t((B, SQ, H, D)),
        "lse": _t((B, H, SQ), FP32),
        "dout": _t((B, SQ, H, D)),
        "dq": _t((B, SQ, H, D)),
        "dk": _t((B, SK, HKV, D)),
        "dv": _t((B, SK, HKV, D)),
    }
    tensors.update(override)
    return tensors


def _backward_args(scale=0.0, causal=0, left=-1, right=-1, varlen=_capi.EMPTY_VARLEN, deterministic=0,
                   sinks=_capi.EMPTY_TENSOR, dsinks=_capi.EMPTY_TENSOR, softcap=0.0, **override):  # fmt: skip
    t = _fixed_tensors(**override)
    return _capi.pack_backward(t["q"], t["k"], t["v"], t["o"], t["lse"], t["dout"], t["dq"], t["dk"], t["dv"],
                               scale, causal, left, right, varlen, deterministic, sinks, dsinks, softcap)


def _forward_args(scale=0.0, causal=0, left=-1, right=-1, varlen=_capi.EMPTY_VARLEN, num_splits=0,
                  pack_gqa=_capi.PACK_GQA_AUTO, page_table=_capi.EMPTY_PAGE_TABLE, sinks=_capi.EMPTY_TENSOR,
                  softcap=0.0, **override):  # fmt: skip
    t = _fixed_tensors(**override)
    return _capi.pack_forward(t["q"], t["k"], t["v"], t["o"], t["lse"], scale, causal, left, right, varlen,
                              num_splits, pack_gqa, page_table, sinks, softcap)


def test_valid_backward_arguments_get_a_workspace_size(lib):
    # No device is involved: a full, valid argument struct parses and gets a size.
    assert _capi.backward_workspace_size(_backward_args(deterministic=1)) >= 0
    assert _capi.backward_workspace_size(_backward_args(causal=1, left=16)) >= 0
    value_dim = dict(v=_t((B, SK, HKV, DV)), o=_t((B, SQ, H, DV)), dout=_t((B, SQ, H, DV)), dv=_t((B, SK, HKV, DV)))
    assert _capi.backward_workspace_size(_backward_args(**value_dim)) >= 0


@pytest.mark.parametrize(
    "override, message",
    [
        (dict(q=_t((B, SQ, H))), "q.rank is 3 but must be 4"),
        (dict(k=_t((B, SK, HKV, D), FP16)), "k.dtype is float16 but must be bfloat16"),
        (dict(v=_t((B, SK + 1, HKV, D))), "v.shape[1] is"),
        (dict(o=_t((B, SQ, H, D), stride=(SQ * H * D, H * D, D, 2))), "o.stride[3] is 2"),
        (dict(lse=_t((B, SQ, H), FP32)), "lse.shape[1] is"),
        (dict(q=_t((B, SQ, H, 12)), k=_t((B, SK, HKV, 12)), v=_t((B, SK, HKV, 12))), "multiple of 8"),
        (dict(k=_t((B, SK, 3, D)), v=_t((B, SK, 3, D))), "must be a multiple of heads_kv"),
        (dict(q=_t((B, SQ, H, D), data=_address() + 8)), "16-byte aligned"),
        (dict(scale=float("inf")), "softmax_scale is inf"),
        (dict(left=-2), "mask.window_left is -2"),
        (dict(right=-3), "mask.window_right is -3"),
        (dict(num_splits=-2), "num_splits is -2 but must be >= 0"),
        (dict(pack_gqa=3), "pack_gqa is 3 but must be -1 (auto), 0 (off) or 1 (on)"),
        (dict(v=_t((B, SK, HKV, 100))), "v.shape[3] (head_dim_v) is 100 but must be a multiple of 8 in [8, 256]"),
        (dict(v=_t((B, SK, HKV, DV))),
         "o.shape[3] is 64 but must be 32: expected (batch, seqlen_q, heads, head_dim_v)"),
    ],
)
def test_forward_rejects_each_wrong_field_with_the_library_message(lib, override, message):
    with pytest.raises(_capi.InvalidArgumentError) as info:
        _capi.forward(_forward_args(**override), None)
    assert message in str(info.value)
    assert info.value.code == _capi.ERROR_INVALID_ARGUMENT
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("override, message", [(dict(q=_t((B, SQ, H))), "q.rank is 3 but must be 4")])
def test_forward_workspace_calls_validate_first(lib, override, message):
    # Both validate before they ask for the device (the size depends on it).
    with pytest.raises(_capi.InvalidArgumentError, match=message.replace("[", r"\[")):
        _capi.forward_workspace_size(_forward_args(**override))
    with pytest.raises(_capi.InvalidArgumentError, match=message.replace("[", r"\[")):
        _capi.forward_with_workspace(_forward_args(**override), 0, 0, None)


def test_causal_with_a_right_window_is_rejected(lib):
    with pytest.raises(ValueError, match="causal"):
        _capi.forward(_forward_args(causal=1, right=4), None)


@pytest.mark.parametrize(
    "override, message",
    [
        (dict(dout=_t((B, SQ, H, D + 8))), "dout.shape[3]"),
        (dict(dq=_t((B, SQ + 1, H, D))), "dq.shape[1]"),
        (dict(dk=_t((B, SK, HKV, D), stride=(SK * HKV * D, HKV * D, 0, 1))), "dk"),
        (dict(dv=_t((B, SK, HKV))), "dv.rank"),
        (dict(v=_t((B, SK, HKV, DV)), o=_t((B, SQ, H, DV))), "dout.shape[3] is 64 but must be 32"),
        (dict(v=_t((B, SK, HKV, DV)), o=_t((B, SQ, H, DV)), dout=_t((B, SQ, H, DV))),
         "dv.shape[3] is 64 but must be 32"),
    ],
)
def test_backward_rejects_each_wrong_gradient_field(lib, override, message):
    with pytest.raises(ValueError) as info:
        _capi.backward_workspace_size(_backward_args(**override))
    assert message in str(info.value)


def test_backward_checks_the_workspace_before_the_device(lib):
    args = _backward_args()
    needed = _capi.backward_workspace_size(args)
    if needed == 0:
        pytest.skip("this build's backward needs no workspace")
    with pytest.raises(ValueError, match="workspace"):
        _capi.backward(args, 0, 0, None)


def _varlen_tensors(total_q=100, total_k=90):
    return dict(
        q=_t((total_q, H, D)), k=_t((total_k, HKV, D)), v=_t((total_k, HKV, D)), o=_t((total_q, H, D)),
        lse=_t((H, total_q), FP32), dout=_t((total_q, H, D)), dq=_t((total_q, H, D)),
        dk=_t((total_k, HKV, D)), dv=_t((total_k, HKV, D)),
    )


def test_varlen_fields_reach_the_library(lib):
    cu_q, cu_k, used = _address(), _address(), _address()
    ok = (cu_q, 4, cu_k, 4, used, 3, 0, 0, 64, 64)
    assert _capi.backward_workspace_size(_backward_args(varlen=ok, **_varlen_tensors())) >= 0
    cases = [
        ((cu_q, 4, 0, 0, 0, 0, 0, 0, 64, 64), "varlen.cu_seqlens_k is missing"),
        ((cu_q, 4, cu_k, 5, 0, 0, 0, 0, 64, 64), "varlen.cu_seqlens_k.size is 5"),
        ((cu_q, 4, cu_k, 4, used, 2, 0, 0, 64, 64), "varlen.seqused_q.size is 2"),
        ((cu_q, 4, cu_k, 4, 0, 0, used, 1, 64, 64), "varlen.seqused_k.size is 1"),
        ((cu_q, 4, cu_k, 4, 0, 0, 0, 0, -1, 64), "max_seqlen_q"),
        ((cu_q, 4, cu_k, 4, 0, 0, 0, 0, 64, -5), "max_seqlen_k"),
    ]
    for varlen, message in cases:
        with pytest.raises(ValueError) as info:
            _capi.forward(_forward_args(varlen=varlen, **_varlen_tensors()), None)
        assert message in str(info.value), (varlen, str(info.value))
    # Fixed-length tensors with varlen set: the rank rule names the varlen layout.
    with pytest.raises(ValueError, match=r"\(total_q, heads, head_dim\)"):
        _capi.forward(_forward_args(varlen=ok), None)


def test_empty_problem_runs_or_explains_the_missing_device(lib):
    """batch 0 is valid and launches nothing; the device is still checked, so without a Hopper GPU
    the call raises DeviceUnavailableError (a RuntimeError) saying why."""
    empty = dict(q=_t((0, SQ, H, D), data=0), k=_t((0, SK, HKV, D), data=0), v=_t((0, SK, HKV, D), data=0),
                 o=_t((0, SQ, H, D), data=0), lse=_t((0, H, SQ), FP32, data=0))
    try:
        _capi.forward(_forward_args(**empty), None)
    except _capi.DeviceUnavailableError as e:
        assert isinstance(e, RuntimeError)
        assert "Hopper" in str(e) or "sm_90" in str(e)
        assert e.code == _capi.ERROR_DEVICE_UNAVAILABLE


def test_struct_size_versioning_is_honoured(lib):
    """A caller that knows only the fields up to `causal` (an older, shorter struct) gets the
    library's defaults for the rest; a garbage struct_size is rejected with advice."""
    # batch 0 with null pointers: valid, and nothing is launched even on a GPU.
    empty = dict(q=_t((0, SQ, H, D), data=0), k=_t((0, SK, HKV, D), data=0), v=_t((0, SK, HKV, D), data=0),
                 o=_t((0, SQ, H, D), data=0), lse=_t((0, H, SQ), FP32, data=0))
    full = bytearray(_forward_args(left=-7, **empty))  # an invalid window_left, beyond the short struct
    short = ctypes.sizeof(ctypes.c_size_t) + 5 * ctypes.sizeof(_capi.Tensor) + 8  # ..., softmax_scale, causal
    full[:8] = short.to_bytes(8, "little")
    try:
        _capi.forward(bytes(full), None)  # window_left is not read: the default (-1) applies
    except _capi.DeviceUnavailableError:
        pass
    except ValueError as e:
        assert "window_left" not in str(e)
        raise
    full[:8] = (1 << 40).to_bytes(8, "little")
    with pytest.raises(ValueError, match="struct_size"):
        _capi.forward(bytes(full), None)


def test_short_forward_struct_gets_no_page_table(lib):
    """A caller from before page_table: the bytes where it would be are not read."""
    bad_k = dict(k=_t((B, SK, HKV, D), FP16))  # a rule the library checks on the unpaged path
    full = bytearray(_forward_args(**bad_k, page_table=(_address(), B, 4, 1)))  # row_stride < max_pages
    with pytest.raises(ValueError, match="page_table.row_stride is 1"):
        _capi.forward(bytes(full), None)
    full[:8] = _capi.ForwardArgs.page_table.offset.to_bytes(8, "little")
    with pytest.raises(ValueError, match="k.dtype is float16"):
        _capi.forward(bytes(full), None)


# --- attention sinks -------------------------------------------------------------------------------


def _sinks(heads=H, dtype=FP32, stride=None):
    return _t((heads,), dtype, stride)


@pytest.mark.parametrize(
    "sinks, message",
    [
        (_sinks(HKV), "sinks.shape[0] is 2 but must be 4: expected (heads,) = (4)"),  # per query head
        (_sinks(dtype=BF16), "sinks.dtype is bfloat16 but must be float32"),
        (_t((1, H), FP32), "sinks.rank is 2 but must be 1: (heads,)"),
        (_sinks(stride=(2,)), "sinks.stride[0] is 2"),
        (_capi.tensor_fields(0, FP32, (H,), (1,)), "sinks.data is null but its rank is 1"),
    ],
)
def test_sinks_reach_the_library(lib, sinks, message):
    calls = (
        lambda: _capi.forward(_forward_args(sinks=sinks), None),
        lambda: _capi.forward_workspace_size(_forward_args(sinks=sinks)),
        lambda: _capi.forward_kvcache_workspace_size(_kvcache_args(sinks=sinks)),
        lambda: _capi.backward_workspace_size(_backward_args(sinks=sinks, dsinks=_sinks())),
    )
    for call in calls:
        with pytest.raises(_capi.InvalidArgumentError) as info:
            call()
        assert message in str(info.value)
    with pytest.raises(_capi.InvalidArgumentError) as info:  # the same rules for the gradient
        _capi.backward_workspace_size(_backward_args(sinks=_sinks(), dsinks=sinks))
    assert "d" + message in str(info.value)


def test_backward_takes_dsinks_exactly_with_sinks(lib):
    assert _capi.backward_workspace_size(_backward_args(sinks=_sinks(), dsinks=_sinks())) >= 0
    with pytest.raises(ValueError, match="dsinks is missing"):
        _capi.backward_workspace_size(_backward_args(sinks=_sinks()))
    with pytest.raises(ValueError, match="dsinks is given without sinks"):
        _capi.backward_workspace_size(_backward_args(dsinks=_sinks()))


def test_short_structs_get_no_sinks(lib):
    """A caller from before the sinks: the bytes where they would be are not read, so arguments
    that only the sinks make invalid pass validation (the workspace queries then need a device:
    without a Hopper GPU they stop at the device check; with one they launch nothing)."""
    bad = _sinks(dtype=BF16)
    for size_of, args, ctype in (
        (_capi.forward_workspace_size, _forward_args(sinks=bad), _capi.ForwardArgs),
        (_capi.forward_kvcache_workspace_size, _kvcache_args(sinks=bad), _capi.KVCacheArgs),
        (_capi.backward_workspace_size, _backward_args(sinks=_sinks(), dsinks=bad), _capi.BackwardArgs),
    ):
        with pytest.raises(ValueError, match="sinks.dtype is bfloat16"):
            size_of(args)
        short = bytearray(args)
        short[:8] = ctype.sinks.offset.to_bytes(8, "little")
        try:
            assert size_of(bytes(short)) >= 0
        except _capi.DeviceUnavailableError:
            assert size_of is not _capi.backward_workspace_size  # the backward's size needs no device


# --- softcapping -----------------------------------------------------------------------------------


def _paged_forward_args(**fields):
    """Chunked prefill: B varlen query sequences against pages of keys."""
    total_q = 100
    return _forward_args(q=_t((total_q, H, D)), o=_t((total_q, H, D)), lse=_t((H, total_q), FP32),
                         k=_t((40, 16, HKV, D)), v=_t((40, 16, HKV, D)),
                         varlen=(_address(), B + 1, 0, 0, 0, 0, 0, 0, 64, 0),
                         page_table=(_address(), B, 16, 0), **fields)  # fmt: skip


@pytest.mark.parametrize(
    "softcap, shown", [(-1.0, "-1"), (float("nan"), "nan"), (float("inf"), "inf"), (float("-inf"), "-inf")]
)
def test_softcap_reaches_the_library(lib, softcap, shown):
    message = f"softcap is {shown} but must be 0 (off) or a positive finite cap"
    calls = (
        lambda: _capi.forward(_forward_args(softcap=softcap), None),
        lambda: _capi.forward_workspace_size(_forward_args(softcap=softcap)),
        lambda: _capi.forward_workspace_size(_paged_forward_args(softcap=softcap)),
        lambda: _capi.forward_kvcache_workspace_size(_kvcache_args(softcap=softcap)),
        lambda: _capi.backward_workspace_size(_backward_args(softcap=softcap)),
    )
    for call in calls:
        with pytest.raises(_capi.InvalidArgumentError) as info:
            call()
        assert message in str(info.value)


def test_valid_softcaps_pass_validation(lib):
    """0 and positive caps are valid: the backward's workspace size needs no device; the forward's
    queries stop at the device check without a Hopper GPU, and on one with a build without the
    softcap kernels (HOPATTN_SOFTCAP=OFF) at the kernel choice, which names the option."""
    for softcap in (0.0, 5.0, 30.0):
        assert _capi.backward_workspace_size(_backward_args(softcap=softcap)) >= 0
        for size_of, args in (
            (_capi.forward_workspace_size, _forward_args(softcap=softcap)),
            (_capi.forward_workspace_size, _paged_forward_args(softcap=softcap)),
            (_capi.forward_kvcache_workspace_size, _kvcache_args(softcap=softcap)),
        ):
            try:
                assert size_of(args) >= 0
            except _capi.DeviceUnavailableError as e:
                assert "Hopper" in str(e) or "sm_90" in str(e)
            except _capi.NotSupportedError as e:
                assert softcap > 0 and "HOPATTN_SOFTCAP=ON" in str(e)


def test_short_structs_get_no_softcap(lib):
    """A caller from before softcap: the bytes where it would be are not read, so a cap that alone
    makes the arguments invalid is not seen (the forward's queries then need a device, as in
    test_short_structs_get_no_sinks)."""
    for size_of, args, ctype in (
        (_capi.forward_workspace_size, _forward_args(softcap=-3.0), _capi.ForwardArgs),
        (_capi.forward_kvcache_workspace_size, _kvcache_args(softcap=-3.0), _capi.KVCacheArgs),
        (_capi.backward_workspace_size, _backward_args(softcap=-3.0), _capi.BackwardArgs),
    ):
        with pytest.raises(ValueError, match="softcap is -3"):
            size_of(args)
        short = bytearray(args)
        short[:8] = ctype.softcap.offset.to_bytes(8, "little")
        try:
            assert size_of(bytes(short)) >= 0
        except _capi.DeviceUnavailableError:
            assert size_of is not _capi.backward_workspace_size  # the backward's size needs no device


# --- the KV-cache call -----------------------------------------------------------------------------

CAPACITY, PAGE, PAGES, NEW = 256, 16, 40, 2


def _kvcache_args(cache_seqlens=None, **fields):
    """A valid decode step: one query per sequence, a contiguous cache, no append."""
    t = dict(q=_t((B, 1, H, D)), k_cache=_t((B, CAPACITY, HKV, D)), v_cache=_t((B, CAPACITY, HKV, D)),
             o=_t((B, 1, H, D)), lse=_t((B, H, 1), FP32))  # fmt: skip
    for name in list(t):
        if name in fields:
            t[name] = fields.pop(name)
    mask = {name: fields.pop(name) for name in ("softmax_scale", "causal", "window_left", "window_right")
            if name in fields}  # fmt: skip
    mask = {"softmax_scale": 0.0, "causal": 0, "window_left": -1, "window_right": -1, **mask}
    seqlens = (_address(), B) if cache_seqlens is None else cache_seqlens
    return _capi.pack_kvcache(t["q"], t["k_cache"], t["v_cache"], t["o"], t["lse"], *mask.values(),
                              cache_seqlens=seqlens, **fields)  # fmt: skip


def _paged():
    return dict(k_cache=_t((PAGES, PAGE, HKV, D)), v_cache=_t((PAGES, PAGE, HKV, D)),
                page_table=(_address(), B, CAPACITY // PAGE, 0))  # fmt: skip


def _rotary(half=16, positions=(0, 0)):
    cos = _t((1024, half))
    return (*cos, *cos, 1, *positions)


def _append():
    return dict(k_new=_t((B, NEW, HKV, D)), v_new=_t((B, NEW, HKV, D)))


def test_valid_kvcache_arguments_pass_validation(lib):
    """Valid calls get a workspace size, or, without a Hopper GPU, stop at the device check."""
    for args in (_kvcache_args(), _kvcache_args(**_paged()), _kvcache_args(**_append(), rotary=_rotary())):
        try:
            assert _capi.forward_kvcache_workspace_size(args) >= 0
        except _capi.DeviceUnavailableError as e:
            assert "Hopper" in str(e) or "sm_90" in str(e)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(cache_seqlens=(0, 0)), "cache_seqlens is missing"),
        (dict(cache_seqlens=(_address(), B + 1)), "cache_seqlens.size is 3 but must be 2"),
        (dict(cache_batch_idx=(_address(), 1)), "cache_batch_idx.size is 1 but must be 2"),
        (dict(cache_leftpad=(_address(), 3)), "cache_leftpad.size is 3 but must be 2"),
        (dict(k_cache=_t((B, CAPACITY, D))), "k_cache.rank is 3 but must be 4"),
        (dict(v_cache=_t((B, CAPACITY + 1, HKV, D))), "v_cache.shape[1] is 257 but must be 256"),
        (dict(k_cache=_t((B, 0, HKV, D), data=0), v_cache=_t((B, 0, HKV, D), data=0)), "capacity) is 0"),
        (dict(_paged(), page_table=(_address(), B + 1, CAPACITY // PAGE, 0)), "page_table.batch (rows) is 3"),
        (dict(_paged(), page_table=(_address(), B, 16, 8)), "page_table.row_stride is 8"),
        (dict(k_new=_t((B, NEW, HKV, D))), "v_new.data is null but k_new is given"),
        (dict(cu_seqlens_new=(_address(), B + 1)), "cu_seqlens_new is given without k_new/v_new"),
        (dict(rotary=_rotary()), "rotary.cos is given without k_new/v_new"),
        (dict(_append(), rotary=_rotary(half=12)), "rotary_dim (2 * rotary.cos.shape[1]) is 24"),
        (dict(_append(), rotary=_rotary(positions=(_address(), 3))), "rotary.positions.size is 3"),
        (dict(cu_seqlens_q=(_address(), B + 1), max_seqlen_q=1), "q.rank is 4 but must be 3"),
        (dict(q=_t((B, 1, H, D), stride=(0, H * D, D, 1))), "q.stride[0] is 0"),
        (dict(lse=_t((B, 1, H), FP32)), "lse.shape[1] is 1 but must be 4"),
        (dict(causal=1, window_right=2), "mask.causal is set with mask.window_right = 2"),
        (dict(num_splits=-1), "num_splits is -1"),
        (dict(pack_gqa=5), "pack_gqa is 5"),
    ],
)
def test_kvcache_rejects_each_wrong_field_with_the_library_message(lib, fields, message):
    args = _kvcache_args(**fields)
    with pytest.raises(_capi.InvalidArgumentError) as info:
        _capi.forward_kvcache_workspace_size(args)
    assert message in str(info.value)
    with pytest.raises(_capi.InvalidArgumentError) as info:
        _capi.forward_kvcache(args, 0, 0, None)  # validated first: nothing is launched, the cache untouched
    assert message in str(info.value)
