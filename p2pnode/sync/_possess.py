"""Proof of possession on the wire: the origin challenges the holders it counts, a holder answers from its replica.

**Request** ``POST /sync/challenge``: msgpack :class:`ChallengeRequest` ``{origin, holder, path, size, root, nonce
(32 random bytes), blocks (at most 16 indices)}``, signed like a push (``x-p2pnode-origin``, ``-time``,
``-signature``: Ed25519 by the origin over ``p2pnode-sync-challenge-v1``, the method, the path, the origin, the
time and the BLAKE3 of the whole body, newline-separated). The body names its receiver (``holder``): a holder
answers only a challenge naming itself, from the origin that signed it, within ``max_clock_skew_s``, so a
challenge cannot be replayed to another node. **Answer** msgpack :class:`ChallengeAnswer` ``{status: present |
absent, proofs}``: for each block asked, :func:`~p2pnode.synccore.possession_proof` (BLAKE3 keyed by the nonce over
the holder's own id, the index and the block's bytes, read from its replica). ``absent``: it holds no replica of
that exact version; one whose record says it does but whose file is gone or of the wrong size withdraws that
receipt at once (and publishes), so its origin may give it the file again.

Both sides decode once with bounded msgspec types: the request (at most :data:`MAX_CHALLENGE_BODY` bytes) on the
holder, the answer on the origin read up to :func:`answer_limit` of its request (an answer is never larger than its
request needs; ``reply_oversized`` beyond). A holder serves at most :data:`CHALLENGES_AT_ONCE` challenges at a time
and :data:`CHALLENGES_PER_ORIGIN` for one origin (``overloaded``, 503, beyond), reads at most
:data:`CHALLENGE_BYTES_PER_ORIGIN_S` bytes per second for one origin (``over_budget``, 503, beyond), refuses a
challenge whose nonce it saw within twice ``max_clock_skew_s`` (``replayed``, 409), and reads blocks in a worker
thread. An origin that got only 503s until its timeout counts the challenge inconclusive (``overloaded``), never a
failure of the holder.

The origin's side, :class:`Challenger`, drives :class:`~p2pnode.synccore.PossessionBook` (who to challenge and
when; what an answer does): it challenges what is due, reports each outcome (``passed``, ``inconclusive`` or a
failure reason of :data:`~p2pnode.synccore.FAIL_REASONS`), and runs a push pass when a holder failed. Before a
disk-manager pass, :meth:`Challenger.verify_before_delete` challenges every counted holder of the files that may
go and waits for the answers.
"""

from __future__ import annotations

import base64
import hmac
import logging
import os
import random
import secrets
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import blake3
import httpx
import msgspec
import trio
from msgspec import Meta, Struct

from ..errors import SyncReplyRejected
from ..identity import Identity, verify_signature
from ..inputs import BlockIndex
from ..snapshot import ByteCount, NodeId
from ..synccore import (
    BLOCK_HASH_BYTES,
    INCONCLUSIVE_REASONS,
    NONCE_BYTES,
    PossessionBook,
    SendChallenge,
    choose_blocks,
    hash_block,
    possession_proof,
)
from ._blocks import CONNECT_TIMEOUT_S, read_capped
from ._refuse import RefusalLog, SyncReject
from ._wire import ORIGIN_HEADER, SIG_HEADER, TIME_HEADER, KeyOf, precheck_headers

if TYPE_CHECKING:
    from ..config import SyncConfig
    from ..node import NodeContext
    from ._replication import Replication
    from ._source import LocalFile, LocalFiles
    from ._store import ReplicaStore

__all__ = ["CHALLENGES_AT_ONCE", "CHALLENGE_PATH", "MAX_CHALLENGE_BLOCKS", "MAX_CHALLENGE_BODY", "ChallengeAnswer",
           "ChallengeRequest", "Challenger", "answer_limit", "decode_answer", "decode_challenge", "sign_challenge",
           "verify_challenge"]

log = logging.getLogger(__name__)

