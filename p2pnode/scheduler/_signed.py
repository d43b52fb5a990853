"""Catalogs pushed to the fleet once, signed by an operator key: the document, its signature, and which one a node
adopts. Pure (msgspec and :mod:`p2pnode._ed25519`).

A catalog names the commands nodes run, so pushing one is remote execution by design, as a Nomad job submission
is. It is therefore off by default: a node accepts a pushed catalog only when its own config pins the operator
keys it trusts (``catalog.signers``, ``ed25519:<base64 of the 32-byte public key>``). The operator signs with
such a key (``p2pnode catalog keygen``, ``p2pnode catalog push FILE``); agents adopt the newest signed catalog by
``version``, persist it and reload without a restart, and members that opted in fetch it from a member that
advertises a newer version (``jobs.catalog_version`` in the signed snapshot). Refused, and counted by reason
(:data:`REFUSALS`): a node that did not opt in (``not_accepted``), a document that does not decode
(``malformed``), an unpinned signer (``unknown_signer``), a signature that does not verify (``bad_signature``), a
version not above the one held (``older``), a catalog that does not validate or whose fenced template does not
fit the node's lease (``invalid_catalog``, :func:`p2pnode.scheduler._leaselead.lead_problem`); for a fetched
one also a version other than the one the serving member advertised (``version_mismatch``) and a version below the
node's floor, the highest version it ever adopted, persisted beside the catalog (``below_floor``: a node never
goes back, even from a stale persisted copy). Which member a node fetches from is
:mod:`p2pnode.scheduler._catalog_sources`.

What is signed (:func:`signing_bytes`): a domain string, the version (8 bytes, big-endian) and the BLAKE2b-256
digest of the catalog's TOML text, so a signature is valid for exactly that text at exactly that version.
The scripts a catalog points to are not in it: they are deployed separately (an image, the on-start script).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import Annotated

import msgspec
from msgspec import Meta

from ..errors import PeerError
from ..identity import SigningKey, verify_signature
from ._catalog import Catalog, CatalogError, catalog_from_text

__all__ = ["CatalogBook", "CatalogFloor", "CatalogRefused", "MAX_CATALOG_BYTES", "REFUSALS", "SignedCatalog",
           "decode_signed", "decode_signer", "encode_signed", "public_key_text", "sign_catalog", "signing_bytes"]

MAX_CATALOG_BYTES = 256 * 1024
"""Characters of a pushed catalog's TOML at most (a catalog of a few hundred templates is a few tens of KiB)."""
MAX_SIGNED_BYTES = 2 * MAX_CATALOG_BYTES
"""Bytes of an encoded signed catalog at most (JSON escapes included), read from a request or a peer."""
DOMAIN = b"p2pnode catalog v1\x00"
REFUSALS = ("not_accepted", "malformed", "unknown_signer", "bad_signature", "older", "invalid_catalog",
            "version_mismatch", "below_floor")
_SIGNER = r"^ed25519:[A-Za-z0-9+/]{43}=$"
_SIGNER_RE = re.compile(_SIGNER.replace("$", r"\Z"))


