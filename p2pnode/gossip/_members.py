"""A node's member table stored by columns (one array per field), and the id-to-slot index it is keyed by. Pure.

:class:`p2pnode.gossip.Membership` keeps what it knows of each member in a :class:`MemberTable`: a member is a
*slot* (a small int), and each field is one ``array.array`` (the state as one byte, incarnation and version as
int64, the four times as float64, the order of addition as int64), one byte flagging an accuser, and for the suspect
lists one list of references to the snapshots' own dicts: 66 bytes per member, against about 230 for one object per
member in a dict (a struct, its dict entry, its boxed numbers). The simulator (:mod:`p2pnode.sim`) holds one table
per simulated node, N² members in all, and shares one :class:`MemberIndex` (id <-> slot) across them. An agent's
table has an index of its own.

Slots are never freed: a reaped member's slot is empty (state 0) and the same id gets it back. An agent's index so
grows by one slot per distinct node id ever heard of (66 bytes each), not per restart or exchange.

:attr:`p2pnode.gossip.Membership.members` is a read-only :class:`MembersView` of the table: a mapping from node id to
a :class:`Member`, a light handle onto one slot built on access (its fields read, and for tests written, through to
the columns), in the order the members were first heard (or heard again after a reap), as a dict would keep them.
"""

from __future__ import annotations

import enum
import math
from array import array
from collections.abc import Callable, Iterator
from itertools import compress

import msgspec


class MemberState(str, enum.Enum):
    """A member's state as this node sees it; only :meth:`Membership` transitions (the table above) change it."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


ABSENT, ALIVE, SUSPECT, DEAD, LEFT = 0, 1, 2, 3, 4
"""The state column's codes: 0 is no member in that slot (never heard of, or reaped)."""
STATES: tuple[MemberState | None, ...] = (None, MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD,
                                          MemberState.LEFT)
"""Code -> state (``STATES[0]`` is ``None``: no member)."""
CODES: dict[MemberState | None, int] = {s: c for c, s in enumerate(STATES)}

_A, _S, _D, _L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
_TRANSITIONS: dict[tuple[MemberState | None, str], MemberState | None] = {
    (None, "heard"): _A,
    (None, "leave"): _L,
    (_A, "timeout"): _S,
    (_A, "suspected"): _S,
    (_S, "timeout"): _D,
    (_S, "heard"): _A,
    (_D, "heard"): _A,
    (_L, "heard"): _A,
    (_A, "leave"): _L,
    (_S, "leave"): _L,
    (_D, "leave"): _L,
    (_D, "reap"): None,
    (_L, "reap"): None,
}
_CODE_TRANSITIONS: dict[tuple[int, str], int] = {(CODES[o], e): CODES[n] for (o, e), n in _TRANSITIONS.items()}
""":data:`_TRANSITIONS` by the state column's codes (0: no member)."""


class StateChanged(msgspec.Struct, frozen=True):
    """Event: ``node_id`` went from ``old`` to ``new`` (``None`` = not a member / reaped) at ``at``."""

    node_id: str
    old: MemberState | None
    new: MemberState | None
    at: float


NO_SUSPECTS: dict[str, int] = {}
"""The suspect list of every member whose snapshot lists none: one shared empty dict instead of one per member and
observer (N² of them in a simulated cluster). Never mutated: a member's list is only ever replaced (nothing in the
package writes into a member's ``suspects``)."""


class MemberIndex:
    """Node id <-> slot, only ever growing: ``slots[node_id]`` and ``ids[slot]``. One per agent; in the simulator one
    for all its nodes (each node's table then has a slot for every id, empty where it knows no such member)."""

    __slots__ = ("ids", "slots")

    def __init__(self, ids: tuple[str, ...] | list[str] = ()) -> None:
        self.slots: dict[str, int] = {}
        self.ids: list[str] = []
        for node_id in ids:
            self.slot(node_id)

    def slot(self, node_id: str) -> int:
        """``node_id``'s slot, given it now when it has none."""
        s = self.slots.get(node_id)
        if s is None:
            s = self.slots[node_id] = len(self.ids)
            self.ids.append(node_id)
        return s


