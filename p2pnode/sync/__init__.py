"""Sync: data leaves ephemeral nodes for durable ones, verified, and nothing is deleted before R receipts.

Pure parts: :mod:`._manifest` (blocks, hashes, roots, path rules), :mod:`._ledger` (receipts, rendezvous
targets, what may be deleted). Wire: :mod:`._wire` (push bodies, stream headers, request signatures),
:mod:`._refuse` (reasons and :class:`SyncReject`). Blocking I/O: :mod:`._source` (the sender's files, SQLite
backups), :mod:`._store` (the replica store) with :mod:`._index` (replicas held, receipts), :mod:`._partial`
(partial files) and :mod:`._splice` (zero-copy stream receive). Trio drivers: :mod:`._service` (wiring, loops),
:mod:`._push` and :mod:`._blocks` (the sender), :mod:`._inbound` and :mod:`._channel` (the receiver),
:mod:`._replication` (receipts from peers, the replicated predicate).

The names below are loaded on first use (PEP 562), so ``import p2pnode.sync._manifest`` or ``._ledger`` pulls in
neither trio nor httpx.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._ledger import Receipt, ReceiptIndex, effective_r, may_delete, plan_targets, rendezvous_rank
    from ._manifest import Manifest, PathError, block_size_for, changed_blocks, check_rel_path, hash_file
    from ._push import TokenBucket
    from ._refuse import REJECT_REASONS, SyncReject
    from ._service import SyncService
    from ._source import LocalFiles, glob_regex
    from ._store import ReplicaStore
    from ._wire import PushItem, decode_push, encode_push, sign_headers, verify_headers

_WHERE = {
    "Receipt": "_ledger", "ReceiptIndex": "_ledger", "effective_r": "_ledger", "may_delete": "_ledger",
    "plan_targets": "_ledger", "rendezvous_rank": "_ledger",
    "Manifest": "_manifest", "PathError": "_manifest", "block_size_for": "_manifest", "changed_blocks": "_manifest",
    "check_rel_path": "_manifest", "hash_file": "_manifest",
    "REJECT_REASONS": "_refuse", "SyncReject": "_refuse",
    "SyncService": "_service", "TokenBucket": "_push",
    "LocalFiles": "_source", "glob_regex": "_source",
    "ReplicaStore": "_store",
    "PushItem": "_wire", "decode_push": "_wire", "encode_push": "_wire", "sign_headers": "_wire",
    "verify_headers": "_wire",
}

__all__ = [
    "LocalFiles",
    "Manifest",
    "PathError",
    "PushItem",
    "REJECT_REASONS",
    "Receipt",
    "ReceiptIndex",
    "ReplicaStore",
    "SyncReject",
    "SyncService",
    "TokenBucket",
    "block_size_for",
    "changed_blocks",
    "check_rel_path",
    "decode_push",
    "effective_r",
    "encode_push",
    "glob_regex",
    "hash_file",
    "may_delete",
    "plan_targets",
    "rendezvous_rank",
    "sign_headers",
    "verify_headers",
]
assert set(__all__) == set(_WHERE)


def __getattr__(name: str) -> Any:
    """Load ``name`` from its module on first use and keep it here."""
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