CHALLENGE_PATH = "/sync/challenge"
MAX_CHALLENGE_BLOCKS = 16
"""Block indices one challenge may ask for (this node asks for :data:`~p2pnode.synccore.CHALLENGE_BLOCKS`)."""
MAX_CHALLENGE_BODY = 8192
"""Bytes of a challenge request at most (a 4 KiB path, 16 indices and the rest)."""
CHALLENGES_AT_ONCE = 8
"""Challenges a holder answers at the same time (more: 503 ``overloaded``)."""
CHALLENGES_PER_ORIGIN = 4
"""Challenges a holder answers at the same time for one origin (more: 503 ``overloaded``): one member asking
without pause cannot take every slot."""
CHALLENGES_IN_FLIGHT = 16
"""Challenges an origin has under way at once."""
CHALLENGES_PER_HOLDER = 2
"""Challenges an origin has under way to one holder at once (below :data:`CHALLENGES_PER_ORIGIN`)."""
OVERLOADED_RETRY_S = 0.25
"""An origin whose challenge a holder refused ``overloaded`` asks again after about this long (jittered), until
``challenge_timeout_s``: a busy holder is not a failed one. A challenge refused ``overloaded`` until its timeout is
inconclusive (``overloaded``: no failure, asked again later, a delete waits for a pass; see
:mod:`p2pnode.synccore._possession` for when such a holder stops counting)."""
CHALLENGE_BYTES_PER_ORIGIN_S = 64 * 2**20
"""Bytes of replica a holder reads and hashes per second for one origin's challenges at most (a token bucket of
:data:`CHALLENGE_BYTES_BURST` bytes): a member asking for big blocks without pause gets ``over_budget`` (503) and
cannot keep the challenge slots busy. An honest origin asks 4 blocks per holder and file about hourly."""
CHALLENGE_BYTES_BURST = 4 * 16 * 2**20
"""The budget's bucket: one challenge of 4 blocks of the largest size (16 MiB) fits whole."""
NONCES_KEPT = 65536
"""Challenge nonces a holder remembers (for twice ``max_clock_skew_s``; the oldest forgotten first beyond this): a
signed challenge sent again is refused ``replayed``."""
DELETE_CHECK_FILES = 256
"""Files whose holders one disk-manager pass has challenged at most (its oldest first: the order it deletes in)."""

Hash32 = Annotated[bytes, Meta(min_length=BLOCK_HASH_BYTES, max_length=BLOCK_HASH_BYTES)]


class ChallengeRequest(Struct, frozen=True, forbid_unknown_fields=False):
    """A challenge (see module docstring): ``origin`` asks ``holder`` for proofs of ``blocks`` of its ``path`` at
    ``size`` bytes and manifest ``root``, keyed by ``nonce``."""

    origin: NodeId
    holder: NodeId
    path: Annotated[str, Meta(min_length=1, max_length=4096)]
    size: ByteCount
    root: Hash32
    nonce: Annotated[bytes, Meta(min_length=NONCE_BYTES, max_length=NONCE_BYTES)]
    blocks: Annotated[list[BlockIndex], Meta(max_length=MAX_CHALLENGE_BLOCKS)]


class ChallengeAnswer(Struct, frozen=True, forbid_unknown_fields=False):
    """A holder's answer: ``present`` with one proof per block asked (in order), or ``absent``."""

    status: Literal["present", "absent"]
    proofs: Annotated[list[Hash32], Meta(max_length=MAX_CHALLENGE_BLOCKS)] = []


_REQUEST = msgspec.msgpack.Decoder(ChallengeRequest)
_ANSWER = msgspec.msgpack.Decoder(ChallengeAnswer)


def answer_limit(blocks: int) -> int:
    """Bytes an answer to a challenge of ``blocks`` blocks may take at most: its fields (msgpack, about 23 bytes)
    and 34 bytes per proof (a 32-byte bin with its 2-byte header); one proof more does not fit."""
    return 32 + 34 * blocks