class MemberTable:
    """The columns (see the module docstring). ``count`` members are present; ``seq[s]`` orders them by when they
    were (last) added; ``ordered`` is True while that order is the slots' order (every add took a slot above every
    present one), so that listing them costs no sort. Only :class:`p2pnode.gossip.Membership` writes here."""

    __slots__ = ("acc", "acked", "count", "heard", "inc", "index", "ordered", "seq", "since", "state", "susp", "up",
                 "version", "_next_seq", "_top")

    def __init__(self, index: MemberIndex) -> None:
        self.index = index
        self.state = array("b")
        self.inc = array("q")
        self.version = array("q")
        self.heard = array("d")
        """last_heard_at: when the newest version was taken (local monotonic seconds)."""
        self.since = array("d")
        """state_since"""
        self.up = array("d")
        """up_since"""
        self.acked = array("d")
        """last_acked_at (-inf: never)"""
        self.seq = array("q")
        self.susp: list[dict[str, int]] = []
        self.acc = bytearray()
        """1 where the member's newest snapshot lists suspects (an accuser), else 0: one byte, not a set entry (a
        simulated cluster where every node accuses a dead leader would hold N² of those)."""
        self.count = 0
        self.ordered = True
        self._top = -1
        self._next_seq = 0

    def slot_of(self, node_id: str) -> int:
        """The slot of ``node_id`` when it is a member here, else -1."""
        s = self.index.slots.get(node_id, -1)
        return s if 0 <= s < len(self.state) and self.state[s] else -1

    def add(self, node_id: str, code: int, incarnation: int, version: int, now: float,
            suspects: dict[str, int]) -> int:
        """A new member (its slot empty): heard, state since and up since ``now``, never acked. Returns its slot."""
        s = self.index.slot(node_id)
        if s >= len(self.state):
            self._grow(max(s + 1, len(self.index.ids)))
        if s < self._top:
            self.ordered = False
        self._top = max(self._top, s)
        self.state[s], self.inc[s], self.version[s] = code, incarnation, version
        self.heard[s] = self.since[s] = self.up[s] = now
        self.acked[s] = -math.inf
        self.susp[s] = suspects
        self.acc[s] = bool(suspects)
        self.seq[s] = self._next_seq
        self._next_seq += 1
        self.count += 1
        return s

    def add_many(self, slots: list[int], code: int, incarnation: int, version: int, now: float) -> None:
        """:meth:`add` of each of ``slots`` (empty, distinct) in turn, listing no suspects, by columns (numpy)."""
        import numpy as np

        if not slots:
            return
        at = np.array(slots, dtype=np.int64)
        top = int(at.max())
        if top >= len(self.state):
            self._grow(max(top + 1, len(self.index.ids)))
        if slots[0] < self._top or bool(np.any(np.diff(at) < 0)):
            self.ordered = False
        self._top = max(self._top, top)
        np.frombuffer(self.state, dtype=np.int8)[at] = code
        np.frombuffer(self.inc, dtype=np.int64)[at] = incarnation
        np.frombuffer(self.version, dtype=np.int64)[at] = version
        for col in (self.heard, self.since, self.up):
            np.frombuffer(col, dtype=np.float64)[at] = now
        np.frombuffer(self.acked, dtype=np.float64)[at] = -math.inf
        np.frombuffer(self.seq, dtype=np.int64)[at] = np.arange(self._next_seq, self._next_seq + len(slots))
        self._next_seq += len(slots)
        self.count += len(slots)

    def remove(self, s: int) -> None:
        self.state[s] = ABSENT
        self.susp[s] = NO_SUSPECTS
        self.acc[s] = 0
        self.count -= 1

    def _grow(self, size: int) -> None:
        k = size - len(self.state)
        self.state.frombytes(bytes(k))
        for ints in (self.inc, self.version, self.seq):
            ints.frombytes(bytes(8 * k))
        for floats in (self.heard, self.since, self.up, self.acked):
            floats.frombytes(bytes(8 * k))
        self.susp.extend([NO_SUSPECTS] * k)
        self.acc.extend(bytes(k))

    def accusers(self) -> Iterator[int]:
        """The slots of the members whose newest snapshot lists suspects, lazily, in slot order. Each next one by
        ``bytearray.find`` (memchr): while few members accuse, a pass costs microseconds, not one step per slot
        (10,000 slots: about 100 µs by ``compress``, read for every new accusation a node takes)."""
        find = self.acc.find
        s = find(1)
        while s >= 0:
            yield s
            s = find(1, s + 1)

    def slots(self) -> list[int]:
        """The present members' slots, in the order they were (last) added."""
        present = list(compress(range(len(self.state)), self.state))
        if not self.ordered:
            present.sort(key=self.seq.__getitem__)
        return present


