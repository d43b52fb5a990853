"""The layers hold, the code is linted and the cores are typed: import-linter, ruff and mypy as tests, and the
cores imported in a process where trio, httpx, anyio, psutil and pynvml cannot be imported.

The tools come with the ``test`` extra (``pip install -e '.[test]'``) and are configured in ``pyproject.toml``;
each test runs the tool from this interpreter's ``bin`` directory and prints its output when it fails.
"""

from __future__ import annotations

import ast
import builtins
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

BLOCKED = ("trio", "httpx", "anyio", "psutil", "pynvml")
"""What the cores must import without: the async runtime, the HTTP client, the machine probes."""

CORES = (
    "p2pnode.errors",
    "p2pnode.gossip",
    "p2pnode.election",
    "p2pnode.wire",
    "p2pnode.snapshot",
    "p2pnode.identity",
    "p2pnode.keyring",
    "p2pnode.reqauth",
    "p2pnode.scheduler",
    "p2pnode.guard",
    "p2pnode.guard._assess",
    "p2pnode.guard._limits",
    "p2pnode.guard._events",
    "p2pnode.guard._safeguards",
    "p2pnode.guard._disk",
    "p2pnode.resources",
    "p2pnode.config",
    "p2pnode.sync._manifest",
    "p2pnode.sync._ledger",
    "p2pnode.sync._retention",
    "p2pnode.node._context",
    "p2pnode.node._plandist",
    "p2pnode.node",
)
"""Modules that must import with only the standard library, msgpack/msgspec, cryptography and blake3 (and
platformdirs for the config)."""


def _run(argv: list[str], timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed in {BIN} (pip install -e '.[test]' installs it)")
    return str(path)


def _report(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


@pytest.mark.parametrize("module", CORES)
def test_cores_import_without_trio_httpx_anyio_psutil_or_nvml(module):
    # One fresh process per core: one that fails cannot hide another, and no module is imported twice in one
    # interpreter (re-importing msgspec Struct modules after deleting them from sys.modules crashed it once).
    script = textwrap.dedent(f"""
        import importlib, importlib.abc, sys

        BLOCKED = {BLOCKED!r}

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is blocked: a core must not need it")
                return None

        sys.meta_path.insert(0, Block())
        try:
            importlib.import_module({module!r})
        except ImportError as exc:
            print(f"{module}: {{exc}}")
            sys.exit(1)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        print("\\n".join(f"imported anyway: {{m}}" for m in leaked))
        sys.exit(1 if leaked else 0)
    """)
    proc = _run([sys.executable, "-c", script], timeout_s=120)
    assert proc.returncode == 0, _report(proc)


def test_lazy_guard_api_still_resolves():
    # The guard's library API loads on first use, in a fresh process (this one may have imported it already).
    script = ("import sys, p2pnode.guard as g; assert 'p2pnode.guard._api' not in sys.modules; "
              "from p2pnode.guard import check_gpu_memory, ResourceGuard; "
              "assert 'p2pnode.guard._api' in sys.modules and callable(check_gpu_memory); "
              "import p2pnode.guard._api as api; assert g._API_NAMES == set(api.__all__), "
              "g._API_NAMES ^ set(api.__all__); "
              "from p2pnode.resources import ResourceSampler, rank_of_gpus")
    proc = _run([sys.executable, "-c", script], timeout_s=120)
    assert proc.returncode == 0, _report(proc)


def test_every_public_exception_joins_the_tree():
    """A public exception class of p2pnode derives from P2PNodeError (see the tree in p2pnode/errors.py); a
    built-in base may stay beside a base from the tree. Private ones (``_ChannelBusy``) are control flow."""
    builtin_errors = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
                      and issubclass(getattr(builtins, n), BaseException)}
    outside = []
    for path in sorted((ROOT / "p2pnode").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_") or node.name == "P2PNodeError":
                continue
            bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
            if bases and all(b in builtin_errors for b in bases):
                outside.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}({', '.join(bases)})")
    assert not outside, "exceptions outside the P2PNodeError tree:\n" + "\n".join(outside)


def test_import_contracts():
    proc = _run([_tool("lint-imports"), "--no-cache"])
    assert proc.returncode == 0, _report(proc)


def test_ruff():
    proc = _run([_tool("ruff"), "check", "--no-cache", "p2pnode", "tests", "bench", "deploy"])
    assert proc.returncode == 0, _report(proc)


def test_mypy_on_the_cores():
    # The modules checked are `files` in [tool.mypy] of pyproject.toml.
    proc = _run([_tool("mypy"), "--no-incremental", "--cache-dir", os.devnull], timeout_s=600)
    assert proc.returncode == 0, _report(proc)
