"""pytest setup for the hopattn Python package.

Runs against an installed hopattn (`pip install .`) or, when that is missing, the source tree
(python/) with the library from $HOPATTN_LIBRARY (a CMake build's src/libhopattn.so). Tests that
need the library skip when it cannot be found, unless HOPATTN_REQUIRE_LIBRARY=1 (CI), where that
fails. Tests that need PyTorch or a Hopper GPU skip with the reason.
"""

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

try:
    import hopattn  # noqa: F401  (an installed package wins)
except ImportError:
    sys.path.insert(0, str(REPO / "python"))
    import hopattn  # noqa: F401


def pytest_report_header(config):
    from hopattn import _capi

    return f"hopattn {hopattn.__version__} from {Path(hopattn.__file__).parent}, library {_capi.library_path()}"


def _library_problem():
    from hopattn import _capi

    try:
        _capi.library()
    except (ImportError, OSError) as e:
        return str(e)
    return None


@pytest.fixture(scope="session")
def lib():
    """The loaded ctypes library."""
    problem = _library_problem()
    if problem is not None:
        if os.environ.get("HOPATTN_REQUIRE_LIBRARY") == "1":
            pytest.fail(f"HOPATTN_REQUIRE_LIBRARY=1 but libhopattn could not be loaded: {problem}")
        pytest.skip(f"libhopattn could not be loaded: {problem}", allow_module_level=True)
    from hopattn import _capi

    return _capi.library()


def torch_or_skip():
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed", allow_module_level=True)
    if not hopattn.torch_available():
        pytest.skip("PyTorch is older than 2.4", allow_module_level=True)
    return torch


def hopper_or_skip():
    """torch, after checking there is an sm_90 device."""
    torch = torch_or_skip()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: these tests need an NVIDIA Hopper GPU (sm_90)", allow_module_level=True)
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        pytest.skip(f"CUDA device is sm_{major}{minor}; these tests need an NVIDIA Hopper GPU (sm_90)", allow_module_level=True)
    return torch


def signature_bound_hopattn(attention, attention_varlen):
    """Stand-ins for hopattn.attention and attention_varlen, each call first bound to the real
    function's signature (this checkout's python/hopattn), so that a keyword the caller passes and
    the package lacks fails in the test."""
    import inspect
    import types

    def bound(function, real):
        def call(*args, **kwargs):
            inspect.signature(real).bind(*args, **kwargs)
            return function(*args, **kwargs)
        return call

    return types.SimpleNamespace(attention=bound(attention, hopattn.attention),
                                 attention_varlen=bound(attention_varlen, hopattn.attention_varlen))
