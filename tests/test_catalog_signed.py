"""The signed-catalog core (issue 25): what is signed, which document a node adopts, and every refusal by name."""

import pytest

from p2pnode.identity import SigningKey
from p2pnode.scheduler import (
    CatalogBook,
    CatalogRefused,
    SignedCatalog,
    decode_signed,
    decode_signer,
    encode_signed,
    public_key_text,
    sign_catalog,
)

TOML = '[[job]]\nname = "w"\nkind = "selfplay"\nconfig = "c"\nargv = ["true"]\n'
KEY = SigningKey.generate()


def refusal(book, doc, **kw):
    with pytest.raises(CatalogRefused) as info:
        book.check(doc, **kw)
    return info.value.reason


def test_a_pinned_key_signs_exactly_one_text_at_one_version():
    book = CatalogBook((public_key_text(KEY),), base_dir="/srv/jobs")
    doc = sign_catalog(KEY, 7, TOML)
    catalog = book.check(decode_signed(encode_signed(doc)))
    assert list(catalog.templates) == ["w"] and catalog.base_dir == "/srv/jobs"
    book.adopt(doc)
    assert book.version == 7 and book.adopted == 1
    assert refusal(book, doc) == "older" and book.check(doc, restore=True)  # read back at start: the same version
    assert refusal(book, sign_catalog(KEY, 6, TOML)) == "older"
    assert refusal(book, SignedCatalog(8, doc.signer, TOML, doc.sig)) == "bad_signature"  # another version
    assert refusal(book, SignedCatalog(8, doc.signer, TOML + " ", sign_catalog(KEY, 8, TOML).sig)) == "bad_signature"
    assert refusal(book, sign_catalog(SigningKey.generate(), 9, TOML)) == "unknown_signer"
    assert refusal(book, sign_catalog(KEY, 9, "[[job]]\nname = 3\n")) == "invalid_catalog"
    assert refusal(book, sign_catalog(KEY, 9, "not toml [")) == "invalid_catalog"
    assert book.check(sign_catalog(KEY, 9, TOML)) and book.version == 7  # checked, not adopted
    assert book.refused == {"not_accepted": 0, "malformed": 0, "unknown_signer": 1, "bad_signature": 2,
                            "older": 2, "invalid_catalog": 2, "version_mismatch": 0, "below_floor": 0}


def test_a_node_that_pins_no_key_takes_none():
    book = CatalogBook((), base_dir=".")
    assert not book.accepts and refusal(book, sign_catalog(KEY, 1, TOML)) == "not_accepted"


@pytest.mark.parametrize("body", [
    b"", b"[]", b"null", b'{"version": 1}', b'\xed\xa0\x80',
    b'{"version": "1", "signer": "x", "toml": "", "sig": ""}',
    b'{"version": 0, "signer": "ed25519:' + b"A" * 43 + b'=", "toml": "", "sig": "' + b"A" * 86 + b'=="}',
    b'{"version": 9007199254740993, "signer": "ed25519:' + b"A" * 43 + b'=", "toml": "", "sig": "'
    + b"A" * 86 + b'=="}',
    b'{"version": 1e3, "signer": "ed25519:' + b"A" * 43 + b'=", "toml": "", "sig": "' + b"A" * 86 + b'=="}',
    b'{"version": NaN}', b'{"version": 1' + b"0" * 400 + b"}",
    b'{"version": 1, "signer": "ed25519:\xd9\xa3' + b"A" * 41 + b'=", "toml": "", "sig": "' + b"A" * 86 + b'=="}',
    b'{"version": 1, "signer": "ed25519:' + b"A" * 43 + b'=", "toml": "", "sig": "QUJD"}',
    b'{"version": 1, "signer": "ed25519:' + b"A" * 43 + b'=", "toml": "", "sig": "' + b"A" * 86 + b'==", "x": 1}',
    b'{"version": 1, "signer": "ed25519:' + b"A" * 43 + b'=", "toml": "' + b"a" * 300_000 + b'", "sig": ""}',
    b"{" * 100_000, b" " * 600_000,
])
def test_hostile_documents_are_malformed_never_a_crash(body):
    with pytest.raises(CatalogRefused) as info:
        decode_signed(body)
    assert info.value.reason == "malformed"


@pytest.mark.parametrize("text", ["", "ed25519:", "ed25519:" + "A" * 44, "ed25519:" + "A" * 43 + "=\n",
                                  "rsa:" + "A" * 43 + "=", "ed25519:" + "٣" * 43 + "=", 12])
def test_a_signer_that_is_not_an_ed25519_key_is_refused_by_name(text):
    with pytest.raises(ValueError, match="catalog signer"):
        decode_signer(text)
