"""The p2pnode exception tree: everything p2pnode raises on purpose, for its operator, its users or its peers.

::

    P2PNodeError                          base of everything p2pnode raises on purpose
    ├── ConfigError                       bad config file, env variable or flag (our operator's input)
    │   └── KeyringError                  p2pnode.keyring: the keyring file or a cluster token is unusable
    ├── CatalogError                      p2pnode.scheduler: the job catalog is invalid; ``errors`` lists each problem
    ├── SignalError                       p2pnode.scheduler: a training signal is out of range; ``reasons``
    ├── IdentityError                     key file missing, unreadable or of the wrong type
    ├── ResourceUnavailable               p2pnode.guard: a resource a script requires is not there within its limit
    ├── ProviderError                     p2pnode.providers: a scaling provider's call failed (script failed or hung,
    │                                     bad output, API refused); retried after the cooldown
    ├── PathError           (ValueError)  a replica path that is not a plain relative path (from a peer or on disk)
    ├── StallRejected       (ValueError)  p2pnode.resources: a pressure stall (PSI) file refused; ``reason``
    ├── WalFormatError      (ValueError)  p2pnode.synccore: bytes that are not a SQLite WAL header (a local file)
    ├── InternalError     (RuntimeError)  a bug in p2pnode: one of its own rules was broken, never a peer's doing
    │   └── IllegalTransition             a membership transition that is not in the table
    └── PeerError                         something a peer (or a client) sent us is unacceptable
        ├── RejectedMessage               carries ``reason`` (a :class:`RejectReason`), counted by the receiver
        ├── SyncRejected                  refused sync input: ``reason`` (a counter label), ``detail``, HTTP ``status``
        │   └── SyncReplyRejected         a peer's reply to this node's sync request refused (push reply, data-channel
        │                                 frame, receipt list, listing); ``reason`` one of ``REPLY_REASONS``
        ├── PublicationRefused            p2pnode.synccore: a published file's signed manifest refused; ``reason``
        ├── RequestAuthError              p2pnode.reqauth: a request's authentication refused; ``reason``, ``detail``
        ├── InputError                    p2pnode.inputs: a request's body, query or header refused; ``reason``,
        │                                 ``detail``, HTTP ``status``
        ├── InvalidIntent   (ValueError)  p2pnode.node: an operator intent that would not decode; never kept
        └── GossipTransportError (OSError) p2pnode.drivers: a gossip request to a peer failed (connection, timeout,
                                          an oversized or malformed reply)

Errors caused by a peer are always :class:`PeerError`; library exceptions (``msgpack``, ``msgspec``,
``nacl``) are translated at the boundary in :mod:`p2pnode.wire` and never leak. Classes that keep a
built-in base in parentheses above (``ValueError``, ``RuntimeError``, ``OSError``) do so for callers that
caught that built-in before they joined the tree. Classes named with a module are defined there, beside the
code that raises them, and derive from the classes here; the rest are defined in this module.
:data:`DATA_ERRORS` is not part of the tree: it lists what a peer's data that slipped past the typed decoder can
raise in a consumer.
"""

from __future__ import annotations

import enum

__all__ = [
    "DATA_ERRORS",
    "ConfigError",
    "IdentityError",
    "IllegalTransition",
    "InternalError",
    "P2PNodeError",
    "PathError",
    "PeerError",
    "RejectReason",
    "RejectedMessage",
    "SyncRejected",
    "SyncReplyRejected",
]


class P2PNodeError(Exception):
    """Base class of every exception p2pnode raises on purpose."""


class ConfigError(P2PNodeError):
    """An invalid configuration value; the message names the source (file, env var or flag) and the key."""


class IdentityError(P2PNodeError):
    """The node key in the data dir cannot be loaded or created."""


class PathError(P2PNodeError, ValueError):
    """A replica path that is not a plain relative path: absolute, ``..`` or ``.`` or empty components, NUL,
    backslash or control characters, or too long (see :func:`p2pnode.sync.check_rel_path`). Raised for a path
    a peer sent (the sync store answers it as :class:`SyncRejected` ``path_escape``) and for a local file whose
    name cannot be replicated."""


class InternalError(P2PNodeError, RuntimeError):
    """A bug in p2pnode: one of its own rules was broken. Never caused by a peer's input (that is a
    :class:`PeerError`); seeing one means a fix is needed here, not in the cluster."""


class IllegalTransition(InternalError):
    """A membership state transition that is not in :mod:`p2pnode.gossip._membership`'s table was attempted;
    the message names the member, its state and the event."""


class PeerError(P2PNodeError):
    """Input from a peer (or a client of the HTTP API) was unacceptable."""


