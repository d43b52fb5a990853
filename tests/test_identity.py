import os
import stat

import pytest

from p2pnode.errors import IdentityError
from p2pnode.identity import (
    KEY_FILE,
    Identity,
    PersistentCounter,
    load_or_create_identity,
    node_id_for,
    verify_signature,
)


def test_key_created_with_mode_0600_and_reused(tmp_path):
    first = load_or_create_identity(tmp_path)
    path = tmp_path / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_or_create_identity(tmp_path)
    assert again.node_id == first.node_id
    assert again.public_key == first.public_key
    assert node_id_for(first.public_key) == first.node_id
    assert len(first.node_id) == 16


def test_other_dir_other_identity(tmp_path):
    a = load_or_create_identity(tmp_path / "a")
    b = load_or_create_identity(tmp_path / "b")
    assert a.node_id != b.node_id


def test_loose_permissions_are_tightened(tmp_path):
    load_or_create_identity(tmp_path)
    os.chmod(tmp_path / KEY_FILE, 0o644)
    load_or_create_identity(tmp_path)
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600


def test_corrupt_key_file_is_a_clear_error(tmp_path):
    (tmp_path / KEY_FILE).write_bytes(b"short")
    with pytest.raises(IdentityError, match="32-byte"):
        load_or_create_identity(tmp_path)


def test_signature_roundtrip_and_tamper():
    ident = Identity.generate()
    sig = ident.sign(b"hello")
    assert verify_signature(ident.public_key, sig, b"hello")
    assert not verify_signature(ident.public_key, sig, b"hellp")
    assert not verify_signature(Identity.generate().public_key, sig, b"hello")
    assert not verify_signature(b"\x00" * 5, sig, b"hello")
    # the key object is cached by its bytes: a second check of the same key, from a bytearray too, still decides
    assert verify_signature(bytearray(ident.public_key), sig, b"hello")
    assert not verify_signature(ident.public_key, sig, b"hello!")
    assert not verify_signature(None, sig, b"hello")  # type: ignore[arg-type]


def test_counter_increases_across_restarts_and_crashes(tmp_path):
    path = tmp_path / "v"
    c = PersistentCounter(path, block=5)
    seen = [c.next() for _ in range(12)]
    assert seen == sorted(set(seen))
    # A "crash": a new counter from the same file without any clean shutdown.
    c2 = PersistentCounter(path, block=5)
    assert c2.next() > max(seen)
    c3 = PersistentCounter(path, block=5)
    assert c3.next() > c2.value


def test_counter_advance_past(tmp_path):
    c = PersistentCounter(tmp_path / "v", block=3)
    c.advance_past(100)
    assert c.next() == 101
    c.advance_past(50)  # lower: no effect
    assert c.next() == 102
    assert PersistentCounter(tmp_path / "v", block=3).next() > 102
