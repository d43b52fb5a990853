"""The route fuzzer (issue 22, item 7): structured hostile requests to every HTTP route of a real agent.

Each case is one request built by :func:`gen_request` from a :class:`Draw` (a ``random.Random`` seeded per case:
by hypothesis in the normal run, by ``--seed`` in ``bench/fuzz_routes.py``) for one route of :data:`ROUTES`: its
method (now and then another), query parameters (the route's own and unknown ones, repeated, percent-encoded
hostile text), headers (``content-type``, ``content-length``, ``x-p2pnode-auth``, ``authorization``, duplicated
ones) and body (JSON or msgpack, valid-shaped with hostile values: non-ASCII digits, 400- and 4,300-digit
integers, 2**64, control characters and NUL, ``NaN``/``Infinity`` as bare JSON tokens, deep nesting, duplicate
keys, wrong types, long strings, empty and truncated bodies, and bodies cut short on the wire). About half the
cases are signed correctly (:func:`auth_header`: the project's own ``sign_request`` /
``sign_request_with_key``), so the checks past authentication are reached.

Requests go over a raw loopback socket (:func:`send_raw`: the header bytes are exactly the ones generated) to a
real agent subprocess (:class:`RouteFuzzer`, one per :class:`AgentConfig`: open mode, token mode with a keyring
token, ``agent.read_token`` set). After every case (:meth:`RouteFuzzer.check`):

* no 5xx (but 503 busy on ``/gossip`` and 503/507 backpressure on ``/sync/push``, by design);
* no traceback in the agent's log (its stderr);
* a refused request (4xx) changed no state: cordon, drain deadline, one-off run ids (none added), voter roll
  (live views in ``/status``), signals (this node's snapshot in ``/status``, read again once it is republished
  after an accepted signal);
* the heartbeat: the node's own snapshot version in ``/status`` rises at least every :data:`HEARTBEAT_S`
  seconds, and ``/status`` shows its snapshot with its sections;
* no quarantine (``/status`` ``gossip.quarantines``).

After each route's batch (:meth:`RouteFuzzer.restart`) the heartbeat is checked once more, then the agent is
stopped with SIGTERM and started again on the same data dir: it must exit 0 and come back up with its snapshot
published; :meth:`RouteFuzzer.reset` then uncordons it and puts its voter roll back to itself alone (signed, valid
requests), so that what one batch's accepted requests changed does not narrow the next.

A failure is recorded once per distinct cause (:class:`Failure`, keyed by route, kind and the traceback's last
p2pnode frame and exception), keeping the smallest request that showed it; :meth:`RouteFuzzer.replay` sends that
request again alone to say whether it reproduces.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import random
import re
import shutil
import signal
import socket
import sys
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgpack
from agents import AgentProc, free_port

from p2pnode import reqauth
from p2pnode.identity import Identity, load_or_create_identity
from p2pnode.keyring import key_id_of

from .strategies import Draw, RandomDraw

sys.set_int_max_str_digits(0)  # we write 4,300-digit integers ourselves

TOKEN = "route-fuzz-token-5c1e0a9b7d"
READ_TOKEN = "route-fuzz-read-token-91af3"
HEARTBEAT_S = 8.0
"""The node's own snapshot version must rise at least this often (seconds; the local-test profile publishes
every second or so)."""
SETTLE_S = 3.0
"""After an accepted state change, how long to wait for the next own snapshot (so the next baseline holds it)."""
REQUEST_TIMEOUT_S = 12.0

CATALOG = """
[[job]]
name = "selfplay-x_2p"
kind = "selfplay"
config = "x_2p"
argv = ["sleep", "20"]
autonomous = true
max_concurrency = 1
[job.resources]
num_gpus = 0.25
vram_gib = 1

[[job]]
name = "idle-x_2p"
kind = "evaluation"
config = "x_2p"
argv = ["sleep", "600"]
autonomous = true
max_concurrency = 1
[job.resources]
num_gpus = 0
vram_gib = 0
num_cpus = 0.05
memory_gib = 0.01

