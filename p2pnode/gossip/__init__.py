"""Pure gossip cores: :class:`ClusterState` (anti-entropy over signed snapshots), :class:`PeerBook` (addresses),
:class:`DialPolicy` (which advertised addresses may be dialed), :class:`Gossiper` (the push-pull exchange),
:class:`Membership` (alive, suspect, dead, left) and :class:`TokenBuckets` (bounded inbound work)."""

from ._dialpolicy import METADATA_ADDRESSES, REFUSAL_REASONS, DialPolicy, addr_refusal
from ._membership import (
    PROFILES,
    IllegalTransition,
    Member,
    Membership,
    MembershipConfig,
    MemberState,
    StateChanged,
    expected_confirmations,
    publish_interval_s,
    suspect_after_s,
    suspicion_timeout_s,
)
from ._peers import PeerAddr, PeerBook, parse_hostport
from ._protocol import Gossiper, GossipReply, Prepared
from ._ratelimit import TokenBuckets
from ._state import ClusterState, MemberEntry, MergeResult, Verified, carries_news

__all__ = [
    "PROFILES",
    "METADATA_ADDRESSES",
    "REFUSAL_REASONS",
    "ClusterState",
    "DialPolicy",
    "GossipReply",
    "Gossiper",
    "IllegalTransition",
    "Member",
    "MemberEntry",
    "MemberState",
    "Membership",
    "MembershipConfig",
    "MergeResult",
    "PeerAddr",
    "PeerBook",
    "Prepared",
    "StateChanged",
    "TokenBuckets",
    "Verified",
    "addr_refusal",
    "carries_news",
    "expected_confirmations",
    "parse_hostport",
    "publish_interval_s",
    "suspect_after_s",
    "suspicion_timeout_s",
]
