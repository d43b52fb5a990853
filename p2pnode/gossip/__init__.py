"""Pure gossip cores: :class:`ClusterState` (anti-entropy over signed snapshots), :class:`PeerBook` (addresses),
:class:`DialPolicy` (which advertised addresses may be dialed), :class:`Gossiper` (the push-pull exchange),
:class:`Membership` (alive, suspect, dead, left), :class:`NewsPush` (membership news pushed at once),
:class:`Prober` with :class:`ProbeCodec` (SWIM probes and their authenticated wire) and :class:`TokenBuckets`
(bounded inbound work)."""

from ._dialpolicy import METADATA_ADDRESSES, REFUSAL_REASONS, DialPolicy, addr_refusal
from ._idle import heard_within_s, news_hold_s, quiet_round
from ._membership import (
    PROFILES,
    IllegalTransition,
    Member,
    MemberIndex,
    Membership,
    MembershipConfig,
    MemberState,
    StateChanged,
    expected_confirmations,
    publish_interval_s,
    suspect_after_s,
    suspicion_timeout_s,
)
from ._newspush import PUSH_INTERVAL_DIVISOR, NewsPush
from ._peers import PeerAddr, PeerBook, parse_hostport
from ._probe import Ack, DirectAck, Nack, Ping, PingReq, ProbeConfig, Prober, SendAck, SendNack, SendPing, SendPingReq
from ._probe import Effect as ProbeEffect
from ._probewire import MAX_PACKET_BYTES as MAX_PROBE_PACKET_BYTES
from ._probewire import PROBE_REJECT_REASONS, ProbeCodec, ProbeKeys
from ._protocol import Gossiper, GossipReply, Prepared
from ._ratelimit import TokenBuckets
from ._state import ClusterState, MemberEntry, MergeResult, Verified, carries_news

__all__ = [
    "Ack",
    "MAX_PROBE_PACKET_BYTES",
    "Nack",
    "PROBE_REJECT_REASONS",
    "Ping",
    "PingReq",
    "ProbeCodec",
    "ProbeConfig",
    "ProbeEffect",
    "DirectAck",
    "ProbeKeys",
    "Prober",
    "SendAck",
    "SendNack",
    "SendPing",
    "SendPingReq",
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
    "MemberIndex",
    "MemberState",
    "Membership",
    "MembershipConfig",
    "MergeResult",
    "NewsPush",
    "PUSH_INTERVAL_DIVISOR",
    "PeerAddr",
    "PeerBook",
    "Prepared",
    "StateChanged",
    "TokenBuckets",
    "Verified",
    "addr_refusal",
    "carries_news",
    "expected_confirmations",
    "heard_within_s",
    "news_hold_s",
    "quiet_round",
    "parse_hostport",
    "publish_interval_s",
    "suspect_after_s",
    "suspicion_timeout_s",
]
