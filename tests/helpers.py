"""Shared test helpers: snapshots signed by throwaway identities."""

from __future__ import annotations

from typing import Any

from p2pnode.identity import Identity
from p2pnode.snapshot import SCHEMA_VERSION, Snapshot, decode_snapshot
from p2pnode.wire import Envelope, seal_snapshot


def snapshot(ident: Identity, version: int, **extra: Any) -> dict[str, Any]:
    """A valid schema-2 snapshot map of ``ident`` at ``version``; ``extra`` overrides or adds header fields and
    whole sections (``membership={"incarnation": 2}``, ``jobs={"catalog_digest": ...}``)."""
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
    """:func:`snapshot` sealed by ``ident`` (endorsed with ``token`` when given)."""
    return seal_snapshot(ident, snapshot(ident, version, **extra), token=token)


def typed(env: Envelope) -> Snapshot:
    """The typed snapshot an envelope carries (what ``ClusterState.set_local`` takes)."""
    return decode_snapshot(env.body)


class FakeContext:
    """A :class:`p2pnode.node.NodeContext` over plain fields, for testing a subsystem without the agent.

    Members are what :meth:`put` was given (typed snapshots, keys, states); ``states`` may be set directly
    (``ctx.states[origin] = MemberState.DEAD``). Requests for publication and events are recorded:
    ``published`` (count of :meth:`publish_soon`), ``published_to`` (node ids), ``versions_pushed`` (count of
    :meth:`publish_to`: snapshot versions published at once), ``events`` ``[(name, payload)]``,
    ``quarantined`` ``[(origin, where, exc)]``. ``now()`` is ``clock()`` (default: 0.0).
    """

    def __init__(self, config: Any, identity: Identity | None = None, *, data_dir: Any = None,
                 clock: Any = None) -> None:
        from pathlib import Path

        self.config = config
        self.identity = identity if identity is not None else Identity.generate()
        self.node_id = self.identity.node_id
        self.data_dir = Path(data_dir if data_dir is not None else config.agent.data_dir).absolute()
        self.leaving = False
        self.last_sample: Any = None
        self.degradation_level = 0
        self.client: Any = None
        self.states: dict[str, Any] = {}
        self.snapshots: dict[str, Any] = {}  # origin -> (Snapshot, key, received_at)
        self.published = 0
        self.published_to: list[str] = []
        self.versions_pushed = 0
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.quarantined: list[tuple[str, str, Exception]] = []
        self._clock = clock

    def now(self) -> float:
        return self._clock() if self._clock is not None else 0.0

    def put(self, snapshot: Any, key: bytes, state: Any = None, *, received_at: float = 0.0) -> None:
        """Hold ``snapshot`` (a :class:`p2pnode.snapshot.Snapshot`) as its origin's newest, signed by ``key``;
        ``state`` (default: the one held, else ALIVE) becomes the origin's membership state."""
        from p2pnode.gossip import MemberState

        self.snapshots[snapshot.origin] = (snapshot, key, received_at)
        if state is not None or snapshot.origin not in self.states:
            self.states[snapshot.origin] = state if state is not None else MemberState.ALIVE

    def members(self, *, live: bool = False) -> list[Any]:
        from p2pnode.gossip import MemberState

        out = [m for m in (self.member(o) for o in self.snapshots) if m is not None]
        return [m for m in out if m.state in (MemberState.ALIVE, MemberState.SUSPECT)] if live else out

    def member(self, origin: str) -> Any:
        from p2pnode.gossip import MemberState
        from p2pnode.node import Member

        held = self.snapshots.get(origin)
        if held is None:
            return None
        snap, key, at = held
        state = MemberState.ALIVE if origin == self.node_id else self.states.get(origin, MemberState.ALIVE)
        return Member(origin, state, snap, key, at)

    def section(self, origin: str, kind: type) -> Any:
        from p2pnode.snapshot import section_of

        held = self.snapshots.get(origin)
        return section_of(held[0], kind) if held is not None else None

    def state_of(self, origin: str) -> Any:
        return self.states.get(origin)

    def publish_soon(self) -> None:
        self.published += 1

    def publish_to(self, *node_ids: str) -> None:
        self.versions_pushed += 1  # one snapshot version, however many nodes hear of it
        self.published_to.extend(node_ids)

    def emit_event(self, name: str, payload: dict[str, Any]) -> None:
        self.events.append((name, payload))

    def quarantine(self, origin: str, where: str, exc: Exception) -> None:
        self.quarantined.append((origin, where, exc))
        self.snapshots.pop(origin, None)
