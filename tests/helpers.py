"""Shared test helpers: snapshots signed by throwaway identities."""

from __future__ import annotations

from typing import Any

from p2pnode.identity import Identity
from p2pnode.wire import SCHEMA_VERSION, Envelope, seal_snapshot


def snapshot(ident: Identity, version: int, **extra: Any) -> dict[str, Any]:
    snap = {
        "schema": SCHEMA_VERSION,
        "origin": ident.node_id,
        "version": version,
        "addr": extra.pop("addr", f"10.9.9.9:{8000 + version % 1000}"),
        "tags": [],
        "leaving": False,
        "resources": {"cpu_percent": 1.0, "gpus": []},
    }
    snap.update(extra)
    return snap


def envelope(ident: Identity, version: int, *, token: str | None = None, **extra: Any) -> Envelope:
    return seal_snapshot(ident, snapshot(ident, version, **extra), token=token)