class Member:
    """One member as this node sees it: a handle onto its slot of a :class:`MemberTable` (fields read from, and
    written to, the columns). Times are local monotonic seconds. Built on access by :class:`MembersView`; only valid
    while the member is present (a reaped member's handle reads an empty slot)."""

    __slots__ = ("_s", "_t", "node_id")

    def __init__(self, table: MemberTable, slot: int, node_id: str) -> None:
        self._t, self._s, self.node_id = table, slot, node_id

    def __repr__(self) -> str:
        return (f"Member({self.node_id!r}, {self.state}, incarnation={self.incarnation}, version={self.version}, "
                f"last_heard_at={self.last_heard_at}, state_since={self.state_since}, suspects={self.suspects})")

    @property
    def state(self) -> MemberState:
        st = STATES[self._t.state[self._s]]
        assert st is not None, f"{self.node_id} is no longer a member"
        return st

    @state.setter
    def state(self, value: MemberState) -> None:  # (tests set up states the timers would take long to reach)
        self._t.state[self._s] = CODES[value]

    @property
    def incarnation(self) -> int:
        return self._t.inc[self._s]

    @property
    def version(self) -> int:
        return self._t.version[self._s]

    @property
    def last_heard_at(self) -> float:
        return self._t.heard[self._s]

    @property
    def state_since(self) -> float:
        return self._t.since[self._s]

    @property
    def suspects(self) -> dict[str, int]:
        """Whom this member's newest snapshot says it suspects: ``{node_id: incarnation}`` (not to be mutated)."""
        return self._t.susp[self._s]

    @property
    def up_since(self) -> float:
        """When this node first heard the member's current run: reset by a new incarnation (a restart or a
        refutation) and by a return from dead or left (local monotonic seconds; leader settling uses it)."""
        return self._t.up[self._s]

    @property
    def last_acked_at(self) -> float:
        """When a probe of this member was last acknowledged (directly or through a relay): a sign of life that
        holds off the silence timer like a new version does."""
        return self._t.acked[self._s]


class MembersView:
    """The read-only mapping ``node id -> Member`` of a table (see the module docstring)."""

    __slots__ = ("_t",)

    def __init__(self, table: MemberTable) -> None:
        self._t = table

    def __len__(self) -> int:
        return self._t.count

    @property
    def table(self) -> MemberTable:
        """The columns themselves, to read in bulk (the simulator's numpy passes); never to be written."""
        return self._t

    def __contains__(self, node_id: object) -> bool:
        return isinstance(node_id, str) and self._t.slot_of(node_id) >= 0

    def __getitem__(self, node_id: str) -> Member:
        s = self._t.slot_of(node_id)
        if s < 0:
            raise KeyError(node_id)
        return Member(self._t, s, node_id)

    def get(self, node_id: str, default: Member | None = None) -> Member | None:
        s = self._t.slot_of(node_id)
        return Member(self._t, s, node_id) if s >= 0 else default

    def __iter__(self) -> Iterator[str]:
        ids = self._t.index.ids
        return iter([ids[s] for s in self._t.slots()])

    def keys(self) -> list[str]:
        return list(self)

    def values(self) -> list[Member]:
        t, ids = self._t, self._t.index.ids
        return [Member(t, s, ids[s]) for s in t.slots()]

    def items(self) -> list[tuple[str, Member]]:
        t, ids = self._t, self._t.index.ids
        return [(ids[s], Member(t, s, ids[s])) for s in t.slots()]

    def __eq__(self, other: object) -> bool:
        """Equal to a mapping with the same ids (members compare by their fields' values)."""
        if isinstance(other, MembersView):
            other = dict(other.items())
        if not isinstance(other, dict):
            return NotImplemented
        return set(self) == set(other) and all(_fields(m) == _fields(other[k]) for k, m in self.items())

    __hash__ = None  # type: ignore[assignment]


def _fields(m: object) -> tuple[object, ...]:
    return tuple(getattr(m, f, None) for f in ("state", "incarnation", "version", "last_heard_at", "state_since",
                                                "suspects", "up_since", "last_acked_at"))


