"""Ed25519 signatures and X25519 key agreement through libsodium (PyNaCl's): the one module of p2pnode that calls a
signature library. Pure (no clock, no socket; :meth:`SigningKey.generate` reads the OS's random source).

* :func:`verify_signature` is the one verification primitive (re-exported as
  :func:`p2pnode.identity.verify_signature`): every envelope, request, certificate, catalog and publication check
  calls it. RFC 8032 Ed25519 as libsodium checks it: besides a wrong signature, a non-canonical ``S``, a
  small-order or non-canonical public key, and a small-order ``R`` are refused (OpenSSL accepts some of those; no
  key or signature p2pnode makes has them, since honest signers never produce them).
* :class:`SigningKey` is a private key: the 32-byte seed (what ``<data_dir>/node.key`` holds, raw), its public key,
  and :meth:`SigningKey.sign` (64 bytes, deterministic: the same seed and message give the same signature as any
  RFC 8032 implementation).
* Operator keys on disk are PEM PKCS#8 (RFC 8410), as ``p2pnode catalog keygen`` writes them and as
  ``openssl genpkey -algorithm ed25519`` does: :func:`pkcs8_pem` and :func:`load_pem_key` handle exactly that
  fixed 48-byte layout (and the 83-byte one of PKCS#8 v2 that also carries the public key, checked against the seed);
  anything else, an encrypted key included, is a ``ValueError`` naming the remedy.
* :func:`x25519` is RFC 7748's scalar multiplication (the scalar clamped, as every X25519 does).

Why libsodium and not ``cryptography`` (which p2pnode used before): an idle agent's RSS (issue 43). Importing
cryptography's Ed25519 maps its 7 MiB Rust extension with a static OpenSSL (about 7.8 MiB of RSS); PyNaCl's libsodium
adds about 0.6 MiB beside trio and httpx, and verifies a 1 KB message in about half the time (55 against 110 µs here).
This module calls PyNaCl's compiled cffi module ``nacl._sodium`` (the libsodium functions ``nacl.bindings`` wraps,
with the same arguments) rather than ``nacl.bindings``, whose import loads every binding module for another 0.5 MiB;
PyNaCl is pinned to a minor series, and ``tests/test_ed25519.py`` checks every function here against
``nacl.bindings`` and against ``cryptography``. Lengths are checked here: libsodium reads exactly as many bytes as a
key, seed or signature has, whatever it is handed.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

import nacl._sodium as _sodium  # type: ignore[import-not-found]  # a cffi module: no type information

_ffi, _lib = _sodium.ffi, _sodium.lib
if _lib.sodium_init() < 0:  # 0: initialized now, 1: before (by nacl.bindings, say)
    raise ImportError("libsodium did not initialize")

__all__ = ["PUBLIC_KEY_BYTES", "SEED_BYTES", "SIGNATURE_BYTES", "SigningKey", "load_pem_key", "pkcs8_pem",
           "seed_from_pem", "verify_signature", "x25519"]

SEED_BYTES = 32
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
X25519_BYTES = 32

# RFC 8410 section 7: OneAsymmetricKey v1 (PKCS#8) of an Ed25519 key: SEQUENCE { INTEGER 0, SEQUENCE { OID
# 1.3.101.112 }, OCTET STRING { OCTET STRING (32 bytes) } }; v2 adds [1] the public key as a BIT STRING.
_PKCS8_V1 = bytes.fromhex("302e020100300506032b657004220420")
_PKCS8_V2 = bytes.fromhex("3051020101300506032b657004220420")
_PKCS8_V2_PUB = bytes.fromhex("812100")
_PEM_BEGIN = b"-----BEGIN PRIVATE KEY-----"
_PEM_END = b"-----END PRIVATE KEY-----"


def verify_signature(public_key: bytes, signature: bytes, data: bytes) -> bool:
    """True when ``signature`` (64 bytes) is a valid Ed25519 signature of ``data`` by ``public_key`` (32 raw bytes);
    each may be any bytes-like object, its length counted in bytes. Never raises for bad input: a key or signature
    of another length, one libsodium refuses (module docstring), or anything not bytes-like (``None``, a str, an
    int, a list) is simply not valid."""
    try:  # memoryview: only the buffer protocol (bytes(5) would be five zero bytes), the length in bytes
        key, sig, msg = memoryview(public_key).tobytes(), memoryview(signature).tobytes(), memoryview(data)
    except TypeError:
        return False
    if len(key) != PUBLIC_KEY_BYTES or len(sig) != SIGNATURE_BYTES:
        return False
    signed = sig + (msg if msg.c_contiguous else msg.tobytes())  # one copy of the message, as before
    out = _ffi.new("unsigned char[]", len(signed))
    return bool(_lib.crypto_sign_open(out, _ffi.NULL, signed, len(signed), key) == 0)


def x25519(scalar: bytes, u: bytes) -> bytes | None:
    """RFC 7748 X25519 of the 32-byte ``scalar`` (clamped) and the 32-byte Montgomery ``u`` coordinate; ``None`` when
    the result is all zero (a low-order ``u``). Raises ``ValueError`` for inputs of another length."""
    if len(scalar) != X25519_BYTES or len(u) != X25519_BYTES:
        raise ValueError("x25519 takes a 32-byte scalar and a 32-byte u coordinate")
    out = _ffi.new("unsigned char[]", X25519_BYTES)
    if _lib.crypto_scalarmult(out, bytes(scalar), bytes(u)) != 0:  # -1: the identity (all-zero output)
        return None
    return bytes(_ffi.buffer(out, X25519_BYTES))


class SigningKey:
    """An Ed25519 private key. ``seed``: its 32 bytes (keep them secret); ``public_key``: the 32 raw bytes of its
    public half. Raises ``ValueError`` for a seed that is not 32 bytes."""

    __slots__ = ("_secret", "public_key", "seed")

    def __init__(self, seed: bytes) -> None:
        if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
            raise ValueError(f"an Ed25519 seed is {SEED_BYTES} bytes")
        self.seed = seed
        pk, sk = _ffi.new("unsigned char[]", PUBLIC_KEY_BYTES), _ffi.new("unsigned char[]", 64)
        if _lib.crypto_sign_seed_keypair(pk, sk, seed) != 0:
            raise ValueError("libsodium refused the seed")
        self.public_key: bytes = bytes(_ffi.buffer(pk, PUBLIC_KEY_BYTES))
        self._secret: bytes = bytes(_ffi.buffer(sk, 64))

    @classmethod
    def generate(cls) -> SigningKey:
        """A new key from the OS's random source."""
        return cls(os.urandom(SEED_BYTES))

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data`` (any bytes-like object; anything else, an int included, raises
        ``TypeError``)."""
        msg = memoryview(data).tobytes()  # not bytes(data): bytes(5) is five zero bytes
        out = _ffi.new("unsigned char[]", len(msg) + SIGNATURE_BYTES)
        if _lib.crypto_sign(out, _ffi.NULL, msg, len(msg), self._secret) != 0:
            raise RuntimeError("libsodium failed to sign")
        return bytes(_ffi.buffer(out, SIGNATURE_BYTES))

    def __repr__(self) -> str:
        return f"SigningKey(public_key={self.public_key.hex()})"


def pkcs8_pem(key: SigningKey) -> bytes:
    """The PEM PKCS#8 form of ``key`` (RFC 8410; the bytes ``cryptography`` and OpenSSL write, unencrypted)."""
    der = base64.b64encode(_PKCS8_V1 + key.seed)
    return _PEM_BEGIN + b"\n" + der + b"\n" + _PEM_END + b"\n"


