"""Node identity: an Ed25519 key in the data dir, the node id derived from it, and persistent counters.

* :func:`verify_signature` is the one Ed25519 verification every check calls (defined in :mod:`p2pnode._ed25519`,
  libsodium's, with :class:`SigningKey`).
* The private key is the 32-byte raw Ed25519 seed in ``<data_dir>/node.key``, file mode 0600, created on
  first start and reused afterwards.
* The **node id** is ``base32(blake2b(public_key, 10 bytes))`` in lower case without padding (16 characters),
  so any receiver can check that an envelope's key belongs to its claimed origin.
* In ``token`` trust mode a key carries an **endorsement**: ``HMAC-SHA256(token, b"p2pnode-endorse-v1" + key)``.
  Only machines holding the cluster token can produce it.
* :class:`PersistentCounter` hands out integers that keep increasing across restarts (snapshot versions),
  persisting a reserved block ahead so that it writes to disk once per ``block`` values, not once per value.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from ._ed25519 import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, SigningKey, verify_signature
from ._files import atomic_write_bytes
from .errors import IdentityError

__all__ = [
    "KEY_FILE",
    "PUBLIC_KEY_BYTES",
    "SIGNATURE_BYTES",
    "Identity",
    "PersistentCounter",
    "SigningKey",
    "endorsement_for",
    "load_or_create_identity",
    "node_id_for",
    "verify_signature",
]

log = logging.getLogger(__name__)

KEY_FILE = "node.key"
COUNTER_MAX = 2**53 - 1
"""Bound of a :class:`PersistentCounter` (equal to :data:`p2pnode.snapshot.COUNTER_MAX`, the bound of versions and
incarnations on the wire: a counter never hands out a value its own snapshot could not carry)."""
ENDORSEMENT_BYTES = 32
_ENDORSE_CONTEXT = b"p2pnode-endorse-v1"


_B32_PAIRS = tuple(a + b for a in "abcdefghijklmnopqrstuvwxyz234567" for b in "abcdefghijklmnopqrstuvwxyz234567")
"""The RFC 4648 base32 alphabet in lower case, two characters (10 bits) at a time."""


def node_id_for(public_key: bytes) -> str:
    """Node id (16 lower-case base32 characters) for a 32-byte raw Ed25519 public key: RFC 4648 base32 of its
    10-byte BLAKE2b digest (``base64.b32encode(digest).decode().lower()``, which is pure Python and costs 5x
    this table look-up; every envelope a node receives derives its origin here)."""
    n = int.from_bytes(hashlib.blake2b(public_key, digest_size=10).digest(), "big")
    p = _B32_PAIRS
    return (p[n >> 70] + p[(n >> 60) & 1023] + p[(n >> 50) & 1023] + p[(n >> 40) & 1023]
            + p[(n >> 30) & 1023] + p[(n >> 20) & 1023] + p[(n >> 10) & 1023] + p[n & 1023])


def endorsement_for(token: str, public_key: bytes) -> bytes:
    """32-byte endorsement of ``public_key`` by the cluster ``token`` (HMAC-SHA256)."""
    return hmac.new(token.encode("utf-8"), _ENDORSE_CONTEXT + public_key, hashlib.sha256).digest()


class Identity(msgspec.Struct, frozen=True):
    """This node's key pair. ``public_key`` is the 32 raw bytes; ``node_id`` is derived from it."""

    private_key: SigningKey
    public_key: bytes
    node_id: str

    @classmethod
    def from_private_key(cls, key: SigningKey) -> Identity:
        """The identity of an Ed25519 private key: its raw public key and the node id derived from it."""
        return cls(private_key=key, public_key=key.public_key, node_id=node_id_for(key.public_key))

    @classmethod
    def generate(cls) -> Identity:
        """A fresh in-memory identity (tests and the simulator)."""
        return cls.from_private_key(SigningKey.generate())

    def sign(self, data: bytes) -> bytes:
        """64-byte Ed25519 signature of ``data``."""
        return self.private_key.sign(data)


def load_or_create_identity(data_dir: Path) -> Identity:
    """Load ``<data_dir>/node.key``, or create it (mode 0600) on first start.

    Raises :class:`IdentityError` when something other than a regular file is at the key's path, or the file
    is not a 32-byte Ed25519 seed (the message names the remedy); ``OSError`` from the file system otherwise.
    A key file readable by group or others is tightened to 0600 with a warning.
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / KEY_FILE
    remedy = "restore this node's key file, or move it away to start as a new node"
    if path.exists():
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise IdentityError(f"node key {path} is {kind} ({remedy})")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            log.warning("key file %s had mode %o; tightening to 0600", path, mode)
            os.chmod(path, 0o600)
        seed = path.read_bytes()
        if len(seed) != 32:
            raise IdentityError(f"{path}: expected a 32-byte Ed25519 seed, found {len(seed)} bytes ({remedy})")
        return Identity.from_private_key(SigningKey(seed))
    key = SigningKey.generate()
    atomic_write_bytes(path, key.seed, mode=0o600)
    ident = Identity.from_private_key(key)
    log.info("created node key %s (node id %s)", path, ident.node_id)
    return ident


class PersistentCounter:
    """A counter that never repeats a value across restarts (crash included).

    The file holds a high-water mark ``reserved``; values below it may have been handed out. On load the
    counter starts at ``reserved`` and immediately reserves ``block`` more, so a crash loses at most
    ``block`` numbers and a restart never reuses one.

    Raises :class:`IdentityError` (the agent exits 2 with that one line) when the file is there but is not ASCII
    digits at most :data:`COUNTER_MAX` - 2 ``block`` (decoded as a bounded JSON integer by msgspec: ``"²"``,
    ``"١٢"``, a sign, a leading zero, 400 digits, garbage are refused). There is no safe value to go on from: a
    lower one repeats versions (or incarnations) its peers already hold under this node's key, so they would ignore
    its snapshots (or their suspicions would win), and a value near the bound would make its snapshots
    unpublishable. The operator restores the file or removes it; a node without the file starts at 0 and jumps
    past the versions its peers show it (:meth:`advance_past`), as on a node whose data dir was lost.
    """

    def __init__(self, path: Path, *, block: int = 10_000) -> None:
        self._path = Path(path)
        self._block = block
        start = 0
        if self._path.exists():
            bound = Annotated[int, Meta(ge=0, le=COUNTER_MAX - 2 * block)]
            try:
                raw = self._path.read_bytes()
                start = msgspec.json.decode(raw.strip() if len(raw) <= 64 else b"-", type=bound)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:  # OSError: the CLI names the cause
                raise IdentityError(f"{self._path}: not a counter of ASCII digits at most {COUNTER_MAX - 2 * block} "
                                    f"({exc}); restore it, or remove it to start the counter over from what the "
                                    "peers show") from None
        self._value = start
        self._reserved = start
        self._reserve()

    def _reserve(self) -> None:
        self._reserved = self._value + self._block
        atomic_write_bytes(self._path, f"{self._reserved}\n".encode(), mode=0o600)

    @property
    def value(self) -> int:
        """The last value handed out (or the starting floor before the first :meth:`next`)."""
        return self._value

    def next(self) -> int:
        """Return the next value (strictly greater than every earlier one, across restarts)."""
        self._value += 1
        if self._value >= self._reserved:
            self._reserve()
        return self._value

    def advance_past(self, value: int) -> None:
        """Make the next value exceed ``value`` (a peer showed us a version a former run of ours published)."""
        if value >= self._value:
            self._value = value
            if self._value >= self._reserved:
                self._reserve()