[[job]]
name = "oneoff"
kind = "evaluation"
config = "y_2p"
argv = ["true", "{label}", "{n}", "{seconds}", "{flag}", "{mode}"]
[job.params.label]
type = "str"
default = "x"
[job.params.n]
type = "int"
default = 1
min = 0
max = 1000
[job.params.seconds]
type = "float"
default = 1.0
min = 0.0
max = 3600.0
[job.params.flag]
type = "bool"
default = false
[job.params.mode]
type = "str"
default = "a"
choices = ["a", "b"]
[job.resources]
num_gpus = 0
vram_gib = 0
num_cpus = 0.05
memory_gib = 0.01
"""
"""Harmless commands (the agent runs with one fake GPU): an autonomous GPU template, an autonomous CPU job that
runs for ten minutes (so ``/jobs/stop`` and ``/jobs/logs`` name a real job) and a one-off template with one
parameter of each type (``str``, ``int``, ``float``, ``bool``, ``str`` with choices)."""
TEMPLATES = ("selfplay-x_2p", "idle-x_2p", "oneoff")
CONFIGS = ("x_2p", "y_2p")
CATALOG_SIGNER = "ed25519:" + "A" * 43 + "="
"""A pinned operator key no fuzzed document can be signed with: pushed catalogs reach the signature check."""
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
       "P2PNODE_CATALOG_SIGNERS": CATALOG_SIGNER}


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """One configuration the fuzzer runs an agent in: ``trust`` ``open`` or ``token``, and whether
    ``agent.read_token`` is set."""

    name: str
    trust: str
    read_token: bool

    def env(self) -> dict[str, str]:
        env = dict(ENV)
        if self.trust == "token":
            env.update(P2PNODE_TRUST="token", P2PNODE_CLUSTER_TOKEN=TOKEN)
        else:
            env["P2PNODE_TRUST"] = "open"
        if self.read_token:
            env["P2PNODE_READ_TOKEN"] = READ_TOKEN
            env["P2PNODE_GOSSIP_PROBES"] = "1"  # POST /probe served (off in "open": the route is then a 404)
        return env


AGENT_CONFIGS = {
    "open": AgentConfig("open", "open", False),
    "token-read": AgentConfig("token-read", "token", True),
    "open-read": AgentConfig("open-read", "open", True),
}


# -- the routes ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RouteSpec:
    """How to fuzz one route: its ``method`` and ``path``, the query parameters it reads, its ``body`` kind
    (``none``, ``json``, ``json+msgpack``, ``push``, ``wal``, ``challenge``, ``dist``, ``gossip``,
    ``probe``), the JSON fields it reads, and
    whether a request to it may change state (refusals are checked for unchanged state on every route)."""

    method: str
    path: str
    query: tuple[str, ...] = ()
    body: str = "none"
    fields: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def writes(self) -> bool:
        return self.method == "POST"


ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec("GET", "/healthz"),
    RouteSpec("GET", "/status"),
    RouteSpec("GET", "/members", query=("limit", "after")),
    RouteSpec("GET", "/metrics"),
    RouteSpec("GET", "/events"),
    RouteSpec("GET", "/guard"),
    RouteSpec("GET", "/jobs"),
    RouteSpec("GET", "/plan", query=("format", "digest", "node", "inputs")),
    RouteSpec("GET", "/plan/part", query=("node", "digest")),
    RouteSpec("GET", "/jobs/running", query=("digest",)),
    RouteSpec("GET", "/jobs/usage", query=("digest",)),
    RouteSpec("GET", "/jobs/predict", query=("template",)),
    RouteSpec("GET", "/jobs/logs", query=("job_id", "offset")),
    RouteSpec("GET", "/jobs/runs", query=("id",)),
    RouteSpec("GET", "/jobs/history", query=("n",)),
    RouteSpec("GET", "/sync/status"),
    RouteSpec("GET", "/sync/manifest", query=("path",)),
    RouteSpec("GET", "/sync/receipts", query=("origin",)),
    RouteSpec("GET", "/sync/checkpoint", query=("digest",)),
    RouteSpec("GET", "/sync/checkpoint/file", query=("digest", "file", "offset", "part")),
    RouteSpec("GET", "/"),
    RouteSpec("GET", "/ui"),
    RouteSpec("GET", "/ui/app.js"),
    RouteSpec("GET", "/ui/style.css"),
    RouteSpec("GET", "/ui/state", query=("since",)),
    RouteSpec("GET", "/ui/series", query=("since",)),
    RouteSpec("POST", "/signals", body="json+msgpack"),
    RouteSpec("POST", "/voters", body="json", fields=("node_id", "action")),
    RouteSpec("POST", "/catalog", body="json", fields=("version", "signer", "toml", "sig")),
    RouteSpec("GET", "/catalog/signed"),
    RouteSpec("POST", "/operator/cordon", body="json", fields=("cordon",)),
    RouteSpec("POST", "/operator/drain", body="json", fields=("deadline_s",)),
    RouteSpec("POST", "/jobs/run", body="json", fields=("template", "params", "node", "tag")),
    RouteSpec("POST", "/jobs/stop", body="json", fields=("job_id",)),
    RouteSpec("POST", "/sync/trigger", body="json"),
    RouteSpec("POST", "/sync/push", body="push"),
    RouteSpec("POST", "/sync/wal", body="wal"),
    RouteSpec("POST", "/sync/challenge", body="challenge"),
    RouteSpec("POST", "/sync/dist/publication", body="dist"),
    RouteSpec("POST", "/sync/dist/blocks", body="dist"),
    RouteSpec("POST", "/sync/dist/list", body="dist"),
    RouteSpec("POST", "/sync/publish", body="json+msgpack", fields=("path", "publication")),
    RouteSpec("POST", "/gossip", body="gossip"),
    RouteSpec("POST", "/probe", body="probe"),
)
ROUTE_BY_KEY = {r.key: r for r in ROUTES}
BARE_ROUTES = {("POST", "/gossip"), ("POST", "/probe")}
"""Routes the app serves before its router (``create_app``'s ``app``: the hot gossip route, and the SWIM probe
fallback when ``gossip.probes`` is on)."""


def app_routes() -> set[tuple[str, str]]:
    """Every ``(method, path)`` the agent's app serves (HEAD left out: it is GET's), read from the Starlette router
    that :func:`p2pnode.http.create_app` builds, plus :data:`BARE_ROUTES`. A route added to the app and not to
    :data:`ROUTES` shows up here and fails the coverage test."""
    from unittest.mock import MagicMock

    from starlette.applications import Starlette

    from p2pnode.http import create_app

    # create_app only closes over the surfaces and reads no state while building: stand-ins do
    app = create_app(MagicMock(), MagicMock())
    routers = [c.cell_contents for c in (app.__closure__ or ()) if isinstance(c.cell_contents, Starlette)]
    assert routers, "create_app no longer closes over a Starlette router: update app_routes()"
    out = set(BARE_ROUTES)
    for route in routers[0].routes:
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            if method != "HEAD":
                out.add((method, route.path))
    return out


# -- hostile values -----------------------------------------------------------------------------------------------
class Raw:
    """A JSON token written as is (``NaN``, a 4,300-digit integer); ``alt`` is what msgpack carries instead."""

    def __init__(self, text: str, alt: Any = None) -> None:
        self.text = text
        self.alt = alt if alt is not None else text

    def __repr__(self) -> str:
        return f"Raw({_short(self.text, 60)})"


class BadStr:
    """A msgpack str whose bytes are not UTF-8 (at most 31 of them)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __repr__(self) -> str:
        return f"BadStr({self.raw!r})"


class Dup:
    """A map with repeated keys (in order), as JSON and msgpack can carry."""

    def __init__(self, items: list[tuple[Any, Any]]) -> None:
        self.items = items

    def __repr__(self) -> str:
        return f"Dup({self.items!r})"


D400 = "1" + "0" * 399
D4300 = "9" * 4300
HOSTILE_NUMBERS: tuple[Any, ...] = (
    -1, 2**31, 2**53 + 1, 2**63, 2**64, 2**64 + 1, -(2**63) - 1, -(2**64),
    Raw(D400, alt=2**64), Raw("-" + D400, alt=-(2**63) - 1), Raw(D4300, alt=2**64 - 1), Raw(D4300 + "9", alt=-1),
    Raw("NaN", alt=float("nan")), Raw("Infinity", alt=float("inf")), Raw("-Infinity", alt=float("-inf")),
    Raw("1e400", alt=float("inf")), Raw("-1e400", alt=float("-inf")), Raw("1e-400", alt=0.0), Raw("-0", alt=-0.0),
    Raw(D400 + ".5", alt=1e300), Raw("1" + "0" * 400 + "e-398", alt=100.0),
    1e308, -1e308, 5e-324, 0.1, -0.0, 1.5,
)
HOSTILE_TEXT: tuple[Any, ...] = (
    "", "²", "٣", "١٢٣", "１２", "x\ny", "tab\tx", "\x00", "nul\x00in", "\x1b[2J", "\u2028", "\x7f", "\r\n",
    "\ud800", "é" * 64, "a" * 257, "b" * 5000, "../../etc/passwd", "run-²", "1-²", "٣-1", "run-" + "9" * 400,
    "NaN", "Infinity", "-1", D400, "true", "null", "{label}", "$(reboot)", "%s%n", " 1", "1 ",
    Raw('"\ud800"', alt=BadStr(b"\xed\xa0\x80")), Raw('"a\udcff\udcfe"', alt=BadStr(b"a\xff")),  # not UTF-8
)
HOSTILE_DIGITS = ("²", "٣", "١٢٣", "１２", "\xb2", D400, D4300, D4300 + "9", str(2**64), "-1", "1e308", "1e999", "nan",
                  "inf", "-inf", "0x10", " 1", "1_000", "+1", "9" * 20)
"""Text where a number is parsed: non-ASCII digits, huge and odd numerals."""
QUERY_TEXT = tuple(t for t in HOSTILE_TEXT if isinstance(t, str)) + HOSTILE_DIGITS + ("%", "%zz", "%ed%a0%80", "%ff")
WRONG: tuple[Any, ...] = (None, True, False, [], {}, [1, "a"], {"k": 1}, [[[]]], b"\xff\xfe", 0, "str")


def hostile(d: Draw, kind: str = "any") -> Any:
    """A hostile value for a field of ``kind`` (``str``, ``num`` or ``any``): mostly hostile of that kind (text
    for a string field, a number for a numeric one), else of another kind or a wrong type."""
    first = {"str": 1, "num": 0}.get(kind)
    r = first if first is not None and d.chance(0.6) else d.int(0, 2)
    return d.choice(HOSTILE_NUMBERS) if r == 0 else d.choice(HOSTILE_TEXT) if r == 1 else d.choice(WRONG)