def seed_from_pem(pem: bytes) -> bytes:
    """The 32-byte seed of a PEM PKCS#8 Ed25519 private key (v1, or v2 with its public key, which must match): the
    first ``PRIVATE KEY`` block of ``pem``, text outside it ignored (as OpenSSL reads it). Raises ``ValueError``
    naming what is wrong (another key type, an encrypted key, a damaged file)."""
    remedy = "expected an unencrypted PEM PKCS#8 Ed25519 key (p2pnode catalog keygen)"
    start = pem.find(_PEM_BEGIN)  # the first such block; text around it is ignored (RFC 7468), as OpenSSL does
    end = pem.find(_PEM_END, start + len(_PEM_BEGIN)) if start >= 0 else -1
    if end < 0:
        kind = "an encrypted key" if b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in pem else "not a PEM private key"
        raise ValueError(f"{kind}: {remedy}")
    try:
        der = base64.b64decode(b"".join(pem[start + len(_PEM_BEGIN):end].split()), validate=True)
    except binascii.Error:
        raise ValueError(f"damaged base64: {remedy}") from None
    if len(der) == 48 and der.startswith(_PKCS8_V1):
        return der[16:]
    if len(der) == 83 and der.startswith(_PKCS8_V2) and der[48:51] == _PKCS8_V2_PUB:
        seed = der[16:48]
        if SigningKey(seed).public_key != der[51:]:
            raise ValueError(f"the public key does not belong to the private key: {remedy}")
        return seed
    raise ValueError(f"not an Ed25519 key: {remedy}")


def load_pem_key(path: Path) -> SigningKey:
    """The operator key in the PEM file at ``path``. Raises ``ValueError`` (:func:`seed_from_pem`, the message starts
    with the path) or ``OSError``."""
    try:
        return SigningKey(seed_from_pem(Path(path).read_bytes()))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
