"""p2pnode._ed25519 (libsodium through PyNaCl) against the library p2pnode used before it (``cryptography``, OpenSSL):
the same keys, signatures, PEM files and X25519 results, so nodes, key files and operator keys made before the switch
keep working, and what libsodium refuses that OpenSSL accepted."""

import base64
import os
import random

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from p2pnode._ed25519 import SigningKey, load_pem_key, pkcs8_pem, seed_from_pem, verify_signature, x25519
from p2pnode.gossip._probewire import ed25519_to_x25519_public
from p2pnode.identity import KEY_FILE, load_or_create_identity, node_id_for

MESSAGES = [b"", b"x", b"p2pnode" * 150, os.urandom(1 << 20)]


def _old(seed: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(seed)


def test_keys_and_signatures_are_the_old_librarys_byte_for_byte():
    """Ed25519 is deterministic: the same seed gives the same public key and, per message, the same signature."""
    rng = random.Random(43)
    for _ in range(20):
        seed = rng.randbytes(32)
        old, new = _old(seed), SigningKey(seed)
        assert new.public_key == old.public_key().public_bytes_raw()
        for m in MESSAGES:
            assert new.sign(m) == old.sign(m)


def test_every_function_is_what_pynacls_public_bindings_give():
    """p2pnode._ed25519 calls ``nacl._sodium`` directly (module docstring): the same results as ``nacl.bindings``."""
    from nacl import bindings

    rng = random.Random(7)
    for _ in range(10):
        seed, m = rng.randbytes(32), rng.randbytes(rng.randrange(0, 3000))
        pk, sk = bindings.crypto_sign_seed_keypair(seed)
        key = SigningKey(seed)
        assert key.public_key == pk and key.sign(m) == bindings.crypto_sign(m, sk)[:64]
        assert verify_signature(pk, bindings.crypto_sign(m, sk)[:64], m)
        scalar, u = rng.randbytes(32), bindings.crypto_scalarmult_base(rng.randbytes(32))
        assert x25519(scalar, u) == bindings.crypto_scalarmult(scalar, u)


def test_a_signature_made_by_the_old_library_verifies_and_a_changed_one_does_not():
    old = Ed25519PrivateKey.generate()
    pub = old.public_key().public_bytes_raw()
    for m in MESSAGES:
        sig = old.sign(m)
        assert verify_signature(pub, sig, m)
        assert verify_signature(pub, sig, memoryview(m))  # any bytes-like body
        assert not verify_signature(pub, sig, m + b"!")
        assert not verify_signature(pub, bytes([sig[0] ^ 1]) + sig[1:], m)
        assert not verify_signature(Ed25519PrivateKey.generate().public_key().public_bytes_raw(), sig, m)
    new = SigningKey.generate()
    Ed25519PublicKey.from_public_bytes(new.public_key).verify(new.sign(b"back"), b"back")  # and the other way


BAD = [(b"", b""), (b"\0" * 31, b"\0" * 64), (b"\0" * 32, b"\0" * 63), (b"\0" * 33, b"\0" * 64),
       (b"\0" * 32, b"\0" * 65), (b"\xff" * 32, b"\xff" * 64), (None, b"\0" * 64), ("x" * 32, b"\0" * 64)]


@pytest.mark.parametrize(("key", "sig"), BAD)
def test_malformed_keys_and_signatures_are_not_valid_and_never_raise(key, sig):
    assert verify_signature(key, sig, b"data") is False


def test_a_small_order_key_forges_nothing_here_though_openssl_accepts_it():
    """The identity point as a public key, R the identity and S = 0: ``[S]B = R + [k]A`` holds for every message
    under the cofactorless equation, so OpenSSL accepts this "signature" of anything; libsodium refuses small-order
    keys (and ``R``), so no one can sign for such a key here."""
    identity_point, forged = bytes([1]) + bytes(31), bytes([1]) + bytes(63)
    Ed25519PublicKey.from_public_bytes(identity_point).verify(forged, b"anything")  # OpenSSL: valid
    assert not verify_signature(identity_point, forged, b"anything")


def test_a_non_canonical_s_is_refused():
    """``S + L`` for a valid ``S`` (the same scalar, not reduced) is a malleated signature: refused."""
    key = SigningKey.generate()
    sig = key.sign(b"m")
    s = int.from_bytes(sig[32:], "little") + 2**252 + 27742317777372353535851937790883648493  # < 2**254
    assert not verify_signature(key.public_key, sig[:32] + s.to_bytes(32, "little"), b"m")


def test_a_node_key_file_written_before_loads_as_the_same_node(tmp_path):
    old = Ed25519PrivateKey.generate()
    (tmp_path / KEY_FILE).write_bytes(old.private_bytes_raw())
    (tmp_path / KEY_FILE).chmod(0o600)
    ident = load_or_create_identity(tmp_path)
    assert ident.public_key == old.public_key().public_bytes_raw()
    assert ident.node_id == node_id_for(old.public_key().public_bytes_raw())
    assert ident.sign(b"snapshot") == old.sign(b"snapshot")


def test_pem_keys_are_the_old_librarys_both_ways(tmp_path):
    old = Ed25519PrivateKey.generate()
    old_pem = old.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    new = SigningKey(old.private_bytes_raw())
    assert pkcs8_pem(new) == old_pem  # what `p2pnode catalog keygen` writes is unchanged
    assert seed_from_pem(old_pem) == new.seed
    assert seed_from_pem(old_pem.replace(b"\n", b"\r\n") + b"\n\n") == new.seed
    path = tmp_path / "op.key"
    path.write_bytes(old_pem)
    assert load_pem_key(path).public_key == new.public_key
    back = serialization.load_pem_private_key(pkcs8_pem(new), password=None)
    assert isinstance(back, Ed25519PrivateKey) and back.private_bytes_raw() == new.seed


def test_a_pkcs8_v2_key_with_its_public_key_is_read_and_checked():
    key = SigningKey.generate()
    der = (bytes.fromhex("3051020101300506032b657004220420") + key.seed + bytes.fromhex("812100")
           + key.public_key)
    pem = b"-----BEGIN PRIVATE KEY-----\n" + base64.encodebytes(der) + b"-----END PRIVATE KEY-----\n"
    assert seed_from_pem(pem) == key.seed
    wrong = der[:-32] + SigningKey.generate().public_key
    with pytest.raises(ValueError, match="does not belong"):
        seed_from_pem(b"-----BEGIN PRIVATE KEY-----\n" + base64.encodebytes(wrong) + b"-----END PRIVATE KEY-----\n")


def test_other_keys_and_damaged_files_are_refused_with_the_remedy(tmp_path):
    enc = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.BestAvailableEncryption(b"pw"))
    ecpem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    good = pkcs8_pem(SigningKey.generate())
    for pem, what in [(enc, "an encrypted key"), (ecpem, "not an Ed25519 key"), (b"hello", "not a PEM private key"),
                      (good.replace(b"MC4", b"M!4"), "damaged base64"), (good[:40] + good[-26:], "not an Ed25519")]:
        with pytest.raises(ValueError, match=what) as exc:
            seed_from_pem(pem)
        assert "p2pnode catalog keygen" in str(exc.value)
    path = tmp_path / "k.pem"
    path.write_bytes(ecpem)
    with pytest.raises(ValueError, match=str(path)):
        load_pem_key(path)


