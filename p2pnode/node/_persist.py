"""File-backed state of the node core (the data dir): snapshot version, incarnation, vote, voter roll, keyring.

Blocking file I/O, no trio: the agent calls these from its event loop only for small files (a few hundred
bytes, written with :func:`p2pnode._files.atomic_write_bytes`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from .._files import atomic_write_bytes
from ..certs import RoleCert
from ..election import Vote, VoterRoll
from ..identity import PersistentCounter
from ..keyring import Keyring, KeyringError
from ..snapshot import MARKS_MAX, ROLL_MAX, EligibilityMark, NodeId, VoteWire, WallSeconds
from ..statefiles import decode_entries, decode_entry, read_json_file, report_for

__all__ = ["FileStore", "OwnCert", "load_keyring", "load_role_floors", "load_roll", "load_vote", "save_role_floors",
           "VERSION_FILE", "INCARNATION_FILE", "VOTE_FILE", "VOTERS_FILE", "ROLE_FLOORS_FILE"]

log = logging.getLogger(__name__)

VERSION_FILE = "snapshot.version"
INCARNATION_FILE = "incarnation"
VOTE_FILE = "vote.json"
VOTERS_FILE = "voters.json"
ROLE_FLOORS_FILE = "role_floors.json"
"""Per node, the ``issued_at`` of the newest verified role certificate seen (:class:`p2pnode.certs.RoleGate`)."""


class RoleFloor(msgspec.Struct, frozen=True):
    """One entry of :data:`ROLE_FLOORS_FILE`: ``node`` id and ``issued_at`` (Unix seconds)."""

    node: NodeId
    issued_at: Annotated[int, Meta(ge=0, le=10**11)]


def load_role_floors(data_dir: Path, *, limit: int) -> dict[str, int]:
    """The persisted certificate floors (``[{"node": id, "issued_at": int}]``, each entry decoded as
    :class:`RoleFloor`, at most ``limit``); a bad entry or file is dropped and counted in the data dir's
    :class:`p2pnode.statefiles.StateFileReport`, never stops the agent (missing: ``{}``)."""
    report = report_for(data_dir)
    doc = read_json_file(data_dir / ROLE_FLOORS_FILE, file=ROLE_FLOORS_FILE, report=report)
    if doc is None:
        return {}
    entries = decode_entries(doc, RoleFloor, file=ROLE_FLOORS_FILE, report=report, limit=limit)
    return {e.node: e.issued_at for e in entries}


def save_role_floors(data_dir: Path, floors: dict[str, int]) -> None:
    """Write the floors (:meth:`p2pnode.certs.RoleGate.floors`) atomically."""
    doc = [{"node": n, "issued_at": v} for n, v in floors.items()]
    atomic_write_bytes(data_dir / ROLE_FLOORS_FILE, json.dumps(doc, separators=(",", ":")).encode())


def load_vote(path: Path) -> Vote | None:
    """The persisted vote (``{"candidate": node id, "term": int}``, decoded as :class:`p2pnode.snapshot.VoteWire`),
    or None: missing, or unusable (dropped with one logged line, counted in the data dir's
    :class:`p2pnode.statefiles.StateFileReport`). A voter that lost its vote starts over with a term above every
    term it hears, which keeps one vote per term unless the file was lost after voting."""
    report = report_for(path.parent)
    doc = read_json_file(path, file=path.name, report=report)
    if doc is None:
        return None
    try:
        v = decode_entry(doc, VoteWire)
    except ValueError as exc:
        report.drop(path.name, "malformed", f"not a vote ({exc}): ignored")
        return None
    return Vote(v.candidate, v.term)


def load_roll(path: Path, *, trusted: bool, bootstrap_s: float) -> VoterRoll | None:
    """The persisted voter roll (``voters.json``, the fields of :class:`p2pnode.snapshot.RollSection`), or None:
    missing, or unusable. Never raises: an unusable roll (not JSON, not an object, a voter entry that is not a node
    id) is reported once (counted in the data dir's :class:`p2pnode.statefiles.StateFileReport`) and the node
    adopts the roll its operator-given peers publish, as a node starting for the first time does
    (:class:`p2pnode.node.NodeCore`): dropping one voter could make a minority count as a majority. A bad
    ``removed`` or ``marks`` entry is dropped alone (it only bars automatic admission, or is merged again from the
    voters); a bad ``created_at`` or ``closed`` reads
    as a closed roll (nobody is admitted without the operator)."""
    name = path.name
    report = report_for(path.parent)
    doc = read_json_file(path, file=name, report=report)
    if doc is None:
        return None
    if not isinstance(doc, dict):
        report.drop(name, "malformed", f"not an object but {type(doc).__name__}: ignored, the roll is adopted from "
                    "the peers given")
        return None
    raw_voters = doc.get("voters", [])
    voters: set[str] = set()
    bad = 0
    if isinstance(raw_voters, list):
        for i, x in enumerate(raw_voters):
            try:
                voters.add(decode_entry(x, NodeId))
            except ValueError as exc:
                bad += 1
                report.drop(name, "bad_entry", f"voters[{i}]: {exc}")
    if bad or not isinstance(raw_voters, list):
        report.drop(name, "malformed", "the voters list is unusable: ignored, the roll is adopted from the peers "
                    "given")
        return None
    removed = set(decode_entries(doc.get("removed", []), NodeId, file=name, report=report, limit=ROLL_MAX))
    marks = decode_entries(doc.get("marks", []), EligibilityMark, file=name, report=report, limit=MARKS_MAX)
    closed = False
    try:
        created_at = decode_entry(doc.get("created_at"), WallSeconds | None)
    except ValueError as exc:
        report.drop(name, "bad_field", f"created_at: {exc}: the roll is taken as closed")
        created_at, closed = None, True
    try:
        closed = decode_entry(doc.get("closed", False), bool) or closed
    except ValueError as exc:
        report.drop(name, "bad_field", f"closed: {exc}: the roll is taken as closed")
        closed = True
    if not voters and not (trusted and marks):
        return None  # no voter was ever admitted here: as a first start (open mode adopts the marks with the roll)
    return VoterRoll(trusted=trusted, bootstrap_s=bootstrap_s, created_at=created_at, voters=voters,
                     removed=removed - voters, closed=closed, marks=marks)


def load_keyring(path: Path, bootstrap_token: str) -> Keyring:
    """The keyring of token mode: the file in the data dir, or (first start) one holding the configured token,
    written there. Raises :class:`KeyringError` when the file is unreadable or holds no usable token: the
    configured token is never used then (the operator may have rotated it away), the operator must fix the file."""
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
        raise KeyringError(f"{path}: the keyring holds no usable token (a bad entry is dropped and logged; "
                           "p2pnode keys install TOKEN)")
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


class OwnCert:
    """This node's own role certificate, the file ``role.cert`` in the data dir (:data:`p2pnode.certs.CERT_FILE`,
    written by ``p2pnode node certify --install`` or copied in by the operator), read back through its typed
    decoder (:func:`p2pnode.certs.decode_cert`). :meth:`poll` reads it again when its size, mtime or inode
    changed (the agent calls it on its sampler tick), so a renewed certificate counts without a restart. A file
    that does not decode, or names another node, is dropped (counted in the data dir's
    :class:`p2pnode.statefiles.StateFileReport`, the certificate held before is kept out) and never stops the
    agent: the node then carries no certificate, and its roles count only where no operator key is pinned."""

    def __init__(self, data_dir: Path, node_id: str) -> None:
        from ..certs import CERT_FILE

        self.path = data_dir / CERT_FILE
        self.node_id = node_id
        self.cert: RoleCert | None = None
        self.loads = 0
        self.error = ""
        """Why the file was dropped at its last read ("" when it loaded or is missing)."""
        self._stamp: tuple[int, int, int] | None = None
        self.poll()

    def poll(self) -> bool:
        """Read the file again if it changed since the last read. Returns True when :attr:`cert` changed."""
        from ..certs import MAX_CERT_BYTES, decode_cert

        try:
            st = self.path.stat()
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        before = self.cert
        self.cert, self.error = None, ""
        if stamp is not None:
            try:
                with self.path.open("rb") as f:
                    raw = f.read(MAX_CERT_BYTES + 1)
                cert = decode_cert(raw)
                if cert.node != self.node_id:
                    raise ValueError(f"a certificate of node {cert.node}, not of this node")
                self.cert = cert
                self.loads += 1
                log.info("role certificate %s: roles %s until %d", self.path.name, ",".join(cert.roles) or "-",
                         cert.expires_at)
            except (OSError, ValueError) as exc:
                self.error = str(exc)[:200]
                report_for(self.path.parent).drop(self.path.name, "malformed", f"{self.error} ({stamp[0]})")
        return self.cert != before
