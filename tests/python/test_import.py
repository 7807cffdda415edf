"""Importing hopattn works anywhere: without a GPU, without PyTorch; the errors are typed."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hopattn
from conftest import REPO


def test_import_needs_no_gpu_and_exports_the_api():
    for name in ("attention", "attention_varlen", "attention_with_kvcache", "flash_attn_func", "flash_attn_varlen_func",
                 "flash_attn_with_kvcache"):
        assert callable(getattr(hopattn, name))
    assert isinstance(hopattn.__version__, str)


def test_error_types_are_builtin_categories():
    assert issubclass(hopattn.InvalidArgumentError, ValueError)
    assert issubclass(hopattn.ArgumentTypeError, TypeError)
    assert issubclass(hopattn.NotSupportedError, RuntimeError)
    assert issubclass(hopattn.NotSupportedError, NotImplementedError)
    assert issubclass(hopattn.DeviceUnavailableError, RuntimeError)
    assert issubclass(hopattn.CudaError, RuntimeError)
    for error in (hopattn.InvalidArgumentError, hopattn.NotSupportedError, hopattn.DeviceUnavailableError):
        assert issubclass(error, hopattn.HopattnError)


def test_library_version_is_the_project_version(lib):
    cmake = (REPO / "CMakeLists.txt").read_text()
    version = re.search(r"project\(hopattn VERSION ([0-9.]+)", cmake).group(1)
    assert hopattn.library_version() == version
    if not hopattn.__version__.endswith("+unknown"):  # installed: generated from the same line
        assert hopattn.__version__ == version


def test_library_commit_is_recorded(lib):
    from hopattn import _capi

    commit = _capi.library_commit()
    assert commit == "unknown" or re.fullmatch(r"[0-9a-f]{12}(-dirty)?", commit), commit


def _run_python(code, **env):
    environment = {**os.environ, **env}
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(hopattn.__file__).parents[1]),
                                                            environment.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120)


def test_missing_library_is_explained_on_use_not_on_import():
    result = _run_python(
        "import hopattn\n"
        "try:\n"
        "    hopattn.library_version()\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n",
        HOPATTN_LIBRARY="/nonexistent/libhopattn.so",
    )
    assert result.returncode == 0, result.stderr
    assert "ImportError: hopattn: /nonexistent/libhopattn.so does not exist" in result.stdout
    assert "pip install ." in result.stdout


def test_without_torch_the_functions_say_so():
    # A stand-in `torch` module that fails to import, whatever is installed.
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import hopattn\n"
        "assert not hopattn.torch_available()\n"
        "for function in (hopattn.attention, hopattn.flash_attn_with_kvcache):\n"
        "    try:\n"
        "        function(None, None, None)\n"
        "    except ImportError as e:\n"
        "        print(e)\n"
    )
    result = _run_python(code)
    assert result.returncode == 0, result.stderr
    assert "hopattn.attention: PyTorch is not installed" in result.stdout
    assert "hopattn.flash_attn_with_kvcache: PyTorch is not installed" in result.stdout
    assert ">= 2.4" in result.stdout