def confirmation_counts(t: MemberTable, suspects: set[str], cap: int | None) -> dict[str, int]:
    """:meth:`p2pnode.gossip.Membership.confirmation_counts` over table ``t``: for each of ``suspects`` (ids of
    members in state suspect), how many of the accusers (:meth:`MemberTable.accusers`) are alive and
    list it at its current incarnation or above, counting stops at ``cap``."""
    counts: dict[str, int] = {}
    if not suspects:
        return counts
    slots, state, susp = t.index.slots, t.state, t.susp
    suspect = {x: t.inc[slots[x]] for x in suspects}
    full = 0
    ids = t.index.ids
    for s in t.accusers():
        a = ids[s]
        ms = susp[s]
        if state[s] != ALIVE or not ms:
            continue
        if len(ms) <= len(suspect):
            pairs = ((x, inc) for x, inc in ms.items() if x in suspect)
        else:
            pairs = ((x, ms[x]) for x in suspect if x in ms)
        for x, inc in pairs:
            if x != a and inc >= suspect[x]:
                c = counts.get(x, 0) + 1
                if cap is None:
                    counts[x] = c
                elif c <= cap:
                    counts[x] = c
                    if c == cap:
                        full += 1
                        if full == len(suspect):
                            return counts
    return counts


NUMPY_SCAN_AT = 512
"""Tables of at least this many slots are scanned by :func:`time_left` in numpy (imported then, not before: an agent
of a small cluster never loads it); smaller ones in Python, with the same float64 operations in the same order."""



def alive_heard_since(t: MemberTable, after: float) -> bool:
    """Whether every alive member of ``t`` was heard (its newest version taken, or a probe acked) at or after
    ``after`` (local monotonic seconds): ``max(heard, acked) >= after``. One pass over the columns (numpy from
    :data:`NUMPY_SCAN_AT` slots on), no :class:`Member` handles: :func:`p2pnode.gossip.quiet_round` asks it
    every gossip round."""
    state, heard, acked = t.state, t.heard, t.acked
    if len(state) < NUMPY_SCAN_AT:
        return not any(state[s] == ALIVE and max(heard[s], acked[s]) < after for s in range(len(state)))
    import numpy as np

    alive = np.frombuffer(state, dtype=np.int8) == ALIVE
    h, a = np.frombuffer(heard, dtype=np.float64)[alive], np.frombuffer(acked, dtype=np.float64)[alive]
    return not bool(np.any(np.maximum(h, a) < after))


def scan(t: MemberTable, now: float, silent_for: float, reconnect: float, retention: float,
         suspect_left: Callable[[int], float]) -> tuple[list[int], float]:
    """The timers of :meth:`p2pnode.gossip.Membership.tick`: the slots whose time left at ``now`` is <= 0 (in the
    members' order) and the least time left among the others (``inf``: none). Time left: alive, ``silent_for -
    (now - max(heard, acked))``; suspect, ``suspect_left(slot)``; dead, ``reconnect - (now - since)``; left,
    ``retention - (now - since)``. From :data:`NUMPY_SCAN_AT` slots on, one numpy pass over the columns (the same
    float64 operations, so the same results, as the Python loop)."""
    state, heard, acked, since = t.state, t.heard, t.acked, t.since
    due: list[int] = []
    earliest = math.inf
    if len(state) < NUMPY_SCAN_AT:
        for s in t.slots():
            st = state[s]
            if st == ALIVE:
                left = silent_for - (now - max(heard[s], acked[s]))
            elif st == SUSPECT:
                left = suspect_left(s)
            else:
                left = (reconnect if st == DEAD else retention) - (now - since[s])
            if left <= 0:
                due.append(s)
            elif left < earliest:
                earliest = left
        return due, earliest
    import numpy as np

    codes = np.frombuffer(state, dtype=np.int8)
    h, a, since_ = (np.frombuffer(c, dtype=np.float64) for c in (heard, acked, since))
    lefts = np.full(len(codes), math.inf)
    alive, dead, gone = codes == ALIVE, codes == DEAD, codes == LEFT
    lefts[alive] = silent_for - (now - np.maximum(h[alive], a[alive]))
    lefts[dead] = reconnect - (now - since_[dead])
    lefts[gone] = retention - (now - since_[gone])
    for s in np.nonzero(codes == SUSPECT)[0].tolist():
        lefts[s] = suspect_left(s)
    due = np.nonzero(lefts <= 0)[0].tolist()  # (empty slots: inf)
    if not t.ordered:
        due.sort(key=t.seq.__getitem__)
    waiting = lefts[lefts > 0]
    return due, float(waiting.min()) if len(waiting) else math.inf