class RejectReason(str, enum.Enum):
    """Why an inbound gossip message or envelope was dropped. Each value is a counter label."""

    OVERSIZED = "oversized"  # body or snapshot above its byte bound
    MALFORMED = "malformed"  # not decodable msgpack
    BAD_TYPE = "bad_type"  # decodable, but a field is missing or has the wrong type/range
    BAD_SCHEMA = "bad_schema"  # unknown schema version
    BAD_SIGNATURE = "bad_signature"  # Ed25519 signature does not verify over the body bytes
    WRONG_KEY = "wrong_key"  # public key does not derive the claimed origin id, or key changed
    MISMATCH = "mismatch"  # envelope origin/version differ from those inside the signed body
    STALE = "stale"  # version not newer than the one held (replay or race)
    UNENDORSED = "unendorsed"  # token trust mode: key not endorsed by the cluster token
    IMPERSONATION = "impersonation"  # an envelope names this node's own id but is not signed by its key
    MEMBER_CAP = "member_cap"  # a new origin while the cluster view already holds max_members
    DUPLICATE = "duplicate"  # an older copy of an origin that the same message also carries at a higher version
    OVER_BUDGET = "over_budget"  # beyond the signature checks one message may cost; sent again by anti-entropy
    TOO_SLOW = "too_slow"  # the body did not arrive within its deadline (a slowloris holds no slot for long)


DATA_ERRORS: tuple[type[Exception], ...] = (
    TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError, ZeroDivisionError,
)
"""What a peer's data that slipped past the typed decoder can raise in a consumer. Caught per member, never
around a whole loop: the member is quarantined (:meth:`p2pnode.gossip.ClusterState.quarantine`), not the agent."""


class RejectedMessage(PeerError):
    """A peer's message or envelope was rejected for ``reason``; ``detail`` says what exactly, ``origin`` names
    the envelope's origin when one was rejected (``None`` for a whole message)."""

    def __init__(self, reason: RejectReason, detail: str = "", *, origin: str | None = None) -> None:
        self.reason = reason
        self.detail = detail
        self.origin = origin
        super().__init__(f"{reason.value}: {detail}" if detail else reason.value)


class SyncRejected(PeerError):
    """Sync input refused (a push, a block stream, a fetched receipt list, or a block in them).

    ``reason`` is one of :attr:`REASONS` (the label of ``p2pnode_sync_rejected_total{reason}``; another value is
    our own bug and raises ``ValueError``), ``detail`` says what exactly, :attr:`status` is the HTTP status the
    refusal is answered with: 413 oversized, 401 bad signature, 403 not a member, 409 stale version, a WAL
    segment out of order (``out_of_order``) or a replayed challenge, 507 disk critical or full (the sender backs
    off), 503 busy, overloaded or over a member's challenge byte budget (``over_budget``; retry soon), 408 too
    slow, 400 malformed, escaping path or disconnected, 422 for a well-formed request with bad content (manifest,
    block, commit, a WAL segment's shape: ``bad_segment``).
    Some reasons are this node's state rather than the peer's fault (``backpressure``, ``no_space``, ``busy``,
    ``overloaded``): they refuse the peer's input all the same, so they sit here."""

    REASONS = (
        "malformed", "oversized", "bad_signature", "not_member", "path_escape", "bad_manifest",
        "block_out_of_range", "bad_block_length", "bad_block_hash", "stale_version", "backpressure", "no_space",
        "corrupt_on_commit", "busy", "receipts_mismatch", "overloaded", "too_slow", "disconnected",
        "reply_malformed", "reply_invalid", "reply_oversized", "replayed", "over_budget", "out_of_order",
        "bad_segment",
    )
    STATUS = {"oversized": 413, "bad_signature": 401, "not_member": 403, "stale_version": 409,
              "backpressure": 507, "no_space": 507, "busy": 503, "overloaded": 503, "over_budget": 503, "too_slow": 408,
              "disconnected": 400, "malformed": 400, "path_escape": 400, "replayed": 409, "out_of_order": 409}

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in self.REASONS:
            raise ValueError(f"unknown sync rejection reason {reason!r}")
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail

    @property
    def status(self) -> int:
        """The HTTP status this refusal is answered with (422 unless :attr:`STATUS` names another)."""
        return self.STATUS.get(self.reason, 422)


class SyncReplyRejected(SyncRejected):
    """A peer's reply to this node's sync request refused: a ``POST /sync/push`` reply, a data-channel frame, a
    ``GET /sync/receipts`` list or a ``GET /sync/manifest`` listing (decoded in :mod:`p2pnode.inputs`).

    ``reason`` is one of :attr:`REPLY_REASONS`: ``reply_malformed`` (not msgpack or JSON, text that is not UTF-8,
    truncated, nested too deep), ``reply_invalid`` (decodable, but a field is missing, of the wrong type or out of
    its bounds: a huge number, NaN, a control character, a list beyond its cap; or a block index beyond the file
    asked about), ``reply_oversized`` (beyond its byte bound), ``receipts_mismatch`` (a fetched receipt list that
    does not hash to the digest in the holder's signed snapshot). Counted by the asking node under that reason, like
    every sync refusal (``p2pnode_sync_rejected_total{reason}``, ``/sync/status``); the request fails, the loop that
    made it carries on. :attr:`status` means nothing here (no one is answered)."""

    REPLY_REASONS = ("reply_malformed", "reply_invalid", "reply_oversized", "receipts_mismatch")

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in self.REPLY_REASONS:
            raise ValueError(f"unknown sync reply rejection reason {reason!r}")
        super().__init__(reason, detail)
