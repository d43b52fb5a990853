"""Sync's drivers: data leaves ephemeral nodes for durable ones, verified, and nothing is deleted before R receipts.

The decisions are sync's pure core, :mod:`p2pnode.synccore` (manifests, replica accounting, retention); this
package moves the bytes. Wire: :mod:`._wire` (push bodies, stream headers, request signatures), :mod:`._refuse`
(reasons and :class:`SyncReject`). Blocking I/O: :mod:`._source` (the sender's files, SQLite backups),
:mod:`._store` (the replica store) with :mod:`._index` (replicas held, receipts), :mod:`._partial` (partial files),
:mod:`._splice` (zero-copy stream receive) and :mod:`._retire` (retiring replicas). Trio drivers:
:mod:`._service` (wiring, loops), :mod:`._push` and :mod:`._blocks` (the sender), :mod:`._inbound` and
:mod:`._channel` (the receiver), :mod:`._replication` (receipts from peers, the replicated predicate),
:mod:`._possess` (proof of possession: challenges sent and answered). Live WAL-mode databases by their
write-ahead log: :mod:`._walwire` (signed, ordered segments), :mod:`._walsend` (the sender),
:mod:`._walreplica` (replicas applied in order, never torn) and :mod:`._walship` (the driver: segments after each
push pass, ``POST /sync/wal``). Distribution, durable to
subscribers: :mod:`._distribute` (publish, serve, fetch, switch) over :mod:`._distfiles` (its files on disk).
"""

from __future__ import annotations

from ._distribute import BLOCKS_PATH, LIST_PATH, MAX_PUBLISH_BODY, PUBLICATION_PATH
from ._distserve import BlockStream
from ._possess import CHALLENGE_PATH, MAX_CHALLENGE_BODY
from ._push import TokenBucket
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
