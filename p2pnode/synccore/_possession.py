"""Proof of possession (pure): which counted holders of a file to challenge and when, and what an answer does.

A receipt in a durable member's signed snapshot proves who claims a replica, not that it holds one: anyone can read
a file's size and root from the origin's ``GET /sync/manifest`` and claim it. So the origin challenges each holder
it counts (:class:`PossessionBook`, one record per ``(path, size, root, holder)``):

* a receipt that starts to count is checked once soon after (:attr:`PossessionPolicy.first_check_s`), before the
  node relies on it, then every :attr:`PossessionPolicy.reverify_interval_s` (a holder that passed for an earlier
  version of the same file keeps that schedule for the new version: a live database changes every pass);
* before the disk manager deletes a synced file (:meth:`PossessionBook.want_delete`), every holder counted toward
  R that has not passed within :attr:`PossessionPolicy.delete_window_s` is challenged at once; the file may go
  only when R holders count **and** passed within that window (:meth:`PossessionBook.verified_for_delete`);
* a holder that answers ``absent``, a wrong hash, nothing in time (``timeout``), cannot be reached
  (``unreachable``) or answers garbage (``malformed``) is ``failed`` for that version: it stops counting, is never
  a target for that version while it stays failed (:meth:`PossessionBook.failed_holders`), and the answer's
  effect is :class:`PushAgain` (the driver runs a push pass, which picks the next durable target by rendezvous).
  A failed holder is challenged again after ``reverify_interval_s`` (it counts again only once it passes), and
  its record goes when its receipt for that version goes: a real holder that lost its copy withdraws the receipt,
  and may then be given the file again like any target.

The challenge itself (a fresh 32-byte nonce, a few random block indices, the holder's id) and the answer
(:func:`possession_proof` per block: BLAKE3 keyed by the nonce over the holder's id, the index and the block) are
built by the driver (:mod:`p2pnode.sync._possess`). Binding the holder's id into each proof means a fake member
cannot relay its challenge to a real holder and pass the real answer off as its own.

States and the events that move them (one table, :data:`TRANSITIONS`)::

    unverified --sent--> checking --passed--> verified --sent--> checking
    checking --failed--> failed --sent--> checking (still not counted until it passes)
    checking --inconclusive--> unverified (the origin's own file changed: nothing learnt of the holder),
                               or --still_failed--> failed when the holder was failed before

Times are monotonic seconds passed in (``now``); nothing here reads a clock, a file or a socket.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

import blake3
import msgspec

__all__ = ["CHALLENGE_BLOCKS", "FAIL_REASONS", "NONCE_BYTES", "STATES", "TRANSITIONS", "PossessionBook",
           "PossessionPolicy", "PushAgain", "SendChallenge", "choose_blocks", "possession_proof"]

NONCE_BYTES = 32
"""Bytes of a challenge's nonce (the BLAKE3 key)."""
CHALLENGE_BLOCKS = 4
"""Blocks asked for in one challenge (fewer when the file has fewer). A holder that keeps a fraction ``f`` of the
blocks passes with probability about ``f**4`` per challenge."""
FAIL_REASONS = ("absent", "wrong_hash", "timeout", "unreachable", "malformed")
"""Why a holder failed a challenge (the label of ``p2pnode_sync_challenges_failed_total{reason}``)."""
STATES = ("unverified", "checking", "verified", "failed")
TRANSITIONS: dict[tuple[str, str], str] = {
    ("unverified", "sent"): "checking",
    ("verified", "sent"): "checking",
    ("checking", "passed"): "verified",
    ("checking", "failed"): "failed",
    ("checking", "inconclusive"): "unverified",
    ("failed", "sent"): "checking",
    ("checking", "still_failed"): "failed",
}
"""``(state, event) -> state``; an event with no entry is a bug of the caller (``KeyError``)."""

Version = tuple[str, int, bytes]  # (path, size, root)


def possession_proof(nonce: bytes, holder: str, index: int, block: bytes | memoryview) -> bytes:
    """The answer for one block: BLAKE3-256 keyed by the 32-byte ``nonce`` over ``holder``'s id (UTF-8), a zero
    byte, the block index (8 bytes big-endian) and the block's bytes. Raises ``ValueError`` for a nonce of
    another length."""
    h = blake3.blake3(holder.encode() + b"\x00" + index.to_bytes(8, "big"), key=nonce)
    h.update(block)
    return h.digest()


