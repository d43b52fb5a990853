"""File-backed state of the node core (the data dir): snapshot version, incarnation, vote, voter roll, keyring.

Blocking file I/O, no trio: the agent calls these from its event loop only for small files (a few hundred
bytes, written with :func:`p2pnode._files.atomic_write_bytes`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .._files import atomic_write_bytes
from ..election import Vote, VoterRoll
from ..errors import IdentityError
from ..identity import PersistentCounter
from ..keyring import Keyring, KeyringError

__all__ = ["FileStore", "load_keyring", "load_roll", "load_vote", "VERSION_FILE", "INCARNATION_FILE", "VOTE_FILE",
           "VOTERS_FILE"]

log = logging.getLogger(__name__)

VERSION_FILE = "snapshot.version"
INCARNATION_FILE = "incarnation"
VOTE_FILE = "vote.json"
VOTERS_FILE = "voters.json"


def load_vote(path: Path) -> Vote | None:
    """The persisted vote, or None (missing or unreadable: a voter that lost its vote file starts over with a
    term above every term it hears, which keeps one vote per term unless the file was lost after voting)."""
    try:
        d = json.loads(path.read_text())
        return Vote(str(d["candidate"]), int(d["term"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable vote file %s: %s", path, exc)
        return None


def load_roll(path: Path, *, trusted: bool, bootstrap_s: float) -> VoterRoll:
    """The persisted voter roll, or a new one (missing file). An unreadable file is an error the operator must
    look at (a node that forgot its voters could count a minority as a majority): ``IdentityError``."""
    try:
        return VoterRoll.from_wire(json.loads(path.read_text()), trusted=trusted, bootstrap_s=bootstrap_s)
    except FileNotFoundError:
        return VoterRoll(trusted=trusted, bootstrap_s=bootstrap_s)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IdentityError(f"{path}: unreadable voter roll ({exc}); restore it, or remove it to rebuild the "
                            "roll from the voters seen in the next minutes") from None


def load_keyring(path: Path, bootstrap_token: str) -> Keyring:
    """The keyring of token mode: the file in the data dir, or (first start) one holding the configured token,
    written there. Raises :class:`KeyringError` when the file is unreadable or there is no token at all."""
    ring = Keyring.load(path)
    if ring is None:
        if not bootstrap_token:
            raise KeyringError(f"token mode without a token: set P2PNODE_CLUSTER_TOKEN or `p2pnode keys install` "
                               f"into {path}")
        ring = Keyring.of([bootstrap_token])
        ring.save(path)
        log.info("keyring created with the configured cluster token (key id %s); rotate with `p2pnode keys`",
                 ring.primary)
    elif not ring.tokens:
        raise KeyringError(f"{path}: the keyring holds no token (p2pnode keys install TOKEN)")
    return ring


class FileStore:
    """The :class:`p2pnode.node.CoreStore` of the agent: files in ``data_dir``. Write failures are logged (the
    node carries on; a lost vote file is covered by :func:`load_vote`'s rule)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.versions = PersistentCounter(data_dir / VERSION_FILE)
        self.incarnations = PersistentCounter(data_dir / INCARNATION_FILE, block=1)

    def next_version(self) -> int:
        """See :meth:`p2pnode.node.CoreStore.next_version` (a block reservation in ``snapshot.version``)."""
        return self.versions.next()

    def advance_version_past(self, value: int) -> None:
        """See :meth:`p2pnode.node.CoreStore.advance_version_past`."""
        self.versions.advance_past(value)

    def next_incarnation(self) -> int:
        """This run's incarnation: one above the last run's."""
        return self.incarnations.next()

    def incarnation_past(self, value: int) -> int:
        """See :meth:`p2pnode.node.CoreStore.incarnation_past` (written to ``incarnation``)."""
        self.incarnations.advance_past(value)
        return self.incarnations.next()

    def save_vote(self, vote: Vote) -> None:
        """Write ``vote.json`` atomically (mode 0600)."""
        self._write(VOTE_FILE, json.dumps(vote.to_wire()).encode(), "vote")

    def save_roll(self, roll: VoterRoll) -> None:
        """Write ``voters.json`` atomically (mode 0600)."""
        self._write(VOTERS_FILE, json.dumps(roll.to_wire()).encode(), "voter roll")

    def _write(self, name: str, data: bytes, what: str) -> None:
        try:
            atomic_write_bytes(self.data_dir / name, data, mode=0o600)
        except OSError as exc:
            log.error("cannot persist the %s: %s", what, exc)
