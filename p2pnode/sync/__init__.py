"""Sync: data leaves ephemeral nodes for durable ones, verified, and nothing is deleted before R receipts.

Pure parts: :mod:`._manifest` (blocks, hashes, roots, path rules), :mod:`._ledger` (receipts, rendezvous
targets, what may be deleted). Blocking I/O: :mod:`._source` (the sender's files, SQLite backups),
:mod:`._store` (the receiver's replicas and transfers). Wire: :mod:`._wire`. Trio driver: :mod:`._service`.
"""

from ._ledger import Receipt, ReceiptIndex, effective_r, may_delete, plan_targets, rendezvous_rank
from ._manifest import Manifest, PathError, block_size_for, changed_blocks, check_rel_path, hash_file
from ._service import REJECT_REASONS, SyncService, TokenBucket
from ._source import LocalFiles, glob_regex
from ._store import PushItem, ReplicaStore, SyncReject
from ._wire import decode_push, encode_push, sign_headers, verify_headers

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