def maybe(d: Draw, valid: Callable[[], Any], p: float = 0.3, kind: str = "any") -> Any:
    """``valid()`` mostly, a hostile value (:func:`hostile` of ``kind``) with probability ``p``."""
    return hostile(d, kind) if d.chance(p) else valid()


def deep(d: Draw, limit: int) -> Raw:
    """JSON nested deep (lists or maps; 50 levels to as many as ``limit`` bytes hold)."""
    n = d.choice((50, 200, 1100, 3000, 100000))
    if d.chance(0.5):
        n = min(n, limit // 2)
        return Raw("[" * n + "]" * n, alt=[])
    n = min(n, (limit - 1) // 6)
    return Raw('{"a":' * n + "1" + "}" * n, alt={})


# -- encoders -----------------------------------------------------------------------------------------------------
def to_json(v: Any, ascii_only: bool = True) -> str:
    """JSON text of ``v`` (:class:`Raw` tokens as is, :class:`Dup` keys repeated, bytes as latin-1 text)."""
    if isinstance(v, Raw):
        return v.text
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "NaN" if v != v else "Infinity" if v == float("inf") else "-Infinity" if v == -float("inf") \
            else repr(v)
    if isinstance(v, bytes):
        v = v.decode("latin-1")
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=ascii_only)
    if isinstance(v, Dup):
        items = v.items
    elif isinstance(v, dict):
        items = list(v.items())
    else:
        return "[" + ",".join(to_json(x, ascii_only) for x in v) + "]"
    return "{" + ",".join(f"{to_json(str(k), ascii_only)}:{to_json(x, ascii_only)}" for k, x in items) + "}"


def _mp(v: Any, p: msgpack.Packer, out: list[bytes]) -> None:
    if isinstance(v, Raw):
        v = v.alt
        if isinstance(v, Raw):
            v = v.text
    if isinstance(v, BadStr):
        out.append(bytes([0xA0 | len(v.raw)]) + v.raw)
        return
    if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**64:
        v = float(v) if abs(v) < 1e308 else str(v)
    if isinstance(v, str):
        v = v.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if isinstance(v, (Dup, dict)):
        items = v.items if isinstance(v, Dup) else list(v.items())
        out.append(p.pack_map_header(len(items)))
        for k, x in items:
            _mp(k, p, out)
            _mp(x, p, out)
    elif isinstance(v, (list, tuple)):
        out.append(p.pack_array_header(len(v)))
        for x in v:
            _mp(x, p, out)
    else:
        out.append(p.pack(v))


def to_msgpack(v: Any) -> bytes:
    out: list[bytes] = []
    _mp(v, msgpack.Packer(use_bin_type=True), out)
    return b"".join(out)


def _short(s: Any, n: int = 300) -> str:
    r = s if isinstance(s, str) else repr(s)
    return r if len(r) <= n else r[:n] + f"...({len(r)} chars)"


# -- signing ------------------------------------------------------------------------------------------------------
_RECEIVER_NAMES = ("receiver", "receiver_id", "to", "to_node", "node_id", "receiver_node_id")


def _receiver_kw(fn: Callable[..., Any]) -> str | None:
    params = inspect.signature(fn).parameters
    return next((n for n in _RECEIVER_NAMES if n in params), None)


def auth_header(method: str, target: str, body: bytes, *, receiver: str, token: str | None = None,
                identity: Identity | None = None, now: float | None = None) -> str:
    """A valid ``x-p2pnode-auth`` value for this request, made by the project's own signing functions: a
    keyring token's HMAC (``token``) or a node key's signature (``identity``). When the signing functions take
    the receiving node's id (receiver-bound schemes, issue 22), ``receiver`` is passed to them."""
    now = time.time() if now is None else now
    if token is not None:
        fn: Callable[..., str] = reqauth.sign_request
        args: tuple[Any, ...] = (token, key_id_of(token), method, target, body, now)
    else:
        assert identity is not None
        fn, args = reqauth.sign_request_with_key, (identity, method, target, body, now)
    kw = _receiver_kw(fn)
    return fn(*args, **({kw: receiver} if kw else {}))


def mangle_auth(d: Draw, good: str) -> str:
    """``good`` with one part made hostile (scheme, key id, time, nonce, mac; or a part too many or too few)."""
    parts = good.split(" ")
    r = d.int(0, 7)
    if r == 7:
        r = 1  # the time field twice as often: it is the one parsed as a number
    if r == 0 and parts:
        parts[0] = d.choice(("v1", "k1", "v2", "k2", "V1", "", "v1\x00", "ｖ1"))
    elif r == 1 and len(parts) > 2:
        i = len(parts) - 3  # the time field
        parts[i] = d.choice(("\xb2", "²", "٣" * 10, "١٢٣٤٥٦٧٨٩٠", D400, D4300, "-1", "1e9", "", " 1", "0x10",
                             "9" * 12, "9" * 13, "1.5", "NaN"))
    elif r == 2 and len(parts) > 1:
        parts[1] = d.choice(("", "x" * 65, "\xb2", "é", "../k", "0" * 16))
    elif r == 3 and len(parts) > 2:
        i = len(parts) - 2
        parts[i] = d.choice(("g" * 32, "é" * 32, "\xb2" * 32, "0" * 31, "0" * 33, ""))
    elif r == 4 and parts:
        parts[-1] = d.choice(("z" * len(parts[-1]), "é" * len(parts[-1]), "\xb2" * len(parts[-1]), "0", ""))
    elif r == 5:
        parts = parts + [d.choice(("x", "", "1"))] if d.chance(0.5) else parts[:-1]
    else:
        return d.choice(("", " ", "v1", "Bearer x", "\xb2", "v1  a 1 b c", "\t".join(parts)))
    return " ".join(parts)


# -- requests -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Request:
    """One generated request: what goes on the wire, byte for byte. ``cut`` sends only that many body bytes
    and then closes our side (a body truncated on the wire)."""

    route: str
    method: str
    target: str
    headers: list[tuple[bytes, bytes]]
    body: bytes
    cut: int | None = None
    signed: bool = False
    seed: int | None = None
    """The seed of the ``random.Random`` it was drawn from, when known (:meth:`RouteFuzzer.replay` draws it again
    with a fresh time and nonce: a signed request's own copy would be refused as expired or replayed)."""

    def size(self) -> int:
        return len(self.target) + len(self.body) + sum(len(k) + len(v) for k, v in self.headers)

    def describe(self) -> str:
        hs = ", ".join(f"{k.decode('latin-1')}: {_short(v.decode('latin-1'), 120)}" for k, v in self.headers)
        cut = f" (body cut after {self.cut} bytes, then our side closed)" if self.cut is not None else ""
        seed = f" (seed {self.seed})" if self.seed is not None else ""
        return (f"{self.method} {_short(self.target, 200)}{seed}\n    headers: {hs or '-'}\n    body "
                f"({len(self.body)} bytes){cut}: {_short(self.body, 400)}")


@dataclasses.dataclass
class Context:
    """What the generator may name: the receiver's id, jobs running on it, its own identity (open mode signs
    with it), the cluster token (token mode) and the read token."""

    node_id: str
    identity: Identity
    token: str | None
    read_token: str | None
    running: list[str] = dataclasses.field(default_factory=list)


def _query_value(d: Draw, name: str, ctx: Context) -> str:
    valid = {
        "format": ("msgpack", "json"),
        "digest": ("0" * 64, "ab" * 32),
        "node": (ctx.node_id, "a" * 64),
        "job_id": (*ctx.running[:4], *ctx.running[:2], "run-1"),
        "id": ("run-1", "ab-1", "run-" + "x" * 64),
        "offset": ("0", "10", "1048576"),
        "path": ("cfg/shard0.npz", "x"),
        "origin": (ctx.node_id, "a" * 64),
        "since": ("0", "1700000000.5", "-1"),
        "limit": ("1", "7", "1000", "1001", "0"),
        "after": (ctx.node_id, "0", "~"),
    }.get(name, ("1",))
    if d.chance(0.2 if name == "job_id" else 0.45):
        if name in ("offset", "since", "limit") and d.chance(0.7):
            return d.choice(HOSTILE_DIGITS)
        return d.choice(QUERY_TEXT)
    return d.choice(valid)


def _query(d: Draw, spec: RouteSpec, ctx: Context) -> str:
    pairs: list[tuple[str, str]] = []
    for name in spec.query:
        if d.chance(0.7):
            pairs.append((name, _query_value(d, name, ctx)))
            if d.chance(0.08):
                pairs.append((name, _query_value(d, name, ctx)))  # repeated
    if d.chance(0.1):
        pairs.append((d.choice(("x", "²", "a" * 300, "", "%00")), _query_value(d, "x", ctx)))
    if not pairs:
        return ""
    if d.chance(0.1):  # raw bytes, not percent-encoded
        raw = "?" + "&".join(f"{k}={v}" for k, v in pairs)
        return raw.encode("utf-8", "surrogatepass").decode("latin-1")  # the server's view of these bytes
    def q(text: str) -> str:
        return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="%")

    return "?" + "&".join(f"{q(k)}={q(v)}" for k, v in pairs)