def choose_blocks(blocks: int, rng: random.Random, k: int = CHALLENGE_BLOCKS) -> tuple[int, ...]:
    """``min(k, blocks)`` distinct block indices of a file of ``blocks`` blocks, drawn by ``rng`` (the driver
    passes :class:`random.SystemRandom`: a holder must not guess them), ascending."""
    return tuple(sorted(rng.sample(range(blocks), min(k, blocks))))


class PossessionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """When to challenge: ``first_check_s`` after a receipt first counts, every ``reverify_interval_s`` after a pass,
    and before a delete unless the holder passed within ``delete_window_s`` (all seconds)."""

    first_check_s: float = 2.0
    reverify_interval_s: float = 3600.0
    delete_window_s: float = 600.0


class SendChallenge(msgspec.Struct, frozen=True):
    """Effect: challenge ``holder`` for this node's ``path`` at ``size`` bytes and manifest ``root``."""

    holder: str
    path: str
    size: int
    root: bytes


class PushAgain(msgspec.Struct, frozen=True):
    """Effect: ``holder`` failed for ``reason`` and no longer counts for ``path`` at ``(size, root)``: push the
    file again (a pass picks the next durable target by rendezvous, the failed holders excluded)."""

    path: str
    size: int
    root: bytes
    holder: str
    reason: str


class _Record:
    """One holder's standing for one version: ``state`` (:data:`STATES`), when it is next due (monotonic s;
    None: not scheduled), when it last passed, and why it failed."""

    __slots__ = ("due", "passed_at", "reason", "state")

    def __init__(self, due: float | None) -> None:
        self.state = "unverified"
        self.due = due
        self.passed_at: float | None = None
        self.reason = ""

    def step(self, event: str) -> None:
        self.state = TRANSITIONS[(self.state, event)]


