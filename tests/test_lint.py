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
    "p2pnode.inputs",
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


# -- one typed decoder at every boundary (issue 22) ------------------------------------------------------------------
DECODER_MODULES = {
    "p2pnode/snapshot.py",  # the snapshot and its job ids (plan_job_id)
    "p2pnode/inputs.py",  # HTTP bodies, query strings, content-length
    "p2pnode/reqauth.py",  # the x-p2pnode-auth header
    "p2pnode/statefiles.py",  # state files read back at start
    "p2pnode/config.py",  # the operator's config file, env and flags (exit 2 on a bad value)
    "p2pnode/cli.py",  # the operator's own command line and what it prints from our own API
    "p2pnode/scheduler/_catalog.py",  # the operator's job catalog (TOML)
    "p2pnode/resources/_declared.py",  # agent.resources NAME=AMOUNT from the operator's config
    "p2pnode/resources/_gpus.py",  # --fake-gpus and --fake-gpu-load flags; NVML's typed values
}
"""Modules allowed to turn text into numbers: each is the one decoder of its input."""
_TEXT_CALLS = {"split", "rsplit", "partition", "rpartition", "group", "groups", "strip", "lstrip", "rstrip",
               "decode", "read_text", "readline", "getenv", "removeprefix", "removesuffix"}
_TEXT_SOURCES = {"headers", "query_params", "environ", "cookies", "path_params"}


def _text_tainted(node, tainted: set[str]) -> bool:
    """Whether expression ``node`` is text read from outside, or a part of it: a string method's result
    (``split``, ``group``, ``decode``, ...), a header, query or environment read (``request.headers.get(...)``), a
    subscript or element of such, or a local name bound to one. Text stops at any other call or operator."""
    import ast

    if isinstance(node, ast.Name):
        return node.id in tainted or node.id in _TEXT_SOURCES
    if isinstance(node, ast.Subscript):
        return _text_tainted(node.value, tainted)
    if isinstance(node, ast.Attribute):
        return node.attr in _TEXT_SOURCES or _text_tainted(node.value, tainted)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in _TEXT_CALLS or (node.func.attr == "get" and _text_tainted(node.func.value, tainted))
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(_text_tainted(e, tainted) for e in node.elts)
    if isinstance(node, ast.IfExp):
        return _text_tainted(node.body, tainted) or _text_tainted(node.orelse, tainted)
    return False


def _parses_of_text(path: Path) -> list[str]:
    """``isdigit``/``isdecimal``/``isnumeric`` calls, and ``int()``/``float()`` of text (see :func:`_text_tainted`,
    with names bound from such text tracked within each function; parameters annotated ``str`` count as text)."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    found = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))]:
        tainted: set[str] = set()
        if not isinstance(fn, ast.Module):
            for a in fn.args.args + fn.args.kwonlyargs:
                if isinstance(a.annotation, ast.Name) and a.annotation.id == "str":
                    tainted.add(a.arg)
        body = list(ast.walk(fn)) if not isinstance(fn, ast.Module) else list(ast.iter_child_nodes(fn))
        for n in body:  # a coarse, order-insensitive pass: good enough for a lint that fails loudly
            if isinstance(n, ast.Assign) and _text_tainted(n.value, tainted):
                for t in n.targets:
                    tainted |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
            if isinstance(n, (ast.For, ast.comprehension)) and _text_tainted(n.iter, tainted):
                tainted |= {x.id for x in ast.walk(n.target) if isinstance(x, ast.Name)}
        for n in body:
            if not isinstance(n, ast.Call):
                continue
            f = n.func
            if isinstance(f, ast.Attribute) and f.attr in ("isdigit", "isdecimal", "isnumeric"):
                found.append(f"{rel}:{n.lineno}: .{f.attr}() accepts non-ASCII digits")
            if isinstance(f, ast.Name) and f.id in ("int", "float") and len(n.args) == 1 \
                    and _text_tainted(n.args[0], tainted):
                found.append(f"{rel}:{n.lineno}: {f.id}() of text outside a decoder module")
    return sorted(set(found))


def test_no_number_is_parsed_from_text_past_the_decoders():
    """Every byte from outside becomes a bounded, typed value in one decoder module (:data:`DECODER_MODULES`);
    past them no code calls ``isdigit()`` (it accepts ``²``) or ``int()``/``float()`` on text (``int("²")`` raises,
    ``int("9" * 4300)`` raises, ``float("٣")`` succeeds): a value that slipped through would take a loop down."""
    found = []
    for path in sorted((ROOT / "p2pnode").rglob("*.py")):
        if str(path.relative_to(ROOT)) not in DECODER_MODULES:
            found += _parses_of_text(path)
    assert not found, "parse text in a decoder module (p2pnode/inputs.py, ...):\n  " + "\n  ".join(found)


def test_the_text_lint_sees_what_it_must(tmp_path):
    """The lint above is not vacuous: it finds each form of the mistakes issue 22 found."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(job_id: str, request, d):\n"
        "    offset = request.query_params.get('offset', '0')\n"
        "    a = int(offset)\n"
        "    host, port_s = d.rsplit(':', 1)\n"
        "    b = int(port_s)\n"
        "    c = job_id[3:].isdigit()\n"
        "    e = float(headers.get('x-time'))\n"
        "    return float(job_id), a, b, c, e, int(d.count), int(round(2.5))\n")
    found = _parses_of_text(bad)
    assert [line.split(": ", 1)[1][:12] for line in found] == [
        "int() of tex", "int() of tex", ".isdigit() a", "float() of t", "float() of t"], found