def test_a_seed_of_another_length_is_refused():
    for seed in (b"", b"\0" * 31, b"\0" * 33, "x" * 32):
        with pytest.raises(ValueError):
            SigningKey(seed)  # type: ignore[arg-type]


def test_x25519_is_the_old_librarys_and_the_probe_pair_key_agrees_both_ways():
    """The probe wire's pair key: each side's Ed25519 key converted (scalar: SHA-512 of the seed; public: the
    birational map), then X25519. The result is the old library's, and both sides reach the same secret."""
    import hashlib

    a, b = SigningKey.generate(), SigningKey.generate()
    sa, sb = (hashlib.sha512(k.seed).digest()[:32] for k in (a, b))
    ua, ub = ed25519_to_x25519_public(a.public_key), ed25519_to_x25519_public(b.public_key)
    assert ua is not None and ub is not None
    shared = x25519(sa, ub)
    assert shared == x25519(sb, ua)
    assert shared == X25519PrivateKey.from_private_bytes(sa).exchange(X25519PublicKey.from_public_bytes(ub))
    assert x25519(sa, bytes(32)) is None  # a low-order u: all-zero result
    with pytest.raises(ValueError):
        x25519(sa, b"short")


def test_non_bytes_inputs_are_not_valid_and_never_raise():
    """``verify_signature`` takes bytes-like objects only, measured in bytes: an int is no message (``bytes(5)``
    would be five zero bytes, ``bytes(-1)`` a ValueError), a list of ints no key, and a 64-item buffer of 2-byte
    items is a 128-byte signature, not a 64-byte one followed by part of the message."""
    import array

    key = SigningKey.generate()
    assert not verify_signature(key.public_key, key.sign(bytes(5)), 5)  # type: ignore[arg-type]
    for data in (-1, 1.5, 10**12):
        assert verify_signature(key.public_key, key.sign(b""), data) is False  # type: ignore[arg-type]
    sig = key.sign(b"")
    assert not verify_signature(list(key.public_key), sig, b"")  # type: ignore[arg-type]
    assert not verify_signature(key.public_key, list(sig), b"")  # type: ignore[arg-type]
    inner = key.sign(sig)  # a signature of the message ``sig``: a 2-byte-item buffer of inner + sig has 64 items
    wide = array.array("H")
    wide.frombytes(inner + sig)
    assert len(wide) == 64 and not verify_signature(key.public_key, wide, b"")  # type: ignore[arg-type]
    assert verify_signature(memoryview(key.public_key), memoryview(sig), bytearray())  # bytes-like of bytes: valid


