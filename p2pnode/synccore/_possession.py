"""Proof of possession (pure): which counted holders of a file to challenge and when, and what an answer does.

A receipt in a durable member's signed snapshot proves who claims a replica, not that it holds one: anyone can read
a file's size and root from the origin's ``GET /sync/manifest`` and claim it. So the origin challenges each holder
it counts (:class:`PossessionBook`, one record per ``(path, holder)``, kept across the file's versions and across a
holder withdrawing and republishing its receipt):

* a holder that starts to claim a file is checked :attr:`PossessionPolicy.first_check_s` after its first claim,
  then every :attr:`PossessionPolicy.reverify_interval_s` after a pass; the schedule belongs to ``(path, holder)``,
  not to a version: a live database or a log that changes every pass does not reset it (a holder copying each new
  receipt is still challenged on time), and a receipt withdrawn and republished keeps it too (a withdrawn record is
  remembered for ``reverify_interval_s``, at most :data:`MAX_WITHDRAWN` of them, the oldest dropped first);
* before the disk manager deletes a synced file (:meth:`PossessionBook.want_delete`), every holder counted toward
  R that has not passed for that version within :attr:`PossessionPolicy.delete_window_s` is challenged at once; the
  file may go only when :meth:`PossessionBook.delete_readiness` says ``ready``: R holders count **and** passed for
  that version within that window (the one rule both the disk manager's predicate and the challenges before a
  delete use);
* a holder that answers ``absent``, a wrong hash, nothing in time (``timeout``), cannot be reached
  (``unreachable``) or answers garbage (``malformed``) is ``failed`` for the file (every version): it does not
  count and is not a push target (:meth:`PossessionBook.failed_holders`) until a later challenge passes, and the
  answer's effect is :class:`PushAgain` (the driver runs a push pass, which picks the next durable target). It is
  challenged again ``reverify_interval_s`` after the failure (``absent``: after ``first_check_s`` × 4^(failures−1),
  at most ``reverify_interval_s``: a holder that said it lost its copy and withdrew its receipt may be given the
  file again like any target, and is checked soon after it claims it again). After a failure it counts toward a
  delete only once :data:`PASSES_AFTER_FAILURE` challenges in a row passed (the second is asked ``first_check_s``
  after the first): a holder keeping a fraction ``f`` of the blocks gets through with probability ``f**8``,
  and every miss costs it a new wait;
* an ``overloaded`` answer (the holder refused with 503 until the challenge's timeout) or a challenge for a version
  the origin no longer holds is **inconclusive**: nothing is learnt, no failure is recorded, the holder is asked
  again later (``first_check_s`` × 2^(overloads−1), at most ``reverify_interval_s``) and a delete waits (it needs a
  pass). After :data:`OVERLOADS_UNCOUNTED` overloaded answers in a row without a pass between, the holder stops
  counting toward R (and is not a push target) until it passes: a member that only ever says it is busy cannot
  hold a file's replica count up. Likewise a holder that never passed for the file, once
  :data:`OVERLOADS_UNCOUNTED` challenges of it in a row were inconclusive (a small log appended faster than a
  challenge lands): a claim nobody could check does not count. Such a holder (and one failed ``absent``) is not a
  push target only while it claims the current version: once it lags behind or withdrew, it may be given the file.

The challenge itself (a fresh 32-byte nonce, a few random block indices, the holder's id) and the answer
(:func:`possession_proof` per block: BLAKE3 keyed by the nonce over the holder's id, the index and the block) are
built by the driver (:mod:`p2pnode.sync._possess`). Binding the holder's id into each proof means a fake member
cannot relay its challenge to a real holder and pass the real answer off as its own.

States and the events that move them (one table, :data:`TRANSITIONS`)::

    unverified --sent--> checking --passed--> verified --sent--> checking
    checking --failed--> failed --sent--> checking (still not counted until it passes)
    checking --inconclusive--> unverified, or --still_failed--> failed when the holder was failed before
    verified/unverified --changed--> unverified (a new version claimed, or the receipt withdrawn)

Times are monotonic seconds passed in (``now``); nothing here reads a clock, a file or a socket.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

import blake3
import msgspec

from ._ledger import effective_r, may_delete

__all__ = ["CHALLENGE_BLOCKS", "DELETE_READINESS", "FAIL_REASONS", "INCONCLUSIVE_REASONS", "MAX_WITHDRAWN",
           "NONCE_BYTES", "OVERLOADS_UNCOUNTED", "PASSES_AFTER_FAILURE", "STATES", "TRANSITIONS", "PossessionBook",
           "PossessionPolicy", "PushAgain", "SendChallenge", "choose_blocks", "possession_proof"]

NONCE_BYTES = 32
"""Bytes of a challenge's nonce (the BLAKE3 key)."""
CHALLENGE_BLOCKS = 4
"""Blocks asked for in one challenge (fewer when the file has fewer). A holder that keeps a fraction ``f`` of the
blocks passes with probability about ``f**4`` per challenge."""
FAIL_REASONS = ("absent", "wrong_hash", "timeout", "unreachable", "malformed")
"""Why a holder failed a challenge (the label of ``p2pnode_sync_challenges_failed_total{reason}``)."""
INCONCLUSIVE_REASONS = ("inconclusive", "overloaded")
"""Outcomes that teach nothing of the holder: ``inconclusive`` (the origin's own file no longer matched the version,
or the challenge was cancelled), ``overloaded`` (the holder refused with 503 until the timeout)."""
PASSES_AFTER_FAILURE = 2
"""Challenges in a row a holder must pass after a failure before it counts toward a delete again."""
OVERLOADS_UNCOUNTED = 3
"""Overloaded answers in a row (no pass between) after which a holder stops counting toward R until it passes."""
MAX_WITHDRAWN = 16384
"""Records of holders that withdrew their receipt (or whose file went) kept at most; the oldest go first."""
DELETE_READINESS = ("short", "unproven", "ready")
"""What :meth:`PossessionBook.delete_readiness` answers: fewer than R holders count (``short``); R count but fewer
than R passed for this version within the window (``unproven``: challenge them first); ``ready``."""
STATES = ("unverified", "checking", "verified", "failed")
TRANSITIONS: dict[tuple[str, str], str] = {
    ("unverified", "sent"): "checking",
    ("verified", "sent"): "checking",
    ("checking", "passed"): "verified",
    ("checking", "failed"): "failed",
    ("checking", "inconclusive"): "unverified",
    ("failed", "sent"): "checking",
    ("checking", "still_failed"): "failed",
    ("unverified", "changed"): "unverified",
    ("verified", "changed"): "unverified",
    ("failed", "changed"): "failed",
    ("checking", "changed"): "checking",
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
    """When to challenge: ``first_check_s`` after a holder first claims a file (and after a first pass following a
    failure), every ``reverify_interval_s`` after a pass (and after a failure other than ``absent``, which is also
    how long a withdrawn record is remembered), and before a delete unless the holder passed within
    ``delete_window_s`` (all seconds)."""

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
    """One holder's standing for one file (all its versions): ``state`` (:data:`STATES`), the version it claims now
    (``(size, root)``; None once it withdrew its receipt, since ``withdrawn_at``), when it is next due (monotonic s;
    None: under way), when and for which version it last passed, the reason of its last failure (``""`` once a
    challenge passed since), failures in a row, whether it is recovering from a failure and its passes since
    (``streak``), and overloaded answers in a row."""

    __slots__ = ("due", "ever_passed", "failures", "overloads", "passed_at", "passed_version", "reason", "recovering",
                 "state", "streak", "unsettled", "version", "withdrawn_at")

    def __init__(self, due: float, version: tuple[int, bytes]) -> None:
        self.state = "unverified"
        self.version: tuple[int, bytes] | None = version
        self.withdrawn_at: float | None = None
        self.due: float | None = due
        self.passed_at: float | None = None
        self.passed_version: tuple[int, bytes] | None = None
        self.reason = ""
        self.failures = self.streak = self.overloads = self.unsettled = 0
        self.recovering = self.ever_passed = False

    def step(self, event: str) -> None:
        self.state = TRANSITIONS[(self.state, event)]

    @property
    def blocked(self) -> bool:
        """Not counted and not a push target: failed with no pass since, overloaded too often in a row, or never
        passed for the file and every challenge of it inconclusive too often in a row. A holder that does not claim
        the current version (withdrew its receipt, or holds an older one) may be pushed to again unless it failed
        other than ``absent``: a real holder that lost its copy, or one that lags behind a live file, gets it."""
        if self.version is None and self.reason in ("", "absent"):
            return False
        return bool(self.reason) or self.overloads >= OVERLOADS_UNCOUNTED or (
            not self.ever_passed and self.unsettled >= OVERLOADS_UNCOUNTED)

    def proven(self, now: float, version: tuple[int, bytes], window_s: float) -> bool:
        """Counts toward a delete of ``version``: claims it, passed for it within ``window_s`` and is not recovering
        from a failure (:data:`PASSES_AFTER_FAILURE`)."""
        return (self.version == version and not self.blocked and not self.recovering and self.passed_at is not None
                and self.passed_version == version and now - self.passed_at <= window_s)


class PossessionBook:
    """The origin's challenge records (see module docstring). Feed it the current claims with :meth:`observe`;
    take the challenges due with :meth:`poll`; report answers with :meth:`answered`. Counters: ``sent``,
    ``passed``, ``failed[reason]``, ``overloaded`` (inconclusive ``overloaded`` answers), ``forgotten`` (withdrawn
    records dropped past :data:`MAX_WITHDRAWN`)."""

    def __init__(self, policy: PossessionPolicy | None = None) -> None:
        self.policy = policy or PossessionPolicy()
        self._records: dict[str, dict[str, _Record]] = {}  # path -> holder -> record
        self.sent = 0
        self.passed = 0
        self.overloaded = 0
        self.forgotten = 0
        self.failed: dict[str, int] = dict.fromkeys(FAIL_REASONS, 0)

    def observe(self, now: float, claims: Mapping[str, tuple[int, bytes, Iterable[str]]]) -> None:
        """The claims now: ``{path: (size, root, holders)}``, each file's current version and the durable members
        whose receipts match it. A holder new to a file is due ``first_check_s`` from ``now``; a holder known to it
        keeps its schedule and its failures whatever the version. A record whose holder no longer claims the
        current version is kept as withdrawn for ``reverify_interval_s`` (at most :data:`MAX_WITHDRAWN`, the
        oldest dropped first), so a receipt withdrawn and republished changes nothing."""
        for path, (size, root, holders) in claims.items():
            v = (size, root)
            recs = self._records.setdefault(path, {})
            for h in holders:
                r = recs.get(h)
                if r is None:
                    recs[h] = _Record(now + self.policy.first_check_s, v)
                elif r.version != v:
                    r.step("changed")
                    r.version, r.withdrawn_at = v, None
        withdrawn: list[tuple[float, str, str]] = []
        for path, recs in list(self._records.items()):
            claim = claims.get(path)
            current = (claim[0], claim[1]) if claim is not None else None
            holders = frozenset(claim[2]) if claim is not None else frozenset()
            for h, r in list(recs.items()):
                if r.version is not None and (r.version != current or h not in holders):
                    r.step("changed")
                    r.version, r.withdrawn_at = None, now
                if r.withdrawn_at is not None:
                    if now - r.withdrawn_at > self.policy.reverify_interval_s and r.state != "checking":
                        del recs[h]
                    else:
                        withdrawn.append((r.withdrawn_at, path, h))
            if not recs:
                del self._records[path]
        if len(withdrawn) > MAX_WITHDRAWN:
            withdrawn.sort()
            for _, path, h in withdrawn[:len(withdrawn) - MAX_WITHDRAWN]:
                del self._records[path][h]
                self.forgotten += 1
                if not self._records[path]:
                    del self._records[path]

    def failed_holders(self, path: str, size: int = 0, root: bytes = b"") -> frozenset[str]:
        """Holders of ``path`` (any version: ``size`` and ``root`` are not needed) that do not count and are not
        pushed to: failed a challenge with no pass since (a holder that answered ``absent`` and withdrew its
        receipt excepted), or answered ``overloaded`` :data:`OVERLOADS_UNCOUNTED` times in a row."""
        return frozenset(h for h, r in self._records.get(path, {}).items() if r.blocked)

    def counted(self, path: str, size: int, root: bytes, confirmed: Iterable[str]) -> frozenset[str]:
        """``confirmed`` (holders whose receipts match) minus :meth:`failed_holders`."""
        return frozenset(confirmed) - self.failed_holders(path)

    def delete_readiness(self, now: float, path: str, size: int, root: bytes, confirmed: Iterable[str], *, r: int,
                         durable_members: int) -> str:
        """The one delete rule (the disk manager's predicate and the challenges before a delete both ask it): of
        :data:`DELETE_READINESS`, ``short`` unless :func:`~._ledger.may_delete` allows the holders :meth:`counted`
        (R of ``r``, capped by ``durable_members``), ``ready`` when R of them passed a challenge for this version
        within ``delete_window_s`` of ``now`` and none of those is recovering from a failure, else ``unproven``."""
        counted = self.counted(path, size, root, confirmed)
        if not may_delete(len(counted), r, durable_members):
            return "short"
        recs = self._records.get(path, {})
        window, v = self.policy.delete_window_s, (size, root)
        fresh = sum(1 for h in counted if (rec := recs.get(h)) is not None and rec.proven(now, v, window))
        return "ready" if fresh >= effective_r(r, durable_members) else "unproven"

    def want_delete(self, now: float, versions: Iterable[Version]) -> None:
        """The disk manager may delete these versions: every holder claiming one, counted, not being checked, that
        has not passed for it within ``delete_window_s`` of ``now`` is due now."""
        window = self.policy.delete_window_s
        for path, size, root in versions:
            v = (size, root)
            for r in self._records.get(path, {}).values():
                if r.version != v or r.blocked or r.state not in ("unverified", "verified"):
                    continue  # (a failed holder does not count: checking it now would not make the file deletable)
                if r.passed_at is None or r.passed_version != v or now - r.passed_at > window:
                    r.due = now if r.due is None else min(r.due, now)

    def verified_for_delete(self, now: float, path: str, size: int, root: bytes, confirmed: Iterable[str],
                            r_eff: int) -> bool:
        """True when at least ``r_eff`` holders of ``confirmed`` count and passed a challenge for this version
        within ``delete_window_s`` before ``now`` (none recovering from a failure)."""
        recs = self._records.get(path, {})
        window, v = self.policy.delete_window_s, (size, root)
        fresh = [h for h in self.counted(path, size, root, confirmed)
                 if (rec := recs.get(h)) is not None and rec.proven(now, v, window)]
        return r_eff >= 1 and len(fresh) >= r_eff

    def poll(self, now: float) -> list[SendChallenge]:
        """The challenges due at ``now`` (holders that claim the current version), their records now ``checking``
        (each answered later by :meth:`answered`)."""
        out = []
        for path, recs in self._records.items():
            for holder, r in recs.items():
                if r.version is not None and r.due is not None and r.due <= now and r.state != "checking":
                    r.step("sent")
                    r.due = None
                    self.sent += 1
                    out.append(SendChallenge(holder, path, r.version[0], r.version[1]))
        return out

    def answered(self, now: float, c: SendChallenge, outcome: str) -> list[PushAgain]:
        """Record the outcome of challenge ``c``: ``passed``, one of :data:`INCONCLUSIVE_REASONS` (nothing learnt
        of the holder) or a reason of :data:`FAIL_REASONS`. Returns the effects (:class:`PushAgain` on a failure).
        An answer for a record dropped meanwhile is ignored; raises ``ValueError`` for another outcome."""
        r = self._records.get(c.path, {}).get(c.holder)
        if outcome not in ("passed", *INCONCLUSIVE_REASONS, *FAIL_REASONS):
            raise ValueError(f"unknown challenge outcome {outcome!r}")
        if r is None or r.state != "checking":
            return []
        p = self.policy
        if outcome == "passed":
            self._passed(now, r, (c.size, c.root))
            return []
        if outcome in INCONCLUSIVE_REASONS:
            wait = p.first_check_s
            r.unsettled += 1
            if outcome == "overloaded":
                r.overloads += 1
                self.overloaded += 1
                wait = p.first_check_s * 2 ** min(r.overloads - 1, 20)
            r.step("still_failed" if r.reason else "inconclusive")
            r.due = now + min(wait, p.reverify_interval_s)
            return []
        r.step("failed")
        r.failures += 1
        r.reason, r.recovering, r.streak, r.overloads, r.unsettled = outcome, True, 0, 0, 0
        r.passed_at = r.passed_version = None
        hold = p.first_check_s * 4 ** min(r.failures - 1, 20) if outcome == "absent" else p.reverify_interval_s
        r.due = now + min(hold, p.reverify_interval_s)
        self.failed[outcome] += 1
        return [PushAgain(c.path, c.size, c.root, c.holder, outcome)]

    def _passed(self, now: float, r: _Record, version: tuple[int, bytes]) -> None:
        """A pass for ``version``: counted again; after a failure, the next challenge comes ``first_check_s`` later
        until :data:`PASSES_AFTER_FAILURE` passed in a row, then every ``reverify_interval_s``."""
        r.step("passed")
        if r.version != version:
            r.step("changed")  # passed for a version it no longer claims: proves nothing of the current one
        r.passed_at, r.passed_version, r.reason, r.overloads, r.unsettled = now, version, "", 0, 0
        r.ever_passed = True
        if r.recovering:
            r.streak += 1
            if r.streak >= PASSES_AFTER_FAILURE:
                r.recovering, r.streak, r.failures = False, 0, 0
        r.due = now + (self.policy.first_check_s if r.recovering else self.policy.reverify_interval_s)
        self.passed += 1

    def next_deadline(self) -> float | None:
        """The earliest time a challenge is due (monotonic s), None when none is scheduled."""
        dues = [r.due for recs in self._records.values() for r in recs.values()
                if r.due is not None and r.state != "checking" and r.version is not None]
        return min(dues) if dues else None

    def view(self, path: str, size: int, root: bytes, now: float) -> dict[str, dict[str, object]]:
        """``{holder: {"state", "reason", "passed_s_ago", "counted", "passes_needed", "overloads"}}`` for the holders
        claiming this version (``GET /sync/status``); ``passes_needed``: passes in a row still wanted after a
        failure before it counts toward a delete."""
        v = (size, root)
        return {h: {"state": r.state, "reason": r.reason or None,
                    "passed_s_ago": None if r.passed_at is None else round(now - r.passed_at, 1),
                    "counted": not r.blocked,
                    "passes_needed": PASSES_AFTER_FAILURE - r.streak if r.recovering else 0,
                    "overloads": r.overloads}
                for h, r in sorted(self._records.get(path, {}).items()) if r.version == v}