def decode_challenge(body: bytes) -> ChallengeRequest:
    """The request in ``body``; raises ``SyncReject("oversized")`` beyond :data:`MAX_CHALLENGE_BODY` and
    ``SyncReject("malformed")`` for anything the bounded type refuses."""
    if len(body) > MAX_CHALLENGE_BODY:
        raise SyncReject("oversized", f"a challenge of {len(body)} bytes > {MAX_CHALLENGE_BODY}")
    try:
        return _REQUEST.decode(body)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise SyncReject("malformed", f"challenge: {exc}") from None


def decode_answer(body: bytes, blocks: int) -> ChallengeAnswer:
    """A holder's answer to a challenge of ``blocks`` blocks. Raises :class:`SyncReplyRejected`:
    ``reply_oversized`` beyond :func:`answer_limit`, ``reply_malformed`` (not msgpack), ``reply_invalid`` (a field
    missing or out of bounds, or ``present`` with a number of proofs other than ``blocks``)."""
    if len(body) > answer_limit(blocks):
        raise SyncReplyRejected("reply_oversized", f"challenge answer of {len(body)} bytes")
    try:
        ans = _ANSWER.decode(body)
    except msgspec.ValidationError as exc:
        raise SyncReplyRejected("reply_invalid", f"challenge answer: {exc}") from None
    except msgspec.DecodeError as exc:
        raise SyncReplyRejected("reply_malformed", f"challenge answer: {exc}") from None
    if ans.status == "present" and len(ans.proofs) != blocks:
        raise SyncReplyRejected("reply_invalid", f"{len(ans.proofs)} proofs for {blocks} blocks")
    return ans


def _signed(origin: str, ts: str, body: bytes) -> bytes:
    return "\n".join(("p2pnode-sync-challenge-v1", "POST", CHALLENGE_PATH, origin, ts,
                      blake3.blake3(body).hexdigest())).encode()


def sign_challenge(identity: Identity, body: bytes, *, now: float | None = None) -> dict[str, str]:
    """The auth headers of a challenge ``body`` from ``identity``'s node (``now``: Unix s, default the clock)."""
    ts = f"{time.time() if now is None else now:.3f}"
    sig = identity.sign(_signed(identity.node_id, ts, body))
    return {ORIGIN_HEADER: identity.node_id, TIME_HEADER: ts, SIG_HEADER: base64.b64encode(sig).decode(),
            "content-type": "application/msgpack"}


def verify_challenge(headers: Any, body: bytes, *, me: str, key_of: KeyOf, now: float,
                     max_skew_s: float) -> ChallengeRequest:
    """The authenticated challenge: signed by a member whose key ``key_of`` returns, within ``max_skew_s`` of ``now``
    (Unix s), naming itself as ``origin`` and this node (``me``) as ``holder``. Raises :class:`SyncReject`
    (``bad_signature``, ``not_member``, ``malformed``, ``oversized``)."""
    auth = precheck_headers(headers, key_of=key_of, now=now, max_skew_s=max_skew_s)
    if not verify_signature(auth.key, auth.sig, _signed(auth.origin, auth.ts, body)):
        raise SyncReject("bad_signature", f"challenge signature does not verify for {auth.origin!r}")
    req = decode_challenge(body)
    if req.origin != auth.origin or req.holder != me:
        raise SyncReject("bad_signature", "the challenge names another origin or another holder")
    return req


