"""The p2pnode exception tree.

::

    P2PNodeError                      base of everything p2pnode raises on purpose
    ├── ConfigError                   bad config file, env variable or flag (our operator's input)
    ├── IdentityError                 key file missing, unreadable or of the wrong type
    └── PeerError                     something a peer sent us is unacceptable
        └── RejectedMessage           carries ``reason`` (a :class:`RejectReason`), counted by the receiver

Errors caused by a peer are always :class:`PeerError`; library exceptions (``msgpack``,
``cryptography``) are translated at the boundary in :mod:`p2pnode.wire` and never leak.
"""

from __future__ import annotations

import enum

__all__ = [
    "DATA_ERRORS",
    "ConfigError",
    "IdentityError",
    "P2PNodeError",
    "PeerError",
    "RejectReason",
    "RejectedMessage",
]


class P2PNodeError(Exception):
    """Base class of every exception p2pnode raises on purpose."""


class ConfigError(P2PNodeError):
    """An invalid configuration value; the message names the source (file, env var or flag) and the key."""


class IdentityError(P2PNodeError):
    """The node key in the data dir cannot be loaded or created."""


class PeerError(P2PNodeError):
    """Input from a peer was unacceptable."""


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
