"""Distribution, durable to subscribers: signed publications, which ones a subscriber accepts, and where it fetches
each block from. Pure (msgspec, blake3, :mod:`p2pnode.identity` for signatures); no clock, no I/O.

A **publication** is one version of one published file: ``name`` (one path component), ``version`` (per name, 1 to
2^53, only a higher one is accepted), its :class:`~._manifest.Manifest` (size, block size, block hashes, root), the
``publisher`` key (``ed25519:<base64>``, the form of ``catalog.signers``) and its Ed25519 signature over
:func:`publication_signing_bytes` (a domain string, the name, the version and the manifest's root, which binds
size, block size and every block hash). A block fetched from anyone is checked against its hash here, so the
signed publication is the only thing a subscriber has to trust, and only from a key it pins itself.

:class:`PublicationBook` is a subscriber's (and a holder's) record of publications: what it accepted per name, the
version floor per name (the highest ever accepted; the driver persists it, so an old signed publication cannot
roll a restarted node back), and every refusal counted by reason (:data:`PUBLICATION_REFUSALS`):

========================  ==============================================================================
``malformed``             the encoded publication does not decode (a field missing, of the wrong type, out of bounds)
``bad_name``              the name is not one path component (``/``, ``..``, ``.``, empty, a control character,
                          more than 200 bytes: every path derived from it must fit NAME_MAX)
``unpinned``              the publisher's key is not in this node's ``sync.publishers`` (the default refuses all)
``bad_signature``         the signature does not verify for the publisher's key
``bad_manifest``          block count, size and root disagree
``stale_version``         a version not above the one held for that name (a replayed older publication)
``no_space``              the file is larger than the free disk less the guard's reserve
========================  ==============================================================================

:class:`FetchPlan` is one subscriber's fetch of one publication, BitTorrent-style: every block from any holder
that advertises it. Blocks are taken rarest first (fewest holders known), ties broken by a per-node rendezvous
order (BLAKE3 of this node, the root and the index), so subscribers start on different blocks and can serve each
other early; each block's holder is the best by rendezvous rank among those that have it, with free streams and
not backing off, holders other than the publisher first (the publisher serves what no one else has yet), at most
``streams_per_holder`` requests to one holder and ``max_streams`` in all. A request times out after
``request_timeout_s``; a failed holder backs off for ``backoff_s``, a holder whose requests time out (it claims
blocks and never sends them: BitTorrent's snubbing) for twice as long after each timeout in a row, up to
:data:`MAX_SNUB_FACTOR` times; a block from it ends the streak. Backoffs and streaks live in a
:class:`HolderHealth` the driver shares between the node's plans: a holder that failed one fetch is passed over by
all. Planning costs O(blocks) per call, not O(blocks ×
holders): the rarest-first order is kept until what holders have changes, and the scan stops once every holder
is busy. Progress and resume: the plan is built with
the blocks already verified on disk. :class:`VersionKeeper` says when a previous version may be removed: when no
job that started while it was current still runs.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated

import blake3
import msgspec
from msgspec import Meta

from ..errors import PeerError
from ..identity import verify_signature
from ._manifest import BLOCK_HASH_BYTES, MAX_BLOCK_BYTES, Manifest

__all__ = [
    "FetchBlocks",
    "MAX_NAME_BYTES",
    "MAX_REQUEST_BYTES",
    "FetchPlan",
    "FetchPolicy",
    "HolderHealth",
    "PUBLICATION_REFUSALS",
    "Publication",
    "PublicationBook",
    "PublicationRefused",
    "VersionKeeper",
    "check_publication_name",
    "decode_publication",
    "decode_publisher",
    "encode_publication",
    "publication_signing_bytes",
    "publisher_text",
    "sign_publication",
]

PUBLICATION_DOMAIN = b"p2pnode publication v1\x00"
PUBLICATION_REFUSALS = ("malformed", "bad_name", "unpinned", "bad_signature", "bad_manifest", "stale_version",
                        "no_space")
MAX_PUBLICATION_BLOCKS = 1 << 16
"""Blocks of one publication at most (a 16 MiB block size: 1 TiB; the block-size rule keeps files near 2,000)."""
MAX_PUBLICATION_BYTES = 64 + MAX_PUBLICATION_BLOCKS * BLOCK_HASH_BYTES * 2
"""Bytes of an encoded publication at most (its block hashes are most of it)."""
MAX_VERSION = 2**53
MAX_SNUB_FACTOR = 32
"""A holder whose requests keep timing out backs off ``backoff_s`` × 1, 2, 4 … up to this factor."""
MAX_NAME_BYTES = 200
"""UTF-8 bytes of a published name at most, so every path derived from it fits NAME_MAX (255 bytes): the partial
file ``<name>@<version>.part`` adds 22 bytes at most, the link's temporary name ``.<name>.link`` 6."""
MAX_REQUEST_BYTES = 16 * 2**20
"""Block bytes one request may ask for at most (a request of one block always may: a block is 16 MiB at most), so
a small request cannot make a holder read and hold hundreds of MiB."""
_PUBLISHER = r"^ed25519:[A-Za-z0-9+/]{43}=$"
_PUBLISHER_RE = re.compile(_PUBLISHER.replace("$", r"\Z"))