# -- the holder ---------------------------------------------------------------------------------------------------
def read_proofs(store: ReplicaStore, req: ChallengeRequest, me: str) -> ChallengeAnswer | None:
    """Answer ``req`` from the replica (blocking: run it in a worker thread). ``absent`` unless the index holds
    exactly that version; None when the index holds it but the file is gone or of another size (the caller
    withdraws the receipt and answers ``absent``). Raises ``SyncReject("malformed")`` for a block beyond the file."""
    rec = store.index.get((req.origin, req.path))
    if rec is None or rec["root"] != req.root.hex() or rec["size"] != req.size:
        return ChallengeAnswer("absent")
    bs = rec["block_size"]
    blocks = -(-req.size // bs)
    if any(i >= blocks for i in req.blocks):
        raise SyncReject("malformed", f"a block index beyond the file's {blocks} blocks")
    try:
        fd = os.open(store.held.replica_path(req.origin, req.path), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != req.size:
            return None
        proofs = [possession_proof(req.nonce, me, i, os.pread(fd, min(bs, req.size - i * bs), i * bs))
                  for i in req.blocks]
    finally:
        os.close(fd)
    return ChallengeAnswer("present", proofs)


def challenge_cost(store: ReplicaStore, req: ChallengeRequest) -> int:
    """Bytes answering ``req`` reads: its blocks' lengths when the index holds that exact version, else 0 (the
    answer is ``absent``, read from the index alone)."""
    rec = store.index.get((req.origin, req.path))
    if rec is None or rec["root"] != req.root.hex() or rec["size"] != req.size:
        return 0
    bs = rec["block_size"]
    return sum(max(0, min(bs, req.size - i * bs)) for i in req.blocks)


def withdraw_lost(store: ReplicaStore, req: ChallengeRequest) -> bool:
    """Withdraw the receipt of a replica the index holds but whose file is gone or of another size (blocking; the
    caller holds the origin's lock). True when it was withdrawn."""
    rec = store.index.get((req.origin, req.path))
    if rec is None or rec["root"] != req.root.hex():
        return False
    try:
        st = store.held.replica_path(req.origin, req.path).lstat()
        if stat.S_ISREG(st.st_mode) and st.st_size == rec["size"]:
            return False
    except OSError:
        pass
    store.held.remove(req.origin, req.path)
    log.warning("sync: the replica of %s:%s is gone from disk; receipt withdrawn", req.origin, req.path)
    return True


class ChallengeServer:
    """A durable node's ``POST /sync/challenge`` (see module docstring). Counters: ``served`` (answers sent),
    ``absent`` (of them ``absent``), ``withdrawn`` (receipts withdrawn for replicas found gone); refusals go to
    ``count(reason)``."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig, store: ReplicaStore | None, key_of: KeyOf,
                 lock_of: Callable[[str], trio.Lock], count: Callable[[str], None]) -> None:
        self.ctx, self.cfg, self.store, self.key_of, self.lock_of, self.count = ctx, cfg, store, key_of, lock_of, count
        self._limiter = trio.CapacityLimiter(CHALLENGES_AT_ONCE)
        self._per_origin: dict[str, int] = {}
        self._log = RefusalLog("sync: refused a challenge")
        self._nonces: OrderedDict[bytes, float] = OrderedDict()  # nonce -> when forgotten (monotonic s)
        self._budget: dict[str, tuple[float, float]] = {}  # origin -> (bytes left, at monotonic s)
        self.served = self.absent = self.withdrawn = 0

    def _forget_nonces(self, now: float) -> None:
        """Forget the nonces older than twice ``max_clock_skew_s`` (their challenges' signed times are refused
        anyway), and the oldest beyond :data:`NONCES_KEPT`."""
        nonces = self._nonces
        while nonces and (next(iter(nonces.values())) <= now or len(nonces) >= NONCES_KEPT):
            nonces.popitem(last=False)

    def _spend(self, origin: str, cost: int, now: float) -> None:
        """Take ``cost`` bytes from ``origin``'s bucket (:data:`CHALLENGE_BYTES_PER_ORIGIN_S`, at most
        :data:`CHALLENGE_BYTES_BURST`); raises ``SyncReject("over_budget")`` when it holds fewer."""
        left, at = self._budget.get(origin, (float(CHALLENGE_BYTES_BURST), now))
        left = min(float(CHALLENGE_BYTES_BURST), left + (now - at) * CHALLENGE_BYTES_PER_ORIGIN_S)
        if cost > left:
            self._budget[origin] = (left, now)
            raise SyncReject("over_budget", f"{origin} asked for {cost} bytes; {int(left)} left of its budget")
        self._budget[origin] = (left - cost, now)
        if len(self._budget) > 4096:  # full buckets hold nothing worth keeping
            self._budget = {o: (b, t) for o, (b, t) in self._budget.items()
                            if b + (now - t) * CHALLENGE_BYTES_PER_ORIGIN_S < CHALLENGE_BYTES_BURST}

    async def answer(self, headers: Any, body: bytes) -> tuple[int, bytes]:
        """(HTTP status, msgpack body): 200 with a :class:`ChallengeAnswer`, or the refusal (counted) as
        ``{"error": reason, "detail": ...}``."""
        try:
            return 200, msgspec.msgpack.encode(await self._answer(headers, body))
        except SyncReject as exc:
            self.count(exc.reason)
            self._log(exc, time.monotonic())
            return exc.status, msgspec.msgpack.encode({"error": exc.reason, "detail": exc.detail[:200]})

    async def _answer(self, headers: Any, body: bytes) -> ChallengeAnswer:
        store = self.store
        if store is None:
            raise SyncReject("not_member", "this node keeps no replicas (not durable)")
        req = verify_challenge(headers, body, me=self.ctx.node_id, key_of=self.key_of, now=time.time(),
                               max_skew_s=self.cfg.max_clock_skew_s)
        now = time.monotonic()
        self._forget_nonces(now)
        if req.nonce in self._nonces:
            raise SyncReject("replayed", "a challenge nonce seen before")
        if self._per_origin.get(req.origin, 0) >= CHALLENGES_PER_ORIGIN:
            raise SyncReject("overloaded", f"{CHALLENGES_PER_ORIGIN} challenges from {req.origin} under way")
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            raise SyncReject("overloaded", f"{CHALLENGES_AT_ONCE} challenges under way") from None
        try:
            self._spend(req.origin, challenge_cost(store, req), now)
        except SyncReject:
            self._limiter.release()
            raise
        self._nonces[req.nonce] = now + 2 * self.cfg.max_clock_skew_s  # admitted: a replay of it is refused
        self._per_origin[req.origin] = self._per_origin.get(req.origin, 0) + 1
        try:
            ans = await trio.to_thread.run_sync(read_proofs, store, req, self.ctx.node_id)
            if ans is None:
                async with self.lock_of(req.origin):
                    gone = await trio.to_thread.run_sync(withdraw_lost, store, req)
                if gone:
                    self.withdrawn += 1
                    self.ctx.publish_to(req.origin)  # the receipt leaves our snapshot: the origin may push again
                ans = ChallengeAnswer("absent")
        finally:
            self._limiter.release()
            if (left := self._per_origin.pop(req.origin) - 1) > 0:
                self._per_origin[req.origin] = left
        self.served += 1
        self.absent += ans.status == "absent"
        return ans


# -- the origin ---------------------------------------------------------------------------------------------------
def expected_proofs(path: Path, f: LocalFile, blocks: tuple[int, ...], nonce: bytes, holder: str) -> list[bytes] | None:
    """The proofs ``holder`` must give for ``blocks`` of this node's file at ``path`` (blocking), each block read
    and checked against ``f``'s manifest first; None when the file no longer matches it (changed since it was
    hashed: the challenge tells nothing of the holder)."""
    m = f.manifest
    out = []
    try:
        with open(path, "rb") as fh:
            for i in blocks:
                fh.seek(i * m.block_size)
                data = fh.read(m.block_len(i))
                if len(data) != m.block_len(i) or hash_block(data) != m.block_hash(i):
                    return None
                out.append(possession_proof(nonce, holder, i, data))
    except OSError:
        return None
    return out


class Challenger:
    """The origin's challenges (see module docstring): ``book`` decides, this moves the bytes. ``on_failed()`` runs a
    push pass (a holder stopped counting). Counters: ``answered`` (answers that decoded), ``inconclusive``; the
    book's ``sent``, ``passed`` and ``failed[reason]``."""

    def __init__(self, ctx: NodeContext, cfg: SyncConfig, source: LocalFiles, replication: Replication,
                 on_failed: Callable[[], None]) -> None:
        self.ctx, self.cfg, self.source, self.replication, self.on_failed = ctx, cfg, source, replication, on_failed
        self.book: PossessionBook = replication.book
        self._rng = random.SystemRandom()
        self._limiter = trio.CapacityLimiter(CHALLENGES_IN_FLIGHT)
        self._per_holder: dict[str, trio.Semaphore] = {}
        self._nursery: trio.Nursery | None = None  # run()'s, where challenges live
        self._wake = trio.Event()
        self.answered = self.inconclusive = 0

    def wake(self) -> None:
        """Look at the claims again now (a push pass ended: receipts may have changed)."""
        self._wake.set()

    def observe(self) -> None:
        """Feed the book the current claims: each file's current version and the durable members whose receipts
        match it (failed ones included: the book keeps them failed)."""
        index, _, _ = self.replication.receipt_index()
        self.book.observe(time.monotonic(), {
            f.path: (f.manifest.size, f.manifest.root, index.confirmed_by(f.path, f.manifest.size, f.manifest.root))
            for f in self.source.files.values()})
        self.prune()

    def prune(self) -> None:
        """Forget the per-holder limits of holders no longer members with no challenge of theirs under way."""
        for h in [h for h, sem in self._per_holder.items()
                  if sem.value == CHALLENGES_PER_HOLDER and self.ctx.member(h) is None]:
            del self._per_holder[h]

    async def run(self) -> None:
        """Challenge what the book says is due, until cancelled: wakes at the book's deadline, every
        ``sync.interval_s`` to look at the claims, and on :meth:`wake`."""
        async with trio.open_nursery() as n:
            self._nursery = n
            while True:
                now = time.monotonic()
                try:
                    self.observe()
                    due = self.book.poll(now)
                except Exception:  # a bug here must not take sync (and the agent) down; tried again next wake
                    log.exception("sync: planning challenges failed unexpectedly")
                    due = []
                for c in due:
                    n.start_soon(self.challenge, c)
                deadline = self.book.next_deadline()
                wait = self.cfg.interval_s if deadline is None else min(self.cfg.interval_s, max(0.05, deadline - now))
                with trio.move_on_after(wait):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def verify_before_delete(self) -> None:
        """Before a disk-manager pass: challenge every holder counted toward R of the files that may go (R counted
        now; at most :data:`DELETE_CHECK_FILES`, oldest first) that has not passed within
        ``sync.challenge_window_s``, and wait for the answers, at most ``sync.challenge_timeout_s`` and 5 s (the
        challenges go on in :meth:`run`'s nursery; a later pass uses their answers). Never raises: on a bug
        nothing more is verified, so nothing more is deleted."""
        try:
            due = self._due_before_delete()
        except Exception:
            log.exception("sync: planning the challenges before a delete failed unexpectedly")
            return
        if self._nursery is None:  # not running (a test drives it): wait for every answer
            async with trio.open_nursery() as n:
                for c in due:
                    n.start_soon(self.challenge, c)
            return
        left = len(due)
        all_done = trio.Event()

        def one_done() -> None:
            nonlocal left
            left -= 1
            if left == 0:
                all_done.set()

        for c in due:  # in the long-lived nursery: a pass that stops waiting cancels none of them
            self._nursery.start_soon(self.challenge, c, one_done)
        if due:
            with trio.move_on_after(self.cfg.challenge_timeout_s + CONNECT_TIMEOUT_S):
                await all_done.wait()

    def _due_before_delete(self) -> list[SendChallenge]:
        """Mark the holders counted toward R of the files that may go as due (see :meth:`verify_before_delete`);
        the challenges now due."""
        self.observe()
        book = self.book
        index, known, _ = self.replication.receipt_index()
        r = self.cfg.replication_factor
        versions = []
        now = time.monotonic()
        for f in sorted(self.source.files.values(), key=lambda f: f.seen_at):
            m = f.manifest
            if book.delete_readiness(now, f.path, m.size, m.root, index.confirmed_by(f.path, m.size, m.root), r=r,
                                     durable_members=known) == "unproven":  # the one delete rule
                versions.append((f.path, m.size, m.root))
            if len(versions) >= DELETE_CHECK_FILES:
                break
        book.want_delete(time.monotonic(), versions)
        return book.poll(time.monotonic())

    async def challenge(self, c: SendChallenge, done: Callable[[], None] | None = None) -> None:
        """Challenge ``c.holder`` and report the outcome to the book (always, even when cancelled: ``inconclusive``,
        so no record stays ``checking``); on a failure run a push pass. ``done()`` is called at the end."""
        outcome = "inconclusive"
        try:
            async with self._limiter, self._per_holder.setdefault(c.holder, trio.Semaphore(CHALLENGES_PER_HOLDER)):
                outcome = await self._ask(c)
        except Exception:  # a bug here must not end the loop
            log.exception("sync: challenge of %s failed unexpectedly", c.holder)
        finally:
            effects = self.book.answered(time.monotonic(), c, outcome)
            if done is not None:
                done()
        if outcome in INCONCLUSIVE_REASONS:
            self.inconclusive += 1
        for e in effects:
            log.warning("sync: %s failed the challenge for %s (%s): it no longer counts; pushing again", e.holder,
                        e.path, e.reason)
        if effects:
            self.on_failed()

    async def _ask(self, c: SendChallenge) -> str:
        """One challenge: ``passed``, ``inconclusive`` or a failure reason."""
        m = self.ctx.member(c.holder)
        f = self.source.files.get(c.path)
        if f is None or f.manifest.size != c.size or f.manifest.root != c.root:
            return "inconclusive"  # the file changed: its new version is challenged on its own
        if m is None or not m.addr:
            return "unreachable"
        blocks = choose_blocks(f.manifest.blocks, self._rng)
        nonce = secrets.token_bytes(NONCE_BYTES)
        # read_path: what the manifest hashed (for SQLite the staging copy, a consistent snapshot, not the live file)
        want = await trio.to_thread.run_sync(expected_proofs, f.read_path, f, blocks, nonce, c.holder)
        if want is None:
            return "inconclusive"
        req = ChallengeRequest(self.ctx.node_id, c.holder, c.path, c.size, c.root, nonce, list(blocks))
        body = msgspec.msgpack.encode(req)
        client = self.ctx.client
        assert client is not None
        timeout_s = self.cfg.challenge_timeout_s
        timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
        busy = False  # the holder refused "overloaded" (503) at least once: a timeout then teaches nothing
        try:
            with trio.fail_after(timeout_s):
                while True:
                    async with client.stream("POST", f"http://{m.addr}{CHALLENGE_PATH}", content=body,
                                             headers=sign_challenge(self.ctx.identity, body), timeout=timeout) as resp:
                        raw = await read_capped(resp, answer_limit(len(blocks)), "challenge answer")
                        status = resp.status_code
                    if status != 503:
                        break
                    busy = True
                    await trio.sleep(OVERLOADED_RETRY_S * (0.5 + self._rng.random()))  # busy: ask again
        except (trio.TooSlowError, httpx.TimeoutException):
            return "overloaded" if busy else "timeout"
        except (httpx.HTTPError, OSError):
            return "unreachable"
        except SyncReplyRejected:
            return "malformed"
        if status != 200:
            return "malformed"  # a refusal: a holder that lost its copy answers 200 "absent"
        try:
            ans = decode_answer(raw, len(blocks))
        except SyncReplyRejected:
            return "malformed"
        self.answered += 1
        if ans.status == "absent":
            now_f = self.source.files.get(c.path)
            if now_f is None or now_f.manifest.size != c.size or now_f.manifest.root != c.root:
                # the file moved on while the challenge waited (retries on 503 take up to the timeout): an honest
                # holder that took the new version meanwhile holds the old one no more; inconclusive (a holder that
                # never passes still stops counting after a few of those, see PossessionBook)
                return "inconclusive"
            return "absent"
        ok = all(hmac.compare_digest(a, b) for a, b in zip(ans.proofs, want, strict=True))
        return "passed" if ok else "wrong_hash"

    def view(self) -> dict[str, Any]:
        """The ``challenges`` part of ``GET /sync/status``: sent, answered, passed, failed by reason."""
        b = self.book
        return {"sent": b.sent, "answered": self.answered, "passed": b.passed, "failed": dict(b.failed),
                "inconclusive": self.inconclusive, "overloaded": b.overloaded, "window_s": self.cfg.challenge_window_s,
                "interval_s": self.cfg.challenge_interval_s, "timeout_s": self.cfg.challenge_timeout_s}
