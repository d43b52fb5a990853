"""Sync's pure core: manifests (blocks, hashes, roots, replica path rules), replica accounting (receipts to
confirmations, rendezvous targets, R, what may be deleted) and replica retention on durable nodes.

Pure as a whole: the standard library and blake3; no trio, no httpx. :mod:`._manifest` (:class:`Manifest`,
:func:`changed_blocks`, :func:`check_rel_path`; :func:`hash_file` is its one blocking read, run in a thread by
the drivers), :mod:`._ledger` (:class:`Receipt`, :class:`ReceiptIndex`, :func:`plan_targets`,
:func:`may_delete`), :mod:`._retention` (:func:`plan_retention` and its :class:`RetentionPlan`),
:mod:`._possession` (proof of possession: which holders to challenge and when, :class:`PossessionBook`,
:func:`possession_proof`). The drivers that move the bytes are in :mod:`p2pnode.sync`.
"""

from __future__ import annotations

from ._ledger import Receipt, ReceiptIndex, deletable, effective_r, may_delete, plan_targets, rendezvous_rank
from ._manifest import (
    BLOCK_HASH_BYTES,
    MAX_BLOCK_BYTES,
    MAX_PATH_BYTES,
    MIN_BLOCK_BYTES,
    SQLITE_MAGIC,
    SQLITE_MIN_BLOCK_BYTES,
    Manifest,
    PathError,
    block_size_for,
    changed_blocks,
    check_rel_path,
    hash_block,
    hash_file,
    manifest_root,
)
from ._possession import (
    CHALLENGE_BLOCKS,
    FAIL_REASONS,
    NONCE_BYTES,
    PossessionBook,
    PossessionPolicy,
    PushAgain,
    SendChallenge,
    choose_blocks,
    possession_proof,
)
from ._retention import (
    KEEP_REASONS,
    RETIRE_REASONS,
    Decision,
    Held,
    RetentionPlan,
    RetentionPolicy,
    listing_digest,
    note_unlisted,
    outranks,
    plan_retention,
)

__all__ = [
    "BLOCK_HASH_BYTES",
    "CHALLENGE_BLOCKS",
    "FAIL_REASONS",
    "NONCE_BYTES",
    "PossessionBook",
    "PossessionPolicy",
    "PushAgain",
    "SendChallenge",
    "choose_blocks",
    "possession_proof",
    "KEEP_REASONS",
    "MAX_BLOCK_BYTES",
    "MAX_PATH_BYTES",
    "MIN_BLOCK_BYTES",
    "RETIRE_REASONS",
    "SQLITE_MAGIC",
    "SQLITE_MIN_BLOCK_BYTES",
    "Decision",
    "Held",
    "Manifest",
    "PathError",
    "Receipt",
    "ReceiptIndex",
    "RetentionPlan",
    "RetentionPolicy",
    "block_size_for",
    "changed_blocks",
    "check_rel_path",
    "deletable",
    "effective_r",
    "hash_block",
    "hash_file",
    "listing_digest",
    "manifest_root",
    "may_delete",
    "note_unlisted",
    "outranks",
    "plan_retention",
    "plan_targets",
    "rendezvous_rank",
]