def test_text_around_the_pem_block_is_ignored_as_the_old_library_did(tmp_path):
    """RFC 7468: text outside the block is ignored, as ``cryptography`` (OpenSSL) did: a key printed with
    ``openssl pkey -text`` (the block, then a dump), a comment above it, a public key block first. The first
    ``PRIVATE KEY`` block is the key, as with OpenSSL."""
    old, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    pem = old.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub = old.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for text in (pem + b"ED25519 Private-Key:\npriv:\n    00:01\n", b"# operator key, 2026\n" + pem, pub + pem,
                 pem + pkcs8_pem(SigningKey(other.private_bytes_raw()))):
        assert serialization.load_pem_private_key(text, password=None).private_bytes_raw() == old.private_bytes_raw()
        assert seed_from_pem(text) == old.private_bytes_raw()
    with pytest.raises(ValueError, match="an encrypted key"):
        seed_from_pem(b"# comment\n" + old.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.BestAvailableEncryption(b"pw")))


def test_keys_made_by_the_openssl_command_load(tmp_path):
    """``openssl genpkey -algorithm ed25519`` (the module docstring names it), as written and as ``openssl pkey
    -text`` prints it: the same public key as OpenSSL derives."""
    import shutil
    import subprocess

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command")
    key = tmp_path / "op.pem"
    subprocess.run([openssl, "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True, timeout=60)
    der = subprocess.run([openssl, "pkey", "-in", str(key), "-pubout", "-outform", "DER"], check=True,
                         capture_output=True, timeout=60).stdout
    assert load_pem_key(key).public_key == der[-32:]
    text = tmp_path / "op-text.pem"
    text.write_bytes(subprocess.run([openssl, "pkey", "-in", str(key), "-text"], check=True, capture_output=True,
                                    timeout=60).stdout)
    assert load_pem_key(text).public_key == der[-32:]


def test_a_strided_message_view_is_read_as_its_bytes():
    key, body = SigningKey.generate(), bytes(range(200))
    view = memoryview(body)[::2]
    assert verify_signature(key.public_key, key.sign(view.tobytes()), view)


def test_sign_takes_bytes_like_data_only():
    """An int is no message: ``bytes(5)`` would sign five zero bytes without a word (cryptography raised)."""
    key = SigningKey.generate()
    with pytest.raises(TypeError):
        key.sign(5)  # type: ignore[arg-type]
    assert key.sign(memoryview(b"abc")) == key.sign(b"abc") == key.sign(bytearray(b"abc"))