class PublicationRefused(PeerError):
    """A publication refused (a :class:`p2pnode.errors.PeerError`): ``reason`` is one of
    :data:`PUBLICATION_REFUSALS`, ``detail`` says what."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def check_publication_name(name: str) -> str:
    """``name`` if it is one path component: 1 to :data:`MAX_NAME_BYTES` (200) bytes of UTF-8, not ``.`` or
    ``..``, no ``/``, backslash, NUL or control character, not hidden (no leading ``.``: partial files live beside
    it). Raises :class:`PublicationRefused` (``bad_name``)."""
    ok = (isinstance(name, str) and 0 < len(name.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES
          and "/" not in name and "\\" not in name and not name.startswith(".")
          and not any(ord(c) < 32 or ord(c) == 127 for c in name))
    if not ok:
        raise PublicationRefused("bad_name", f"{str(name)[:80]!r} is not one path component")
    return name


def publisher_text(public_key: bytes) -> str:
    """``ed25519:<base64>`` of a raw 32-byte public key: what ``sync.publishers`` lists."""
    return "ed25519:" + base64.b64encode(public_key).decode()


def decode_publisher(text: str) -> bytes:
    """The raw 32-byte public key of a ``sync.publishers`` entry. Raises ``ValueError`` naming what is wrong."""
    if not isinstance(text, str) or not _PUBLISHER_RE.match(text):
        raise ValueError(f"publisher {str(text)[:60]!r}: expected ed25519:<base64 of 32 bytes>")
    try:
        return base64.b64decode(text[8:], validate=True)
    except binascii.Error:
        raise ValueError(f"publisher {text[:60]!r}: expected ed25519:<base64 of 32 bytes>") from None


def publication_signing_bytes(name: str, version: int, root: bytes, to: str = "") -> bytes:
    """What a publisher signs: the domain, the name's length (2 bytes) and UTF-8, the version (8 bytes, big-endian),
    the manifest root (32 bytes), and the target tag's length (1 byte) and UTF-8."""
    raw = name.encode("utf-8", "surrogatepass")
    tag = to.encode("utf-8", "surrogatepass")[:255]
    return (PUBLICATION_DOMAIN + len(raw).to_bytes(2, "big") + raw + version.to_bytes(8, "big") + root
            + len(tag).to_bytes(1, "big") + tag)