def _signal(d: Draw) -> Any:
    sig: dict[str, Any] = {"config": maybe(d, lambda: d.choice(CONFIGS), 0.2)}
    for k, lo, hi in (("quality", 0.0, 1.0), ("curriculum_weight", 0.0, 100.0), ("elo_velocity", -1e4, 1e4),
                      ("data_age_s", 0.0, 3.2e8), ("game_count", 0, 10**12)):
        if d.chance(0.4):
            sig[k] = maybe(d, lambda lo=lo, hi=hi: d.choice((lo, hi, (lo + hi) / 2)), 0.35, "num")
    if d.chance(0.1):
        sig[d.choice(("unknown", "²", ""))] = 1
    return sig


def _fields(d: Draw, spec: RouteSpec, ctx: Context) -> dict[str, Any]:
    path = spec.path
    if path == "/voters":
        return {"node_id": maybe(d, lambda: d.choice(("f" * 64, ctx.node_id, "0" * 64)), kind="str"),
                "action": maybe(d, lambda: d.choice(("admit", "remove", "eligible", "ineligible", "unmark")), 0.2)}
    if path == "/catalog":
        return {"version": maybe(d, lambda: d.choice((1, 2**53, 7)), 0.3, "num"),
                "signer": maybe(d, lambda: d.choice((CATALOG_SIGNER, "ed25519:" + "B" * 43 + "=")), 0.3, "str"),
                "toml": maybe(d, lambda: d.choice(('[[job]]\nname = "x"\n', "", "[[job]")), 0.3, "str"),
                "sig": maybe(d, lambda: d.choice(("A" * 86 + "==", "", "QUJD")), 0.3, "str")}
    if path == "/operator/cordon":
        return {"cordon": maybe(d, lambda: d.choice((False, True)), 0.4)}
    if path == "/operator/drain":
        return {"deadline_s": maybe(d, lambda: d.choice((3600, 0, 86400.5, 30 * 86400)), 0.5, "num")}
    if path == "/jobs/run":
        # mostly the one-off template, whose runs finish at once: runs of the others wait for a free slot, and
        # once 16 runs wait every further one is refused (429)
        body: dict[str, Any] = {"template": maybe(d, lambda: d.choice(TEMPLATES) if d.chance(0.1) else "oneoff",
                                                  0.15, "str")}
        if d.chance(0.8):
            params: dict[str, Any] = {}
            for name, kind, valid in (("label", "str", ("x", "a b", "é")), ("n", "num", (0, 1000, 7)),
                                      ("seconds", "num", (0.0, 3600, 1.5)), ("flag", "any", (True, False)),
                                      ("mode", "str", ("a", "b"))):
                if d.chance(0.35):
                    params[name] = maybe(d, lambda valid=valid: d.choice(valid), 0.4, kind)
            if d.chance(0.05):
                params[d.choice(("undeclared", "²", ""))] = 1
            body["params"] = params if d.chance(0.9) else hostile(d)
        if d.chance(0.3):
            body["node"] = maybe(d, lambda: d.choice(("", ctx.node_id)), kind="str")
        if d.chance(0.4):
            body["tag"] = maybe(d, lambda: d.choice(("", "nightly", "t" * 128)), 0.5, "str")
        return body
    if path == "/jobs/stop":
        return {"job_id": maybe(d, lambda: d.choice((*ctx.running[:2], "run-1", "1-1", "x")), 0.4, "str")}
    return {}


def _json_body(d: Draw, spec: RouteSpec, ctx: Context, limit: int) -> tuple[Any, str]:
    """(value, description) of a JSON-ish body for ``spec``."""
    r = d.int(0, 19)
    if r < 13:
        v: Any = [_signal(d) for _ in range(d.int(1, 3))] if spec.path == "/signals" and d.chance(0.2) else \
            _signal(d) if spec.path == "/signals" else _fields(d, spec, ctx)
        if isinstance(v, dict) and v and d.chance(0.12):  # a key twice, the second hostile
            items = list(v.items())
            k = d.choice([k for k, _ in items])
            v = Dup(items + [(k, hostile(d))])
        return v, "object"
    if r < 15:
        return hostile(d), "scalar"
    if r < 17:
        return deep(d, limit), "deep"
    return None, "empty"


