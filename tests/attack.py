"""An attacker on the same network, for the hostile-input tests and benchmarks: crafts gossip messages and signed
snapshots (schema 2: a header and typed sections, :class:`p2pnode.snapshot.Snapshot`) with hostile values and
posts them to real agents. Snapshots are plain maps (sections too: ``membership={"suspects": {...}}``,
``jobs={"running": [...]}``, ``plan={"term": 4, "assignments": [...]}``), so a test can put any value anywhere."""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import msgpack

from p2pnode.identity import Identity, endorsement_for
from p2pnode.snapshot import SCHEMA_VERSION
from p2pnode.wire import Envelope, decode_gossip, encode_gossip

GOSSIP_HEADERS = {"content-type": "application/msgpack"}

TINY_CATALOG = """
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
"""
"""One harmless autonomous template (config ``x_2p``): signals, plans and job reports have a catalog to name."""


def raw_envelope(ident: Identity, snap: dict[str, Any], *, token: str | None = None, version: int | None = None,
                 origin: str | None = None, key: bytes | None = None, sig: bytes | None = None) -> Envelope:
    """Sign ``snap`` as msgpack bytes (any values, hostile ones included) with ``ident``; every field of the
    envelope can be overridden (to forge one)."""
    body = msgpack.packb(snap, use_bin_type=True)
    return Envelope(
        origin=origin or (snap["origin"] if isinstance(snap.get("origin"), str) else ident.node_id),
        version=version if version is not None else snap.get("version", 1),
        key=key or ident.public_key,
        body=body,
        sig=sig or ident.sign(body),
        endorsement=endorsement_for(token, key or ident.public_key) if token else None,
    )


class Attacker:
    """One hostile identity. ``token`` (token mode) makes it an endorsed member, i.e. an insider."""

    def __init__(self, token: str | None = None) -> None:
        self.ident = Identity.generate()
        self.token = token
        self.version = int(time.time())
        self._client: httpx.Client | None = None

    @property
    def client(self) -> httpx.Client:
        if self._client is None:  # created on first use: thousands of fake members never post themselves
            self._client = httpx.Client(trust_env=False, timeout=10.0)
        return self._client

    @property
    def node_id(self) -> str:
        return self.ident.node_id

    def snapshot(self, **extra: Any) -> dict[str, Any]:
        """A valid schema-2 snapshot of this identity at a new version; ``extra`` overrides or adds fields and
        sections (maps: ``membership={"suspects": {...}}``, ``jobs={"running": [...]}``...)."""
        self.version += 1
        snap = {"schema": SCHEMA_VERSION, "origin": self.node_id, "version": self.version, "addr": "127.0.0.1:9",
                "tags": [], "leaving": False, "resources": {"cpu_percent": 1.0, "gpus": []}}
        snap.update(extra)
        return snap

    def envelope(self, snap: dict[str, Any] | None = None, **kw: Any) -> Envelope:
        return raw_envelope(self.ident, snap if snap is not None else self.snapshot(), token=self.token, **kw)

    def post(self, url: str, envelopes: list[Envelope] = (), *, sender: str | None = None, addr: str = "",
             digest: dict[str, int] | None = None) -> httpx.Response:
        body = encode_gossip(sender or self.node_id, addr, digest or {}, list(envelopes))
        return self.client.post(f"{url}/gossip", content=body, headers=GOSSIP_HEADERS)

    def pull(self, url: str) -> list[Envelope]:
        """Every envelope the agent holds (an empty digest asks for all): how an attacker learns member keys."""
        resp = self.post(url)
        return decode_gossip(resp.content).envelopes


def other_identities(n: int) -> list[Identity]:
    return [Identity.generate() for _ in range(n)]


def random_addr(i: int) -> str:
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}:{1024 + int.from_bytes(os.urandom(2), 'big') % 60000}"
