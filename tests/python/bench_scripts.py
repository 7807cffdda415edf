"""Helpers for the tests of the bench scripts (bench/compare.py, bench/decode.py), which are not a
package: loading one from its file, importing one with some modules blocked, reading markdown."""

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load(name):
    """bench/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_args(compare, *extra):
    """compare.py run's options parsed from `extra`, with the --json it requires."""
    return compare.parse_run_args(["--json", "out.json", *extra])


def import_without(name, blocked, expression):
    """Imports bench/<name>.py in a fresh interpreter where the `blocked` modules cannot be imported,
    and returns the completed process, whose stdout is print(expression)."""
    block = "".join(f"sys.modules[{m!r}] = None; " for m in blocked)
    code = f"import sys; {block}sys.path.insert(0, {str(REPO / 'bench')!r}); import {name}; print({expression})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def table_rows(markdown):
    """Data rows of markdown tables, as lists of cells."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in markdown.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
