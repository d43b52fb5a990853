"""Sync's drivers: data leaves ephemeral nodes for durable ones, verified, and nothing is deleted before R receipts.

The decisions are sync's pure core, :mod:`p2pnode.synccore` (manifests, replica accounting, retention); this
package moves the bytes. Wire: :mod:`._wire` (push bodies, stream headers, request signatures), :mod:`._refuse`
(reasons and :class:`SyncReject`). Blocking I/O: :mod:`._source` (the sender's files, SQLite backups),
:mod:`._store` (the replica store) with :mod:`._index` (replicas held, receipts), :mod:`._partial` (partial files),
:mod:`._splice` (zero-copy stream receive) and :mod:`._retire` (retiring replicas). Trio drivers:
:mod:`._service` (wiring, loops), :mod:`._push` and :mod:`._blocks` (the sender; :mod:`._bucket` paces it),
:mod:`._inbound` and :mod:`._channel` (the receiver), :mod:`._replication` (receipts from peers, the replicated
predicate), :mod:`._possess` (proof of possession: challenges sent and answered). Live WAL-mode databases by their
write-ahead log: :mod:`._walwire` (signed, ordered segments), :mod:`._walsend` (the sender),
:mod:`._walreplica` (replicas applied in order, never torn), :mod:`._walship` (the driver: segments after each
push pass) and :mod:`._walinbound` (``POST /sync/wal``). Distribution, durable to
subscribers: :mod:`._distribute` (publish, serve, fetch, switch) over :mod:`._distfiles` (its files on disk).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._bucket import TokenBucket
    from ._distribute import BLOCKS_PATH, LIST_PATH, MAX_PUBLISH_BODY, PUBLICATION_PATH
    from ._distserve import BlockStream
    from ._possess import CHALLENGE_PATH, MAX_CHALLENGE_BODY
    from ._refuse import REJECT_REASONS, SyncReject
    from ._service import SyncService
    from ._source import LocalFiles, glob_regex
    from ._store import ReplicaStore
    from ._wire import PushItem, decode_push, encode_push, sign_headers, verify_headers

__all__ = [
    "BLOCKS_PATH",
    "BlockStream",
    "LIST_PATH",
    "CHALLENGE_PATH",
    "MAX_PUBLISH_BODY",
    "PUBLICATION_PATH",
    "MAX_CHALLENGE_BODY",
    "LocalFiles",
    "PushItem",
    "REJECT_REASONS",
    "ReplicaStore",
    "SyncReject",
    "SyncService",
    "TokenBucket",
    "decode_push",
    "encode_push",
    "glob_regex",
    "sign_headers",
    "verify_headers",
]

_HOME: dict[str, str] = {
    **dict.fromkeys(('TokenBucket',), '_bucket'),
    **dict.fromkeys(('BLOCKS_PATH', 'LIST_PATH', 'MAX_PUBLISH_BODY', 'PUBLICATION_PATH'), '_distribute'),
    **dict.fromkeys(('BlockStream',), '_distserve'),
    **dict.fromkeys(('CHALLENGE_PATH', 'MAX_CHALLENGE_BODY'), '_possess'),
    **dict.fromkeys(('REJECT_REASONS', 'SyncReject'), '_refuse'),
    **dict.fromkeys(('SyncService',), '_service'),
    **dict.fromkeys(('LocalFiles', 'glob_regex'), '_source'),
    **dict.fromkeys(('ReplicaStore',), '_store'),
    **dict.fromkeys(('PushItem', 'decode_push', 'encode_push', 'sign_headers', 'verify_headers'), '_wire'),
}
"""Each public name's module: :func:`__getattr__` imports it at the name's first use (issue 43: a node that
neither pushes nor keeps replicas never loads the replica store, the sender's files or the pusher)."""


if not TYPE_CHECKING:  # (hidden from mypy, which would read any unknown name as Any)

    def __getattr__(name: str) -> Any:
        """The public name ``name``, imported from its module at its first read and kept in this package
        (PEP 562); ``AttributeError`` for any other name."""
        home = _HOME.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{home}", __name__), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(_HOME))