class Publication(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One signed version of one published file (see the module docstring). ``hashes``: 32 bytes per block;
    ``root``: :func:`~._manifest.manifest_root` of size, block size and hashes; ``sig``: 64 bytes."""

    name: Annotated[str, Meta(min_length=1, max_length=255)]
    version: Annotated[int, Meta(ge=1, le=MAX_VERSION)]
    size: Annotated[int, Meta(ge=0, le=MAX_PUBLICATION_BLOCKS * MAX_BLOCK_BYTES)]
    block_size: Annotated[int, Meta(ge=1, le=MAX_BLOCK_BYTES)]
    hashes: Annotated[bytes, Meta(max_length=MAX_PUBLICATION_BLOCKS * BLOCK_HASH_BYTES)]
    root: Annotated[bytes, Meta(min_length=32, max_length=32)]
    publisher: Annotated[str, Meta(pattern=_PUBLISHER)]
    sig: Annotated[bytes, Meta(min_length=64, max_length=64)]
    to: Annotated[str, Meta(max_length=128, pattern=r"^[A-Za-z0-9_.:=@/+-]*\Z")] = ""
    """The tag of the nodes it is for (``training`` for ``--to tag:training``); empty: every node that pins the
    publisher. Signed: a member cannot redirect it."""

    @property
    def manifest(self) -> Manifest:
        """The file's manifest (size, block size, hashes, root)."""
        return Manifest(self.size, self.block_size, self.hashes, self.root)

    @property
    def key(self) -> tuple[str, int]:
        """``(name, version)``."""
        return (self.name, self.version)


def sign_publication(sign: Callable[[bytes], bytes], public_key: bytes, name: str, version: int,
                     manifest: Manifest, to: str = "") -> Publication:
    """The publication of ``manifest`` as ``name`` at ``version``, signed by ``sign(data) -> 64 bytes`` (an
    operator key's or the node's ``sign``) whose public key is ``public_key`` (32 raw bytes). Raises
    :class:`PublicationRefused` for a bad name or an inconsistent manifest, ``ValueError`` for a version out of
    1..2^53."""
    check_publication_name(name)
    if not 1 <= version <= MAX_VERSION:
        raise ValueError(f"version {version} not in 1..2^53")
    if not manifest.is_consistent():
        raise PublicationRefused("bad_manifest", "block count, size and root disagree")
    sig = sign(publication_signing_bytes(name, version, manifest.root, to))
    return Publication(name, version, manifest.size, manifest.block_size, manifest.hashes, manifest.root,
                       publisher_text(public_key), bytes(sig), to)


def encode_publication(pub: Publication) -> bytes:
    """The msgpack form of a publication (``GET /sync/publications``, the persisted copy)."""
    return msgspec.msgpack.encode(pub)


_DECODER = msgspec.msgpack.Decoder(Publication)


def decode_publication(data: bytes) -> Publication:
    """A publication from its msgpack form, bounded (:data:`MAX_PUBLICATION_BYTES`); checks shape only (see
    :meth:`PublicationBook.check` for the rules). Raises :class:`PublicationRefused` (``malformed``)."""
    if len(data) > MAX_PUBLICATION_BYTES:
        raise PublicationRefused("malformed", f"{len(data)} bytes, more than {MAX_PUBLICATION_BYTES}")
    try:
        return _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as exc:
        raise PublicationRefused("malformed", str(exc)[:200]) from None


class PublicationBook:
    """The publications a node accepted, per name, and the rules for accepting one (module docstring).

    ``publishers``: the pinned keys (``ed25519:<base64>``; empty refuses every publication); ``floors``: the
    highest version ever accepted per name, as persisted (read back by the driver). :attr:`refused` counts
    refusals by reason; :attr:`current` holds the newest accepted publication per name."""

    def __init__(self, publishers: Iterable[str], floors: Mapping[str, int] | None = None) -> None:
        self.publishers: dict[str, bytes] = {p: decode_publisher(p) for p in publishers}
        self.floors: dict[str, int] = dict(floors or {})
        self.current: dict[str, Publication] = {}
        self.refused: Counter[str] = Counter()

    def check(self, pub: Publication, *, free_bytes: int | None = None, reserve_bytes: int = 0,
              have_bytes: int = 0, restoring: bool = False) -> Publication:
        """``pub`` if this node may accept it now, else :class:`PublicationRefused` (counted). ``free_bytes``:
        free disk where the file lands (None: not checked, a holder only serving); ``reserve_bytes``: what the
        guard keeps free; ``have_bytes``: bytes of it already on disk (a resumed partial file); ``restoring``: the
        publication this node held before a restart (its version may equal the floor). Order: name, key
        pinned, signature, manifest, version, space, so an unpinned member learns nothing more."""
        try:
            check_publication_name(pub.name)
            key = self.publishers.get(pub.publisher)
            if key is None:
                raise PublicationRefused("unpinned", f"{pub.publisher[:60]} is not in sync.publishers")
            if not verify_signature(key, pub.sig, publication_signing_bytes(pub.name, pub.version, pub.root, pub.to)):
                raise PublicationRefused("bad_signature", f"signature over {pub.name!r} v{pub.version} does not verify")
            m = pub.manifest
            if not m.is_consistent() or m.blocks > MAX_PUBLICATION_BLOCKS:
                raise PublicationRefused("bad_manifest", "block count, size and root disagree")
            floor = self.floors.get(pub.name, 0)
            held = self.current.get(pub.name)
            same = held is not None and held.root == pub.root
            if pub.version < floor or (pub.version == floor and not (same or restoring)):
                raise PublicationRefused("stale_version", f"{pub.name!r} v{pub.version}, v{floor} already accepted")
            if free_bytes is not None and pub.size - have_bytes > free_bytes - reserve_bytes:
                raise PublicationRefused("no_space", f"{pub.size} bytes, {free_bytes} free less a reserve of "
                                                     f"{reserve_bytes}")
        except PublicationRefused as exc:
            self.refused[exc.reason] += 1
            raise
        return pub

    def accept(self, pub: Publication, *, free_bytes: int | None = None, reserve_bytes: int = 0,
               have_bytes: int = 0, restoring: bool = False) -> bool:
        """Check ``pub`` (:meth:`check`, same keywords) and hold it as its name's current publication, raising the
        floor. True when it is new (a higher version), False when it is the one already held. Raises
        :class:`PublicationRefused`."""
        held = self.current.get(pub.name)
        if held is not None and held.version == pub.version and held.root == pub.root:
            return False
        self.check(pub, free_bytes=free_bytes, reserve_bytes=reserve_bytes, have_bytes=have_bytes,
                   restoring=restoring)
        self.current[pub.name] = pub
        self.floors[pub.name] = pub.version
        return True

    def serves(self, root: bytes) -> Publication | None:
        """The accepted publication whose manifest root is ``root`` (blocks are served only from these)."""
        for pub in self.current.values():
            if pub.root == root:
                return pub
        return None


# -- fetching ---------------------------------------------------------------------------------------------------
class FetchPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a subscriber fetches: ``streams_per_holder`` requests to one holder at most, ``max_streams`` in all,
    ``blocks_per_request`` blocks per request, ``request_timeout_s`` before a request counts as failed,
    ``backoff_s`` a failed holder is skipped, ``max_request_bytes`` block bytes per request at most (one block
    always fits)."""

    streams_per_holder: int = 2
    max_streams: int = 8
    blocks_per_request: int = 4
    max_request_bytes: int = MAX_REQUEST_BYTES
    request_timeout_s: float = 60.0
    backoff_s: float = 10.0


class FetchBlocks(msgspec.Struct, frozen=True):
    """An effect: ask ``holder`` for these block ``indices`` (ascending) of the publication with this ``root``."""

    holder: str
    root: bytes
    indices: tuple[int, ...]


class HolderHealth:
    """Which holders a node's fetches pass over, shared by every :class:`FetchPlan` of the node: a holder that could
    not be reached, answered busy or timed out in one fetch backs off in all of them, and its run of timeouts
    (:data:`MAX_SNUB_FACTOR`) is one count, so a member claiming every block of many publications and never
    answering costs one timeout per backoff, not one per publication."""

    def __init__(self) -> None:
        self.backoff_until: dict[str, float] = {}
        """holder -> when it may be asked again (the driver's monotonic seconds)."""
        self.snubs: Counter[str] = Counter()
        """Requests to each holder that timed out in a row (reset by a block from it)."""

    def back_off(self, holder: str, until: float) -> None:
        """``holder`` is not asked before ``until`` (a later backoff already set stands)."""
        self.backoff_until[holder] = max(until, self.backoff_until.get(holder, until))

    def expire(self, now: float) -> None:
        """Forget the backoffs over at ``now``."""
        for h in [h for h, t in self.backoff_until.items() if t <= now]:
            del self.backoff_until[h]


class _Request(msgspec.Struct):
    holder: str
    indices: tuple[int, ...]
    deadline: float


def _rank(holder: str, root: bytes, index: int) -> bytes:
    """Rendezvous weight of ``holder`` for block ``index`` of ``root`` (higher first)."""
    return blake3.blake3(holder.encode() + b"\x00" + root + index.to_bytes(4, "big")).digest()


class FetchPlan:
    """One subscriber's fetch of one publication (module docstring). ``me``: this node's id (its block order);
    ``publisher``: the node id of the member that published it (asked last); ``have``: blocks already verified
    on disk (a resume; the plan adds to this set). Holders are told with :meth:`holder_has`; the driver asks
    :meth:`next_requests` and reports :meth:`block_verified`, :meth:`block_failed` and :meth:`request_ended`;
    :meth:`on_timer` expires requests past their deadline; :meth:`next_deadline` says when to call it."""

    def __init__(self, pub: Publication, *, me: str, publisher: str = "", policy: FetchPolicy | None = None,
                 have: set[int] | None = None, health: HolderHealth | None = None) -> None:
        self.pub = pub
        self.me = me
        self.publisher = publisher
        self.policy = policy if policy is not None else FetchPolicy()
        self.have: set[int] = have if have is not None else set()
        self.holders: dict[str, frozenset[int] | None] = {}
        """holder -> the blocks it has (None: all of them)."""
        self.health = health if health is not None else HolderHealth()
        """Holders backing off and their runs of timeouts (shared by the node's fetches when the driver passes one)."""
        self._ranked: list[int] | None = None  # blocks some holder has, rarest first (None: holders changed)
        self.bad: set[str] = set()
        """Holders that sent a block not matching its hash: never asked for this publication again (one holder
        serving a tampered copy never stops the fetch from the others)."""
        self.failures: Counter[str] = Counter()
        self.bytes_from: Counter[str] = Counter()
        self._requests: list[_Request] = []
        root = pub.root
        self._order = {i: blake3.blake3(me.encode() + b"\x00" + root + i.to_bytes(4, "big")).digest()
                       for i in range(pub.manifest.blocks)}

    @property
    def backoff_until(self) -> dict[str, float]:
        """holder -> when it may be asked again (:class:`HolderHealth`)."""
        return self.health.backoff_until

    @property
    def snubs(self) -> Counter[str]:
        """Requests to each holder that timed out in a row (:class:`HolderHealth`)."""
        return self.health.snubs

    # -- inputs -------------------------------------------------------------------------------------------------
    def holder_has(self, holder: str, blocks: Iterable[int] | None) -> None:
        """``holder`` has these blocks of the publication (None: all of it); replaces what was known. This node
        itself is never a holder."""
        if holder == self.me:
            return
        n = self.pub.manifest.blocks
        new = None if blocks is None else frozenset(i for i in blocks if 0 <= i < n)
        if holder not in self.holders or self.holders[holder] != new:
            self.holders[holder] = new
            self._ranked = None

    def holder_gone(self, holder: str) -> None:
        """``holder`` is no longer a member (or no longer holds the publication)."""
        if holder in self.holders:
            del self.holders[holder]
            self._ranked = None

    def block_verified(self, index: int, holder: str = "") -> None:
        """Block ``index`` arrived and matched its hash; it is on disk."""
        if 0 <= index < self.pub.manifest.blocks and index not in self.have:
            self.have.add(index)
            if holder:
                self.bytes_from[holder] += self.pub.manifest.block_len(index)
                self.snubs.pop(holder, None)

    def block_failed(self, index: int, holder: str, now: float) -> None:
        """Block ``index`` from ``holder`` did not match its hash: the holder is bad for this publication (never asked
        again; the block is asked of another)."""
        self.failures[holder] += 1
        self.bad.add(holder)
        self._ranked = None

    def request_ended(self, req: FetchBlocks, now: float, *, failed: bool = False,
                      backoff_s: float | None = None) -> None:
        """The request ``req`` is over (its blocks reported one by one); ``failed``: the holder could not be reached
        or refused; it backs off for ``backoff_s`` (default: the policy's; a holder that answered busy: less)."""
        for i, r in enumerate(self._requests):
            if r.holder == req.holder and r.indices == req.indices:
                del self._requests[i]
                break
        if failed:
            self.failures[req.holder] += 1
            self.health.back_off(req.holder, now + (self.policy.backoff_s if backoff_s is None else backoff_s))

    def on_timer(self, now: float) -> list[FetchBlocks]:
        """Requests past their deadline end as failed (their holders back off); returns them (the driver cancels
        those still running)."""
        self.health.expire(now)
        late = [r for r in self._requests if r.deadline <= now]
        out = []
        for h in {r.holder for r in late}:  # requests of one holder timing out together: one step of its streak
            self.snubs[h] += 1
        for r in late:
            req = FetchBlocks(r.holder, self.pub.root, r.indices)
            factor = min(MAX_SNUB_FACTOR, 2 ** min(self.snubs[r.holder] - 1, 16))
            self.request_ended(req, now, failed=True, backoff_s=self.policy.backoff_s * factor)
            out.append(req)
        return out

    # -- outputs ------------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Every block verified."""
        return len(self.have) >= self.pub.manifest.blocks

    def progress(self) -> tuple[int, int, int]:
        """``(blocks verified, blocks in all, bytes verified)``."""
        m = self.pub.manifest
        return len(self.have), m.blocks, sum(m.block_len(i) for i in self.have)

    def next_deadline(self) -> float | None:
        """When :meth:`on_timer` next has something to do (a request's deadline or a backoff's end), or None."""
        times = [r.deadline for r in self._requests]
        if self.backoff_until and not self.done:
            times += list(self.backoff_until.values())
        return min(times) if times else None

    def next_requests(self, now: float) -> list[FetchBlocks]:
        """New requests to start now (each recorded as under way until :meth:`request_ended`): blocks neither held
        nor asked for, rarest first, each from its best eligible holder; consecutive blocks of the same holder
        share a request up to ``blocks_per_request``. Empty when done, at the stream caps, or nobody has more."""
        p = self.policy
        self.health.expire(now)
        if self.done or len(self._requests) >= p.max_streams:
            return []
        pending = {i for r in self._requests for i in r.indices}
        load: Counter[str] = Counter(r.holder for r in self._requests)
        open_ = {h for h in self.holders if h not in self.bad and h not in self.backoff_until
                 and load[h] < p.streams_per_holder}
        picks: dict[str, list[int]] = {}
        out: list[FetchBlocks] = []
        m = self.pub.manifest
        for i in self._rarest_first():
            if not open_:
                break  # every holder is busy: the rest waits (the scan never goes on for nothing)
            if i in self.have or i in pending:
                continue
            best = self._best_holder(i, open_)
            if best is None:
                continue
            run = picks.setdefault(best, [])
            if run and sum(m.block_len(j) for j in run) + m.block_len(i) > p.max_request_bytes:
                out.append(self._start(best, run, now))  # the run is full by bytes: it goes, a new one starts
                load[best] += 1
                picks[best] = run = []
                if len(self._requests) >= p.max_streams:
                    return out
                if load[best] >= p.streams_per_holder:
                    open_.discard(best)
                    del picks[best]
                    continue
            run.append(i)
            if len(run) >= p.blocks_per_request:
                out.append(self._start(best, run, now))
                del picks[best]
                load[best] += 1
                if load[best] >= p.streams_per_holder:
                    open_.discard(best)
                if len(self._requests) >= p.max_streams:
                    return out
        for holder, run in picks.items():
            if len(self._requests) >= p.max_streams:
                break
            if run:
                out.append(self._start(holder, run, now))
        return out

    def _rarest_first(self) -> list[int]:
        """The blocks some (not bad) holder has, fewest holders first, ties by this node's rendezvous order; kept
        until what holders have changes."""
        if self._ranked is None:
            count: Counter[int] = Counter()
            n = self.pub.manifest.blocks
            for h, blocks in self.holders.items():
                if h not in self.bad:
                    count.update(range(n) if blocks is None else blocks)
            self._ranked = sorted(count, key=lambda i: (count[i], self._order[i]))
        return self._ranked

    def _best_holder(self, index: int, open_: set[str]) -> str | None:
        root = self.pub.root
        ok = [h for h in open_ if (b := self.holders.get(h, frozenset())) is None or index in b]
        if not ok:
            return None
        return max(ok, key=lambda h: (h != self.publisher, _rank(h, root, index)))

    def _start(self, holder: str, run: list[int], now: float) -> FetchBlocks:
        indices = tuple(sorted(run))
        self._requests.append(_Request(holder, indices, now + self.policy.request_timeout_s))
        return FetchBlocks(holder, self.pub.root, indices)

    @property
    def in_flight(self) -> int:
        """Requests under way."""
        return len(self._requests)


# -- previous versions ------------------------------------------------------------------------------------------
class VersionKeeper:
    """Which previous versions of published files must stay on disk: a version stays while a job of this node that
    started while it was current still runs (its process may have resolved the name to it, or will read it). The
    driver reports :meth:`switched` (wall-clock seconds, like a job's ``started_at``) and asks :meth:`removable`
    with the start times of the jobs running now."""

    def __init__(self) -> None:
        self.current: dict[str, tuple[int, float]] = {}  # name -> (version, current since)
        self.previous: dict[tuple[str, int], tuple[float, float]] = {}  # (name, version) -> [since, until)

    def switched(self, name: str, version: int, at: float) -> None:
        """``name`` points at ``version`` from ``at`` on; the version it replaced is kept until :meth:`removable`
        lets it go."""
        old = self.current.get(name)
        self.current[name] = (version, at)
        if old is not None and old[0] != version:
            self.previous[(name, old[0])] = (old[1], at)

    def kept(self, name: str, version: int, since: float, until: float) -> None:
        """A previous version found on disk (after a restart): kept while a job that started in ``[since, until)``
        runs (the driver passes 0 and the start: any job older than the restart may use it)."""
        if self.current.get(name, (None, 0.0))[0] != version:
            self.previous[(name, version)] = (since, until)

    def removable(self, running_started_at: Iterable[float]) -> list[tuple[str, int]]:
        """``(name, version)`` of previous versions that no running job (given by its start time, wall-clock s)
        started while they were current; they are forgotten (the driver removes the files)."""
        starts = list(running_started_at)
        out = sorted(k for k, (since, until) in self.previous.items() if not any(since <= t < until for t in starts))
        for k in out:
            del self.previous[k]
        return out