class PossessionBook:
    """The origin's challenge records (see module docstring). Feed it the current claims with :meth:`observe`;
    take the challenges due with :meth:`poll`; report answers with :meth:`answered`. Counters: ``sent``,
    ``passed``, ``failed[reason]``."""

    def __init__(self, policy: PossessionPolicy | None = None) -> None:
        self.policy = policy or PossessionPolicy()
        self._records: dict[Version, dict[str, _Record]] = {}
        self.sent = 0
        self.passed = 0
        self.failed: dict[str, int] = dict.fromkeys(FAIL_REASONS, 0)

    def observe(self, now: float, claims: Mapping[str, tuple[int, bytes, Iterable[str]]]) -> None:
        """The claims now: ``{path: (size, root, holders)}``, each file's current version and the durable members
        whose receipts match it. A new claim is due ``first_check_s`` from ``now``; records of versions no longer
        current and of holders that withdrew their receipt are dropped (a failed holder's too)."""
        passed_before: dict[tuple[str, str], float | None] = {}  # (path, holder) -> due, for holders that passed
        for (path, _, _), recs in self._records.items():
            for h, r in recs.items():
                if r.passed_at is not None and r.due is not None:
                    passed_before[(path, h)] = r.due
        keep: dict[Version, dict[str, _Record]] = {}
        for path, (size, root, holders) in claims.items():
            v = (path, size, root)
            old = self._records.get(v, {})
            keep[v] = {h: old.get(h) or self._new_record(now, passed_before.get((path, h))) for h in holders}
        self._records = keep

    def _new_record(self, now: float, due_before: float | None) -> _Record:
        """A record for a new claim: due ``first_check_s`` from ``now``, or, for a holder that passed for an earlier
        version of the same file (a growing log, a live database: a new version every pass), when that one was
        due next (it counts meanwhile, unverified: a delete still needs a fresh pass, :meth:`want_delete`)."""
        first = now + self.policy.first_check_s
        return _Record(first if due_before is None else max(first, due_before))

    def failed_holders(self, path: str, size: int, root: bytes) -> frozenset[str]:
        """Holders that failed a challenge for this version: they do not count and are not pushed to."""
        return frozenset(h for h, r in self._records.get((path, size, root), {}).items()
                         if r.state == "failed" or (r.state == "checking" and r.reason))

    def counted(self, path: str, size: int, root: bytes, confirmed: Iterable[str]) -> frozenset[str]:
        """``confirmed`` (holders whose receipts match) minus those that failed for this version."""
        return frozenset(confirmed) - self.failed_holders(path, size, root)

    def want_delete(self, now: float, versions: Iterable[Version]) -> None:
        """The disk manager may delete these versions: every holder not failed, not being checked, that has not
        passed within ``delete_window_s`` of ``now`` is due now."""
        window = self.policy.delete_window_s
        for v in versions:
            for r in self._records.get(v, {}).values():
                if r.state in ("unverified", "verified") and (r.passed_at is None or now - r.passed_at > window):
                    # (a failed holder does not count: checking it now would not make the file deletable)
                    r.due = now if r.due is None else min(r.due, now)

    def verified_for_delete(self, now: float, path: str, size: int, root: bytes, confirmed: Iterable[str],
                            r_eff: int) -> bool:
        """True when at least ``r_eff`` holders of ``confirmed`` count and passed a challenge for this version
        within ``delete_window_s`` before ``now``."""
        recs = self._records.get((path, size, root), {})
        window = self.policy.delete_window_s
        fresh = [h for h in confirmed if (r := recs.get(h)) is not None and r.state in ("verified", "checking")
                 and r.passed_at is not None and now - r.passed_at <= window]
        return r_eff >= 1 and len(fresh) >= r_eff

    def poll(self, now: float) -> list[SendChallenge]:
        """The challenges due at ``now``, their records now ``checking`` (each answered later by
        :meth:`answered`)."""
        out = []
        for (path, size, root), recs in self._records.items():
            for holder, r in recs.items():
                if r.due is not None and r.due <= now and r.state != "checking":
                    r.step("sent")
                    r.due = None
                    self.sent += 1
                    out.append(SendChallenge(holder, path, size, root))
        return out

    def answered(self, now: float, c: SendChallenge, outcome: str) -> list[PushAgain]:
        """Record the outcome of challenge ``c``: ``passed``, ``inconclusive`` (this node's own file no longer
        matched the version, nothing learnt of the holder) or a reason of :data:`FAIL_REASONS`. Returns the
        effects (:class:`PushAgain` on a failure). An answer for a record dropped meanwhile is ignored."""
        r = self._records.get((c.path, c.size, c.root), {}).get(c.holder)
        if r is None or r.state != "checking":
            return []
        if outcome == "passed":
            r.step("passed")
            r.passed_at, r.reason = now, ""
            r.due = now + self.policy.reverify_interval_s
            self.passed += 1
            return []
        if outcome == "inconclusive":
            if r.reason:  # a failed holder re-checked: still failed, asked again later
                r.step("still_failed")
                r.due = now + self.policy.first_check_s
                return []
            r.step("inconclusive")
            r.due = now + self.policy.first_check_s
            return []
        if outcome not in FAIL_REASONS:
            raise ValueError(f"unknown challenge outcome {outcome!r}")
        r.step("failed")
        r.reason, r.due, r.passed_at = outcome, now + self.policy.reverify_interval_s, None
        self.failed[outcome] += 1
        return [PushAgain(c.path, c.size, c.root, c.holder, outcome)]

    def next_deadline(self) -> float | None:
        """The earliest time a challenge is due (monotonic s), None when none is scheduled."""
        dues = [r.due for recs in self._records.values() for r in recs.values()
                if r.due is not None and r.state != "checking"]
        return min(dues) if dues else None

    def view(self, path: str, size: int, root: bytes, now: float) -> dict[str, dict[str, object]]:
        """``{holder: {"state", "reason", "passed_s_ago"}}`` for ``GET /sync/status``."""
        return {h: {"state": r.state, "reason": r.reason or None,
                    "passed_s_ago": None if r.passed_at is None else round(now - r.passed_at, 1)}
                for h, r in sorted(self._records.get((path, size, root), {}).items())}
