"""The CLI as a client of a running agent: signed requests (an HMAC with the cluster token, else this node's key,
bound to the receiving node), reads of its views with the reason when they fail, members by id prefix, and an
operator route's answer as an exit status."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ..errors import P2PNodeError

__all__ = [
    "HEALTHZ_TIMEOUT_S",
    "fetch_view",
    "get_json",
    "http_get",
    "list_members",
    "post_json",
    "read_view",
    "report",
    "signed",
    "url_of",
]


def _cluster_token() -> tuple[str, str] | None:
    """``(token, key id)`` the CLI signs requests with: ``P2PNODE_CLUSTER_TOKEN``, else the primary token of the
    keyring in the data dir (``$P2PNODE_DATA_DIR`` or the default; readable only by the agent's user: the file's
    permission is the access rule). ``None`` when there is neither."""
    from ..config import default_data_dir
    from ..keyring import KEYRING_FILE, Keyring, KeyringError, key_id_of

    token = os.environ.get("P2PNODE_CLUSTER_TOKEN", "")
    if token:
        return token, key_id_of(token)
    try:
        ring = Keyring.load(default_data_dir() / KEYRING_FILE)
    except (KeyringError, OSError):
        return None
    if ring is None or ring.primary_token is None or ring.primary is None:
        return None
    return ring.primary_token, ring.primary


_RECEIVERS: dict[str, str | None] = {}
"""Node id of the agent at each base URL (``scheme://host:port``), read once per CLI run from its ``/healthz``."""
HEALTHZ_TIMEOUT_S = 5.0


def _receiver(base: str) -> str | None:
    """The node id the agent at ``base`` answers on ``GET /healthz`` (always open; ``{"status", "node_id"}``),
    cached for this run; None when it cannot be read or names none (an agent that predates receiver binding:
    the request is then signed unbound, ``v1``/``k1``, which only such an agent or one with
    ``agent.accept_unbound_requests`` accepts)."""
    import httpx

    from ..reqauth import receiver_id

    if base not in _RECEIVERS:
        node_id = None
        try:
            resp = httpx.get(f"{base}/healthz", timeout=HEALTHZ_TIMEOUT_S, trust_env=False)
            if resp.status_code == 200:
                data = resp.json()
                node_id = receiver_id(data.get("node_id")) if isinstance(data, dict) else None
        except (httpx.HTTPError, ValueError):
            node_id = None
        _RECEIVERS[base] = node_id
    return _RECEIVERS[base]


def signed(method: str, url: str, body: bytes = b"") -> dict[str, str]:
    """Headers that authenticate a request without sending a secret (:mod:`p2pnode.reqauth`): an
    ``x-p2pnode-auth`` HMAC when a cluster token is at hand, else a signature with this node's key when it is
    readable (open mode: the voter roll, and reads where ``agent.read_token`` is set, which take this node's or a
    voter's key), each signed for the node at ``url`` (its id from :func:`_receiver`), so no other node accepts
    it; for reads ``P2PNODE_READ_TOKEN``, when set, as a bearer token instead of the key. Empty in an open cluster
    without a readable node key."""
    from urllib.parse import urlsplit

    from ..reqauth import AUTH_HEADER, sign_request, sign_request_with_key

    headers: dict[str, str] = {}
    read_token = os.environ.get("P2PNODE_READ_TOKEN", "")
    if read_token and method in ("GET", "HEAD"):
        headers["authorization"] = f"Bearer {read_token}"
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    base = f"{parts.scheme}://{parts.netloc}"
    found = _cluster_token()
    if found is not None:
        headers[AUTH_HEADER] = sign_request(found[0], found[1], method, target, body, time.time(),
                                            receiver=_receiver(base))
    elif (method == "POST" or "authorization" not in headers) and (ident := _node_identity()) is not None:
        headers[AUTH_HEADER] = sign_request_with_key(ident, method, target, body, time.time(),
                                                     receiver=_receiver(base))
    return headers


def _node_identity():
    """This node's key from the data dir, when readable (open mode: the voter roll's operator routes need a
    voter's signature); never creates one."""
    from ..config import default_data_dir
    from ..identity import KEY_FILE, load_or_create_identity

    path = default_data_dir() / KEY_FILE
    try:
        if not path.is_file():
            return None
        return load_or_create_identity(path.parent)
    except (OSError, P2PNodeError):
        return None


def post_json(url: str, obj: Any, timeout: float):
    """POST ``obj`` as JSON, signed (see :func:`signed`)."""
    import httpx

    body = json.dumps(obj).encode()
    return httpx.post(url, content=body, timeout=timeout, trust_env=False,
                      headers={"content-type": "application/json", **signed("POST", url, body)})


def http_get(url: str, timeout: float):
    import httpx

    return httpx.get(url, timeout=timeout, trust_env=False, headers=signed("GET", url))


def get_json(url: str, timeout: float) -> dict | None:
    import httpx

    try:
        resp = http_get(url, timeout)
        if resp.status_code == 401:
            print(f"p2pnode: {url} is protected: set P2PNODE_READ_TOKEN (agent.read_token) or a cluster token",
                  file=sys.stderr)
            return None
        resp.raise_for_status()
        return resp.json()
    except httpx.HTTPError as exc:
        print(f"p2pnode: cannot read {url}: {exc}", file=sys.stderr)
        return None


def read_view(url: str, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """``(JSON, "")`` of a GET, or ``(None, why)``: unreachable, or protected (which token to set)."""
    import httpx

    try:
        resp = http_get(url, timeout)
        if resp.status_code == 401:
            return None, (f"{url} protects its views: set P2PNODE_READ_TOKEN (agent.read_token) or a cluster token "
                          "(P2PNODE_CLUSTER_TOKEN, or run as the agent's user)")
        resp.raise_for_status()
        return resp.json(), ""
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"cannot reach agent at {url}: {exc}"


def fetch_view(ns: argparse.Namespace, path: str):
    """GET ``path`` from the agent at ``--url``. Returns ``(data, console)`` to render, or an exit code: 2 when
    the agent cannot be read (the reason printed), 0 after printing the raw JSON for ``--json``."""
    from rich.console import Console

    data = get_json(f"{ns.url.rstrip('/')}{path}", ns.timeout)
    if data is None:
        return 2
    if ns.json:
        json.dump(data, sys.stdout, indent=2)
        print()
        return 0
    return data, Console(width=None if sys.stdout.isatty() else 160)


def list_members(ns: argparse.Namespace) -> list[dict]:
    """The members the agent at ``--url`` lists (raises ``httpx.HTTPError``, ``ValueError``, ``KeyError``)."""
    return http_get(f"{ns.url.rstrip('/')}/members", ns.timeout).json()["members"]


def url_of(ns: argparse.Namespace, node_id: str | None) -> str:
    """The URL of member ``node_id`` (a unique prefix is enough) as the agent at ``--url`` knows it; ``--url``
    itself for None. Raises ``LookupError`` naming what went wrong."""
    base = ns.url.rstrip("/")
    if not node_id:
        return base
    found = [m for m in list_members(ns) if m["id"].startswith(node_id)]
    if len(found) != 1:
        raise LookupError(f"{len(found)} members match {node_id!r}" + ("" if found else " (p2pnode status lists them)"))
    m = found[0]
    if not m.get("self") and m.get("addr_refused"):  # the agent's dial policy refuses it: so does its CLI
        raise LookupError(f"{m['id']} advertises {m.get('addr')!r}, which is not dialed ({m['addr_refused']})")
    return base if m.get("self") else f"http://{m['addr']}"


def report(resp, what: str) -> int:
    """Print an operator route's answer: 0 when accepted, 1 refused (the reason printed)."""
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    if resp.status_code == 200:
        print(json.dumps(body) if not isinstance(body, str) else body)
        return 0
    print(f"p2pnode {what}: refused ({resp.status_code}): {body}", file=sys.stderr)
    return 1