class SignedCatalog(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A catalog as pushed: ``version`` (1 to 2^53, chosen by the operator; the newest wins), ``signer`` (the
    public key, ``ed25519:<base64>``), ``toml`` (the catalog file's text) and ``sig`` (Ed25519 over
    :func:`signing_bytes`; base64 in JSON)."""

    version: Annotated[int, Meta(ge=1, le=2**53)]
    signer: Annotated[str, Meta(pattern=_SIGNER)]
    toml: Annotated[str, Meta(max_length=MAX_CATALOG_BYTES)]
    sig: Annotated[bytes, Meta(min_length=64, max_length=64)]


class CatalogFloor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The persisted floor (``<data_dir>/catalog.floor.json``): the highest catalog ``version`` this node ever
    adopted (0 to 2^53). Read back with :func:`p2pnode.statefiles.decode_entry`."""

    version: Annotated[int, Meta(ge=0, le=2**53)] = 0


class CatalogRefused(PeerError):
    """A pushed catalog refused (a :class:`p2pnode.errors.PeerError`): ``reason`` is one of :data:`REFUSALS`,
    ``detail`` says what."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def signing_bytes(version: int, toml: str) -> bytes:
    """The bytes an operator key signs for catalog text ``toml`` at ``version`` (see the module docstring)."""
    return DOMAIN + version.to_bytes(8, "big") + hashlib.blake2b(toml.encode(), digest_size=32).digest()


def public_key_text(key: SigningKey | bytes) -> str:
    """``ed25519:<base64>`` of a key's public half (a private key, or the 32 raw bytes of a public one): what
    ``catalog.signers`` lists."""
    return "ed25519:" + base64.b64encode(key.public_key if isinstance(key, SigningKey) else key).decode()


def decode_signer(text: str) -> bytes:
    """The public key (32 raw bytes) of a ``catalog.signers`` entry. Raises ``ValueError`` naming what is wrong."""
    if not isinstance(text, str) or not _SIGNER_RE.match(text):
        raise ValueError(f"catalog signer {str(text)[:60]!r}: expected ed25519:<base64 of 32 bytes>")
    try:
        return base64.b64decode(text[8:], validate=True)  # 32 bytes: the pattern allows no other length
    except binascii.Error:
        raise ValueError(f"catalog signer {text[:60]!r}: expected ed25519:<base64 of 32 bytes>") from None


def sign_catalog(key: SigningKey, version: int, toml: str) -> SignedCatalog:
    """``toml`` at ``version`` signed with the operator's ``key``."""
    return SignedCatalog(version, public_key_text(key), toml, key.sign(signing_bytes(version, toml)))


def encode_signed(doc: SignedCatalog) -> bytes:
    """The JSON form of a signed catalog (``POST /catalog``, ``GET /catalog/signed``, the persisted copy)."""
    return msgspec.json.encode(doc)


_DECODER = msgspec.json.Decoder(SignedCatalog)


def decode_signed(body: bytes) -> SignedCatalog:
    """A signed catalog from its JSON form, bounded (:data:`MAX_SIGNED_BYTES`). Raises :class:`CatalogRefused`
    (``malformed``) naming the field."""
    if len(body) > MAX_SIGNED_BYTES:
        raise CatalogRefused("malformed", f"{len(body)} bytes, more than {MAX_SIGNED_BYTES}")
    try:
        return _DECODER.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # invalid UTF-8 is not a DecodeError
        raise CatalogRefused("malformed", str(exc)[:200]) from None


class CatalogBook:
    """Which signed catalog this node holds, and whether another replaces it. ``signers``: the pinned operator
    keys (empty: this node does not accept pushed catalogs); ``base_dir``: the directory ``{catalog_dir}`` means
    for a pushed catalog (where its scripts were deployed); ``held``: the signed catalog adopted before (its
    persisted copy), if any; ``floor``: the highest version ever adopted (never adopted below; the driver
    persists it). Counters: :attr:`refused` by reason, :attr:`adopted`."""

    def __init__(self, signers: tuple[str, ...], *, base_dir: str, lease: tuple[float, float] = (0.0, 0.0)) -> None:
        self.signers = {s: decode_signer(s) for s in signers}
        self.lease = lease
        """``(lease_s, stop_grace_s)`` of the node's lease (:meth:`p2pnode.config.Config.lease_terms`): a catalog
        with a fenced template that does not fit it is ``invalid_catalog``."""
        self.base_dir = base_dir
        self.held: SignedCatalog | None = None
        self.floor = 0
        self.refused: dict[str, int] = dict.fromkeys(REFUSALS, 0)
        self.adopted = 0
        self.last_refusal = ""

    @property
    def accepts(self) -> bool:
        """Whether this node takes pushed catalogs at all (it pinned at least one signer)."""
        return bool(self.signers)

    @property
    def version(self) -> int:
        """The version of the signed catalog held; 0 for the node's own catalog file."""
        return self.held.version if self.held is not None else 0

    def check(self, doc: SignedCatalog, *, restore: bool = False, advertised: int | None = None) -> Catalog:
        """The catalog of ``doc`` if this node should adopt it: opted in, a pinned signer, a valid signature, the
        version ``advertised`` for it by the member that served it (when fetched), a version at least the
        :attr:`floor` and above the one held (equal too when ``restore``: the persisted copy read back at start),
        a catalog that validates. Raises :class:`CatalogRefused`, counted by reason. Does not adopt: see
        :meth:`adopt`."""
        try:
            if not self.accepts:
                raise CatalogRefused("not_accepted", "this node pins no catalog signer (catalog.signers)")
            key = self.signers.get(doc.signer)
            if key is None:
                raise CatalogRefused("unknown_signer", f"{doc.signer} is not in catalog.signers")
            if not verify_signature(key, doc.sig, signing_bytes(doc.version, doc.toml)):
                raise CatalogRefused("bad_signature", f"version {doc.version} signed by {doc.signer}")
            if advertised is not None and doc.version != advertised:
                raise CatalogRefused("version_mismatch", f"served version {doc.version}, advertised {advertised}")
            if doc.version < self.version or (doc.version == self.version and not restore):
                raise CatalogRefused("older", f"version {doc.version}, this node holds {self.version}")
            if doc.version < self.floor:
                raise CatalogRefused("below_floor", f"version {doc.version}, this node adopted {self.floor} before")
            try:
                cat = catalog_from_text(doc.toml, source=f"pushed catalog v{doc.version}", base_dir=self.base_dir)
            except CatalogError as exc:
                raise CatalogRefused("invalid_catalog", "; ".join(exc.errors)[:300]) from None
            from ._leaselead import catalog_lease_problems

            if problems := catalog_lease_problems(cat.templates.values(), *self.lease):
                raise CatalogRefused("invalid_catalog", "; ".join(problems)[:300])
            return cat
        except CatalogRefused as exc:
            self.count(exc)
            raise

    def count(self, exc: CatalogRefused) -> None:
        """Count a refusal made before :meth:`check` (a document that did not decode)."""
        self.refused[exc.reason] += 1
        self.last_refusal = str(exc)[:300]

    def adopt(self, doc: SignedCatalog) -> None:
        """``doc`` (checked by :meth:`check`) is the catalog now held; the floor rises to its version."""
        self.held = doc
        self.floor = max(self.floor, doc.version)
        self.adopted += 1