def _push_body(d: Draw, ctx: Context) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A ``/sync/push`` body (length prefix, msgpack header, blocks) with hostile fields, and its auth headers
    (signed by the receiver's own key, or hostile)."""
    from p2pnode.sync._wire import sign_headers

    item = {"path": maybe(d, lambda: d.choice(("cfg/a.bin", "a"))), "size": maybe(d, lambda: 4),
            "block_size": maybe(d, lambda: d.choice((4, 1 << 20))), "hashes": maybe(d, lambda: b"\0" * 32),
            "root": maybe(d, lambda: b"\0" * 32), "seq": maybe(d, lambda: 1),
            "cls": maybe(d, lambda: d.choice(("sealed", "append", "sqlite"))), "commit": maybe(d, lambda: True),
            "blocks": maybe(d, lambda: [[0, 4]])}
    header = to_msgpack({"files": [item]} if d.chance(0.85) else hostile(d))
    n = len(header) if d.chance(0.85) else d.choice((0, 2**32 - 1, len(header) + 1))
    body = n.to_bytes(4, "big") + header + (b"abcd" if d.chance(0.8) else b"")
    hs = sign_headers(ctx.identity, "POST", "/sync/push", body)
    if d.chance(0.5):
        k = d.choice(list(hs))
        hs[k] = d.choice(("\xb2", "²", D400, D4300, "nan", "inf", "1e999", "", "é" * 10, "-1"))
    return body, [(k.encode(), header_bytes(v)) for k, v in hs.items()]


def _wal_body(d: Draw, ctx: Context) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A ``/sync/wal`` body (a segment's signed head: length prefix, msgpack header, signature; then its payload)
    with hostile fields, signed by the receiver's own key (a segment from itself) or hostile, and its auth
    headers."""
    from p2pnode.sync._walwire import SEGMENT_TAG
    from p2pnode.sync._wire import sign_headers

    hdr = {"origin": maybe(d, lambda: ctx.node_id), "path": maybe(d, lambda: d.choice(("db/a.sqlite", "../x", ""))),
           "kind": maybe(d, lambda: d.choice(("frames", "snapshot"))), "seq": maybe(d, lambda: d.choice((1, 2))),
           "prev_seq": maybe(d, lambda: 0), "page_size": maybe(d, lambda: d.choice((4096, 512, 3))),
           "db_pages": maybe(d, lambda: 1), "pages": maybe(d, lambda: d.choice(([1], [], [2**33]))),
           "payload_bytes": maybe(d, lambda: d.choice((4096, 0, 2**62))),
           "payload_hash": maybe(d, lambda: b"\0" * 32), "salts": maybe(d, lambda: [1, 2]),
           "frames": maybe(d, lambda: 1), "sent_at": maybe(d, lambda: 1.7e9)}
    header = to_msgpack(hdr if d.chance(0.85) else hostile(d))
    sig = ctx.identity.sign(SEGMENT_TAG + header) if d.chance(0.5) else b"\0" * 64
    n = len(header) if d.chance(0.85) else d.choice((0, 2**32 - 1, len(header) + 1))
    body = n.to_bytes(4, "big") + header + sig + (b"\0" * 4096 if d.chance(0.5) else b"")
    hs = sign_headers(ctx.identity, "POST", "/sync/wal", body)
    if d.chance(0.5):
        k = d.choice(list(hs))
        hs[k] = d.choice(("\xb2", "²", D400, D4300, "nan", "inf", "1e999", "", "é" * 10, "-1"))
    return body, [(k.encode(), header_bytes(v)) for k, v in hs.items()]


def _challenge_body(d: Draw, ctx: Context) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A ``/sync/challenge`` body (msgpack) with hostile fields, and its auth headers (signed by the receiver's own
    key, or hostile)."""
    from p2pnode.sync._possess import sign_challenge

    req = {"origin": maybe(d, lambda: ctx.node_id), "holder": maybe(d, lambda: ctx.node_id),
           "path": maybe(d, lambda: d.choice(("cfg/a.bin", "a", "../x"))), "size": maybe(d, lambda: 4),
           "root": maybe(d, lambda: b"\0" * 32), "nonce": maybe(d, lambda: b"\1" * 32),
           "blocks": maybe(d, lambda: d.choice(([0], [], list(range(17)), [2**40])))}
    body = to_msgpack(req if d.chance(0.85) else hostile(d))
    hs = sign_challenge(ctx.identity, body)
    if d.chance(0.5):
        k = d.choice(list(hs))
        hs[k] = d.choice(("\xb2", "²", D400, D4300, "nan", "inf", "1e999", "", "é" * 10, "-1"))
    return body, [(k.encode(), header_bytes(v)) for k, v in hs.items()]


def _dist_body(d: Draw, ctx: Context, path: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A ``/sync/dist/publication|blocks`` body (msgpack ``{root, indices}``) with hostile fields, and its auth
    headers (a push's, signed by the receiver's own key, or hostile)."""
    from p2pnode.sync._wire import sign_headers

    req = {"root": maybe(d, lambda: d.choice((b"\0" * 32, b"\0" * 31, "x" * 32))),
           "indices": maybe(d, lambda: d.choice(([0], [], list(range(17)), [2**40], [-1]))),
           "after": maybe(d, lambda: d.choice(("", "a" * 300, "é", 7)))}
    body = to_msgpack(req if d.chance(0.85) else hostile(d))
    hs = sign_headers(ctx.identity, "POST", path, body)
    if d.chance(0.5):
        k = d.choice(list(hs))
        hs[k] = d.choice(("\xb2", "²", D400, D4300, "nan", "inf", "1e999", "", "é" * 10, "-1"))
    return body, [(k.encode(), header_bytes(v)) for k, v in hs.items()]


def _gossip_body(d: Draw, ctx: Context) -> bytes:
    from p2pnode.snapshot import SCHEMA_VERSION

    msg: dict[str, Any] = {"schema": maybe(d, lambda: SCHEMA_VERSION, 0.2),
                           "from": maybe(d, lambda: "a" * 64, 0.3),
                           "addr": maybe(d, lambda: "127.0.0.1:9", 0.3),
                           "digest": maybe(d, lambda: {ctx.node_id: d.choice((0, 1, 2**53))}, 0.3),
                           "envelopes": maybe(d, lambda: [], 0.3)}
    if d.chance(0.2):
        msg = hostile(d) if d.chance(0.5) else Dup(list(msg.items()) + [("from", hostile(d))])
    return to_msgpack(msg)


def _probe_body(d: Draw, ctx: Context) -> bytes:
    """A SWIM probe packet ``[key_id, body, mac]`` (:mod:`p2pnode.gossip._probewire`) of the right shape with
    hostile fields, a MAC that cannot verify (the fuzzer holds no member's pair key), or no packet at all."""
    body = to_msgpack([d.choice((1, 2, 3, 4, 0, 99, -1)), d.int(0, 2**63 - 1) if d.chance(0.7) else hostile(d),
                       maybe(d, lambda: "f" * 16, 0.3), maybe(d, lambda: ctx.node_id, 0.2), d.choice((0, 1, 2**60)),
                       d.chance(0.5), int(time.time() * 1000), bytes(16)])
    packet: Any = [d.choice(("", "k1", "x" * 17)), body if d.chance(0.9) else hostile(d), bytes(16)]
    if d.chance(0.15):
        packet = hostile(d)
    raw = to_msgpack(packet)
    if d.chance(0.1):
        raw = raw + b"\0" * d.choice((1, 600))  # past the packet bound
    return raw


def header_bytes(value: str) -> bytes:
    """A header value's bytes: latin-1 where it fits (``"\xb2"`` goes out as the byte 0xb2, which the server reads
    back as ``"²"``: HTTP header values are latin-1 to it), else UTF-8."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


CONTENT_TYPES = (b"text/plain", b"application/x-www-form-urlencoded", b"application/msgpack; charset=\xb2",
                 b"multipart/form-data; boundary=x", b"", b"\xb2", b"application/json; charset=utf-16")


def gen_request(d: Draw, spec: RouteSpec, ctx: Context) -> Request:
    """One hostile request for ``spec`` (see the module docstring)."""
    method = spec.method if d.chance(0.92) else d.choice(("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS",
                                                          "PATCH"))
    target = spec.path + _query(d, spec, ctx)
    headers: list[tuple[bytes, bytes]] = []
    body = b""
    ctype = b""
    limit = {"/voters": 4096, "/sync/trigger": 4096}.get(spec.path, 8192)
    if spec.body in ("json", "json+msgpack"):
        value, kind = _json_body(d, spec, ctx, limit)
        use_msgpack = spec.body == "json+msgpack" and d.chance(0.4)
        if kind == "empty":
            body = b""
        elif use_msgpack:
            body = to_msgpack(value)
            ctype = b"application/msgpack"
        else:
            body = to_json(value, ascii_only=d.chance(0.6)).encode("utf-8", "surrogatepass")
            ctype = b"application/json"
            if b':"' in body and d.chance(0.06):  # bytes that are not UTF-8 inside a string value
                body = body.replace(b':"', b':"' + d.choice((b"\xed\xa0\x80", b"\xff", b"\xc3(", b"\x80")), 1)
        if body and d.chance(0.07):  # truncated in the encoding (a valid prefix)
            body = body[: d.int(0, len(body) - 1)]
        if d.chance(0.03):
            body = d.choice((b"\xff\xfe{", b"\xef\xbb\xbf" + body, body.decode("latin-1").encode("utf-16"),
                             b"\x00" * 16))
    elif spec.body == "push":
        body, auth = _push_body(d, ctx)
        headers += auth
        ctype = b"application/octet-stream"
    elif spec.body == "wal":
        body, auth = _wal_body(d, ctx)
        headers += auth
        ctype = b"application/octet-stream"
    elif spec.body == "challenge":
        body, auth = _challenge_body(d, ctx)
        headers += auth
    elif spec.body == "dist":
        body, auth = _dist_body(d, ctx, spec.path)
        headers += auth
    elif spec.body == "gossip":
        body = _gossip_body(d, ctx)
        ctype = b"application/msgpack"
    elif spec.body == "probe":
        body = _probe_body(d, ctx)
        ctype = b"application/octet-stream"
    elif method in ("POST", "PUT") and d.chance(0.2):
        body = to_json(hostile(d)).encode("utf-8", "surrogatepass")
    if d.chance(0.1):
        ctype = d.choice(CONTENT_TYPES)
    if ctype:
        headers.append((b"content-type", ctype))
    signed = False
    if d.chance(0.55):
        good = auth_header(method, target, body, receiver=ctx.node_id, token=ctx.token,
                           identity=ctx.identity if ctx.token is None else None)
        signed = not d.chance(0.3)
        value = good if signed else mangle_auth(d, good)
        headers.append((b"x-p2pnode-auth", header_bytes(value)))
        if d.chance(0.05):
            headers.append((b"x-p2pnode-auth", header_bytes(mangle_auth(d, good))))
    if ctx.read_token is not None and d.chance(0.7):
        bearer = f"Bearer {ctx.read_token}"
        if d.chance(0.25):
            bearer = d.choice(("Bearer ", "Bearer " + ctx.read_token + "x", "Basic eDp5", "bearer " + ctx.read_token,
                               "Bearer \xb2", "Bearer " + "é" * 20, "Bearer " + D4300))
        headers.append((b"authorization", header_bytes(bearer)))
    if spec.method == "GET" and d.chance(0.15):  # conditional views (issue 43): tags, lists, star and junk
        headers.append((b"if-none-match", header_bytes(d.choice(
            ("*", '"x"', 'W/"x", "y"', '"a" "b"', ",", '"' + "a" * 5000 + '"', ", ".join(['"t"'] * 40), "\xb2",
             'W/"\x80"', '"', "W/", D4300)))))
    cut = None
    cl = str(len(body)).encode()
    r = d.int(0, 99)
    if r < 4:  # a content-length h11 refuses, or one far above every bound (refused before the body is read)
        cl = d.choice((b"\xb2", "²".encode(), "٣".encode(), b"-1", b"1e3", b" 5", b"0x10", b"", D400.encode(),
                       D4300.encode(), str(2**64).encode(), b"5, 5"))
    elif r < 6 and body:  # the body cut short on the wire
        cut = d.int(0, len(body) - 1)
    elif r < 7 and body:  # declared shorter: the rest is a second (garbage) request
        cl = str(d.int(0, len(body) - 1)).encode()
    if method != "GET" or body or r < 7:
        headers.append((b"content-length", cl))
    if d.chance(0.03):
        headers.append((b"content-length", cl))
    return Request(spec.key, method, target, headers, body, cut, signed)


# -- the wire -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Reply:
    status: int | None
    body: bytes
    error: str | None = None


def send_raw(port: int, req: Request, timeout: float = REQUEST_TIMEOUT_S) -> Reply:
    """Send ``req`` on a fresh loopback connection (``connection: close``) and read the first reply."""
    head = f"{req.method} ".encode() + req.target.encode("latin-1") + b" HTTP/1.1\r\n"
    head += b"host: 127.0.0.1\r\nconnection: close\r\n"
    head += b"".join(k + b": " + v + b"\r\n" for k, v in req.headers) + b"\r\n"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.settimeout(timeout)
            if req.cut is not None:
                s.sendall(head + req.body[: req.cut])
                s.shutdown(socket.SHUT_WR)
            else:
                s.sendall(head + req.body)
            chunks = []
            while True:
                try:
                    c = s.recv(65536)
                except ConnectionResetError:
                    break
                if not c:
                    break
                chunks.append(c)
                if _complete(b"".join(chunks)):
                    break
    except TimeoutError:
        return Reply(None, b"", "timeout")
    except OSError as exc:
        return Reply(None, b"", f"{exc.__class__.__name__}: {exc}")
    data = b"".join(chunks)
    m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    return Reply(int(m.group(1)) if m else None, data.partition(b"\r\n\r\n")[2], None if m or not data else "garbled")


def _complete(data: bytes) -> bool:
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    m = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    return m is not None and len(rest) >= int(m.group(1))


# -- the oracles --------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Failure:
    """One distinct failure: ``kind`` (``5xx``, ``traceback``, ``state_change``, ``heartbeat``, ``quarantine``,
    ``restart``, ``no_reply``), the route, what was seen, and the smallest request that showed it."""

    kind: str
    route: str
    config: str
    detail: str
    request: Request | None
    count: int = 1
    reproduces: bool | None = None
    fixed: bool | None = None

    def key(self) -> tuple[str, str, str]:
        """(kind, route, cause): the cause is the traceback's last p2pnode file and function and the exception's
        type (line numbers and messages left out: the same bug stays one failure while the code moves), else the
        detail's last line."""
        lines = self.detail.splitlines()
        m = re.search(r'(p2pnode/\S+)", line \d+, in (\S+)', self.detail)
        if m and lines:
            return (self.kind, self.route, f"{m.group(1)}:{m.group(2)} {lines[-1].split(':')[0]}")
        return (self.kind, self.route, lines[-1] if lines else "")

    def report(self) -> str:
        rep = {True: "reproduces alone", False: "does not reproduce alone", None: "not replayed"}[self.reproduces]
        out = f"[{self.kind}] {self.route} ({self.config}; {self.count}x; {rep})\n  {self.detail.strip()}"
        if self.request is not None:
            out += "\n  request: " + self.request.describe()
        return out


@dataclasses.dataclass
class Stats:
    cases: int = 0
    statuses: Counter = dataclasses.field(default_factory=Counter)
    by_route: Counter = dataclasses.field(default_factory=Counter)
    accepted_writes: Counter = dataclasses.field(default_factory=Counter)
    signed: int = 0
    x5xx: int = 0
    tracebacks: int = 0
    state_changes: int = 0
    quarantines: int = 0
    heartbeat_misses: int = 0
    no_reply: int = 0
    restarts: int = 0
    restarts_ok: int = 0
    seconds: float = 0.0
    failures: dict[tuple[str, str, str], Failure] = dataclasses.field(default_factory=dict)

    def merge(self, other: Stats) -> None:
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, Counter):
                a.update(b)
            elif isinstance(a, dict):
                for k, v in b.items():
                    if k in a:
                        a[k].count += v.count
                    else:
                        a[k] = v
            else:
                setattr(self, f.name, a + b)

    @property
    def heartbeat_ok(self) -> bool:
        return self.heartbeat_misses == 0

    def summary(self) -> str:
        rate = self.cases / self.seconds if self.seconds else 0.0
        return "\n".join([
            f"cases {self.cases} in {self.seconds:.1f} s ({rate:.1f}/s), {self.signed} signed correctly",
            "statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items(), key=str)),
            "accepted state-changing requests: " + (", ".join(f"{k} {v}" for k, v in
                                                            sorted(self.accepted_writes.items())) or "none"),
            f"5xx {self.x5xx}, tracebacks {self.tracebacks}, state changes on refusal {self.state_changes}, "
            f"quarantines {self.quarantines}, heartbeat misses {self.heartbeat_misses}, no reply {self.no_reply}, "
            f"restarts {self.restarts_ok}/{self.restarts} OK",
            f"distinct failures {len(self.failures)}",
        ])


_TB_RE = re.compile(r"Traceback \(most recent call last\)")


def traceback_summary(text: str) -> str:
    """The last p2pnode frame and the exception line of the first traceback in ``text``."""
    lines = text[text.find("Traceback"):].splitlines()
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ") and "/p2pnode/" in ln]
    exc = ""
    for ln in lines[1:]:
        if re.match(r"^[\s|+-]*[A-Za-z_][\w.]*(Error|Exception|Group|Interrupt|Exit)\b", ln):
            exc = ln.strip(" |+-")
    where = re.sub(r'^File ".*?/p2pnode/', "p2pnode/", frames[-1]) if frames else "(no p2pnode frame)"
    return f"{where}\n{exc}"


class RouteFuzzer:
    """One long-lived agent in configuration ``cfg`` (data dir under ``tmp``), the oracles, and the counts."""

    def __init__(self, tmp: Path, cfg: AgentConfig, *, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.cfg = cfg
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.tmp / f"agent-{cfg.name}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.identity = load_or_create_identity(self.data_dir)  # the agent loads this key: we can sign as it
        catalog = self.tmp / "catalog.toml"
        catalog.write_text(CATALOG)
        self.proc = AgentProc(self.data_dir, free_port(), "--no-mdns", "--tag", "durable", "--fake-gpus", "H100",
                              "--catalog", str(catalog), env=cfg.env())
        self.heartbeat_s = heartbeat_s
        self.stats = Stats()
        self.ctx = Context(self.identity.node_id, self.identity, TOKEN if cfg.trust == "token" else None,
                           READ_TOKEN if cfg.read_token else None)
        self.client = httpx.Client(base_url=self.proc.url, timeout=REQUEST_TIMEOUT_S, trust_env=False,
                                   headers={"authorization": f"Bearer {READ_TOKEN}"} if cfg.read_token else {})
        self._log_pos = 0
        self._baseline: dict[str, Any] | None = None
        self._version = -1
        self._version_at = 0.0
        self._t0 = 0.0

    # -- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.proc.start()
        try:
            self._ready()
        except BaseException:
            self.proc.kill()  # an agent that never got ready is not left running
            raise
        self._t0 = time.monotonic()

    def _ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            if self.proc.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.proc.returncode}:\n{self._new_log()}")
            try:
                st = self.client.get("/status")
                # ready once it watches no more: a fresh node with no peer watches for join_hold_s before
                # its window opens (issue 37), and that change must not land inside a case's before/after
                if st.status_code == 200 and st.json()["node"]["version"] and \
                        st.json()["election"]["roll"]["adoption"] != "watching":
                    break
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"agent {self.cfg.name} not ready:\n{self._new_log()}")
            time.sleep(0.1)
        self._version, self._version_at = -1, time.monotonic()
        self._baseline = self._state()

    def close(self) -> None:
        self.stats.seconds += time.monotonic() - self._t0 if self._t0 else 0.0
        self._t0 = 0.0
        try:
            self.client.close()
        finally:
            self.proc.stop()

    def restart(self, route: str) -> bool:
        """First the heartbeat once more (the batch's last cases may have ended within :data:`HEARTBEAT_S` of a
        request that stopped it); then SIGTERM, wait, start again on the same data dir: it must exit 0, come up,
        and publish."""
        v0, deadline = self._version, self._version_at + self.heartbeat_s
        while True:
            st = self._state()
            if st is not None and st["version"] != v0:
                break
            if time.monotonic() > deadline:
                self.stats.heartbeat_misses += 1
                self._fail("heartbeat", route, f"own snapshot version stuck at {v0} for {self.heartbeat_s:g} s "
                                               "(at the end of the batch)", None)
                break
            time.sleep(0.1)
        self.stats.restarts += 1
        self.proc.stop(signal.SIGTERM, timeout=15)
        code = self.proc.proc.returncode
        ok = True
        if code != 0:
            self._fail("restart", route, f"the agent exited {code} on SIGTERM", None)
            ok = False
        self._scan_log(route, None)
        try:
            self.proc.start()
            self._ready()
        except (RuntimeError, TimeoutError) as exc:
            self._fail("restart", route, f"the agent did not come back on its data dir: {_short(str(exc), 3000)}",
                       None)
            shutil.copytree(self.data_dir, self.tmp / f"failed-restart-{self.stats.restarts}", dirs_exist_ok=True)
            self.proc.kill()
            # a fresh data dir (same key), so the rest of the run goes on
            for p in self.data_dir.iterdir():
                if p.name != "node.key":
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
            self.proc.start()
            self._ready()
            ok = False
        self.stats.restarts_ok += ok
        self.reset()
        return ok

    def reset(self) -> None:
        """Undo what accepted cases changed that would narrow the next batches (signed, valid requests; not
        counted as cases): uncordon (which ends a drain), and the voter roll back to this node alone (an admitted
        stranger costs the node its quorum, and with it the plans that start one-off runs)."""
        st = self._status()
        if st is None:
            return
        me = self.ctx.node_id
        posts: list[tuple[str, dict[str, Any]]] = [("/operator/cordon", {"cordon": False})]
        voters = st["election"]["roll"]["voters"]
        posts += [("/voters", {"node_id": v, "action": "remove"}) for v in voters if v != me]
        if me not in voters:
            posts.append(("/voters", {"node_id": me, "action": "admit"}))
        for path, obj in posts:
            body = json.dumps(obj).encode()
            auth = auth_header("POST", path, body, receiver=me, token=self.ctx.token,
                               identity=self.identity if self.ctx.token is None else None)
            send_raw(self.proc.port, Request(f"POST {path}", "POST", path, [
                (b"content-type", b"application/json"), (b"x-p2pnode-auth", auth.encode()),
                (b"content-length", str(len(body)).encode())], body))
        self._baseline = self._state()

    # -- state ----------------------------------------------------------------------------------------------------
    def _status(self) -> dict[str, Any] | None:
        try:
            r = self.client.get("/status")
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        return r.json()

    def _state(self, st: dict[str, Any] | None = None) -> dict[str, Any] | None:
        st = st if st is not None else self._status()
        if st is None:
            return None
        op = st["node"].get("operator") or {}
        roll = st["election"]["roll"]
        snap = st.get("snapshot") or {}
        return {
            "version": st["node"]["version"],
            "cordoned": op.get("cordoned"),
            "drain_deadline": op.get("drain_deadline"),
            "runs": {r["id"] for r in op.get("runs", [])},
            "voters": roll["voters"], "removed": roll["removed"], "not_admitted": roll.get("not_admitted"),
            "eligible": roll.get("eligible"), "ineligible": roll.get("ineligible"),
            "catalog_version": ((st.get("catalog") or {}).get("pushed") or {}).get("version"),
            "signals": json.dumps((snap.get("jobs") or {}).get("signals"), sort_keys=True),
            "sections": sorted(snap),
            "quarantines": st["gossip"].get("quarantines", 0),
        }

    def refresh_context(self) -> None:
        try:
            jobs = self.client.get("/jobs").json()
            ids = [j["job_id"] for j in jobs.get("running", []) + jobs.get("history", []) if "job_id" in j]
            self.ctx.running = list(dict.fromkeys(ids))[:4]  # running first, then recent ones (their logs exist)
        except (httpx.HTTPError, ValueError, AttributeError):
            self.ctx.running = []

    # -- one case -------------------------------------------------------------------------------------------------
    def run_case(self, spec: RouteSpec, seed: int) -> Reply:
        """One case for ``spec``, drawn from ``random.Random(seed)``."""
        req = gen_request(RandomDraw(random.Random(seed)), spec, self.ctx)
        req.seed = seed
        return self.send(req)

    def send(self, req: Request) -> Reply:
        self.stats.cases += 1
        self.stats.by_route[req.route] += 1
        self.stats.signed += req.signed
        reply = send_raw(self.proc.port, req)
        self.stats.statuses[reply.status if reply.status is not None else reply.error] += 1
        self.check(req, reply)
        return reply

    def check(self, req: Request, reply: Reply) -> None:
        spec = ROUTE_BY_KEY[req.route]
        s = reply.status
        x5xx = s is not None and s >= 500 and not (
            (s == 503 and spec.path in ("/gossip", "/sync/push")) or (s == 507 and spec.path == "/sync/push"))
        if x5xx:
            self.stats.x5xx += 1
        if s is None and reply.error == "timeout":
            self.stats.no_reply += 1
            self._fail("no_reply", req.route, f"no reply within {REQUEST_TIMEOUT_S:g} s", req)
        if self.proc.proc.poll() is not None:
            self._fail("crash", req.route, f"the agent exited {self.proc.proc.returncode}", req)
            self._scan_log(req.route, req)
            self.proc.start()
            self._ready()
            return
        st = self._status()
        after = self._state(st)
        now = time.monotonic()
        if not self._scan_log(req.route, req, wait_s=1.0 if x5xx else 0.0, status=s) and x5xx:
            self._fail("5xx", req.route, f"HTTP {s} (no traceback logged): "
                       f"{_short(reply.body.decode('latin-1'), 200)}", req)
        if after is None:
            self._fail("status", req.route, "GET /status failed after the case", req)
            return
        if after["version"] != self._version:
            self._version, self._version_at = after["version"], now
        elif now - self._version_at > self.heartbeat_s:
            self.stats.heartbeat_misses += 1
            self._fail("heartbeat", req.route, f"own snapshot version stuck at {after['version']} for "
                                               f"{now - self._version_at:.1f} s", req)
            self._version_at = now
        if not {"jobs", "operator", "membership"} <= set(after["sections"]):
            self._fail("heartbeat", req.route, f"own snapshot lacks sections: {after['sections']}", req)
        before = self._baseline
        if after["quarantines"] and (before is None or after["quarantines"] > before["quarantines"]):
            self.stats.quarantines += 1
            self._fail("quarantine", req.route,
                       f"quarantines {after['quarantines']}: {st['gossip'].get('quarantined')}", req)
        if s is not None and 400 <= s < 500 and before is not None:
            changed = [k for k in ("cordoned", "drain_deadline", "voters", "removed", "signals", "eligible",
                                   "ineligible", "catalog_version") if before[k] != after[k]]
            if after["runs"] - before["runs"]:
                changed.append("runs")
            if changed:
                self.stats.state_changes += 1
                self._fail("state_change", req.route, f"HTTP {s} but changed {changed}: "
                           f"{_short({k: (before[k], after[k]) for k in changed}, 400)}", req)
        elif s is not None and 200 <= s < 300 and spec.writes and req.method == "POST":
            self.stats.accepted_writes[req.route] += 1
            if spec.path == "/signals":  # the only state read from the published snapshot, not a live view
                after = self._settle(after)
        self._baseline = after

    def _settle(self, after: dict[str, Any]) -> dict[str, Any]:
        """After an accepted change: the state once the own snapshot published after it is out (bounded)."""
        deadline = time.monotonic() + SETTLE_S
        v0 = after["version"]
        while time.monotonic() < deadline:
            st = self._state()
            if st is not None and st["version"] != v0:
                self._version, self._version_at = st["version"], time.monotonic()
                return st
            time.sleep(0.05)
        return after

    # -- log ------------------------------------------------------------------------------------------------------
    def _new_log(self) -> str:
        try:
            with open(self.proc.log, "rb") as f:
                f.seek(self._log_pos)
                data = f.read()
        except FileNotFoundError:
            return ""
        self._log_pos += len(data)
        return data.decode("utf-8", "replace")

    def _scan_log(self, route: str, req: Request | None, wait_s: float = 0.0, status: int | None = None) -> bool:
        """Count the tracebacks the agent logged since the last scan (waiting up to ``wait_s`` for one: a 5xx is
        logged as it is answered); each is a failure of ``req`` (kind ``5xx`` when ``status`` is one, else
        ``traceback``). Returns whether there was one."""
        text = self._new_log()
        deadline = time.monotonic() + wait_s
        while "Traceback" not in text and time.monotonic() < deadline:
            time.sleep(0.05)
            text += self._new_log()
        if "Traceback" not in text:
            return False
        kind = "5xx" if status is not None and status >= 500 else "traceback"
        for m in _TB_RE.finditer(text):
            self.stats.tracebacks += 1
            tb = text[m.start(): m.start() + 20000]
            nxt = tb.find("Traceback", 10)
            tb = tb[:nxt] if nxt > 0 else tb
            detail = traceback_summary(tb)
            if kind == "5xx":
                detail = f"HTTP {status}; {detail}"
            self._fail(kind, route, detail, req)
        return True

    def _fail(self, kind: str, route: str, detail: str, req: Request | None) -> None:
        f = Failure(kind, route, self.cfg.name, detail, req)
        k = f.key()
        old = self.stats.failures.get(k)
        if old is None:
            self.stats.failures[k] = f
        else:
            old.count += 1
            if req is not None and (old.request is None or req.size() < old.request.size()):
                old.request = req

    def replay(self, f: Failure) -> bool | None:
        """Send ``f``'s request again, alone: True when the same failure shows (5xx or a traceback)."""
        if f.request is None or f.kind not in ("5xx", "traceback", "no_reply"):
            return None
        before = self.stats.tracebacks, self.stats.x5xx, self.stats.no_reply
        saved = {k: dataclasses.replace(v) for k, v in self.stats.failures.items()}
        req = f.request
        if req.seed is not None:
            req = gen_request(RandomDraw(random.Random(req.seed)), ROUTE_BY_KEY[req.route], self.ctx)
        self.send(req)
        after = self.stats.tracebacks, self.stats.x5xx, self.stats.no_reply
        self.stats.failures = saved  # a replay is no new finding
        f.reproduces = after != before
        if f.key() in saved:
            saved[f.key()].reproduces = f.reproduces
        return f.reproduces


def sign_check(ctx: Context) -> str:
    """Which signing the fuzzer uses now (for the report): the scheme of a header it makes."""
    return auth_header("GET", "/status", b"", receiver=ctx.node_id, token=ctx.token,
                       identity=ctx.identity if ctx.token is None else None).split(" ")[0]
