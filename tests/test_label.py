"""A member's label (:mod:`p2pnode.label`): the bounds the snapshot's one decoder holds a peer's claim to, how a
node fits its own name and hostname into them, the provider's instance id from the environment, and the label in
``GET /members`` rows and ``p2pnode status``."""

import msgspec
import pytest

from p2pnode.errors import RejectedMessage
from p2pnode.identity import Identity
from p2pnode.label import NAME_MAX, Label, node_label, sanitize_name
from p2pnode.snapshot import SCHEMA_VERSION
from p2pnode.wire import open_envelope, seal_snapshot


def _snap(ident: Identity, label: dict) -> dict:
    return {"schema": SCHEMA_VERSION, "origin": ident.node_id, "version": 1, "addr": "", "tags": [],
            "leaving": False, "label": label}


@pytest.mark.parametrize("name", [
    "gpu-07", "<script>alert(1)</script>", "rack 3 · nœud", "東京-a100", "x" * NAME_MAX, "",
])
def test_the_decoder_accepts_printable_names_of_63_characters_at_most(name):
    ident = Identity.generate()
    snap = open_envelope(seal_snapshot(ident, _snap(ident, {"name": name, "provider": "vast.ai",
                                                            "instance": "C.123"})))
    assert snap.label == Label(name=name, provider="vast.ai", instance="C.123")


@pytest.mark.parametrize("name", [
    "x" * (NAME_MAX + 1),                 # one over
    "x" * 10_000,                         # 10 KB
    "bell\x07", "esc\x1b[31mred", "nul\x00", "del\x7f", "c1\x85",  # C0, DEL, C1 controls
    "line\nbreak",
    "evil\u202egnp.exe",                 # right-to-left override: reads as another name
    "a\u2066b\u2069", "zero\u200bwidth", "bom\ufeff", "rlm\u200f",
])
def test_the_decoder_refuses_a_snapshot_whose_name_breaks_the_bounds(name):
    """Refused whole, like any malformed snapshot (bad_type): the member is not half-learned with a dropped name."""
    ident = Identity.generate()
    for field in ("name", "provider", "instance"):
        with pytest.raises(RejectedMessage):
            open_envelope(seal_snapshot(ident, _snap(ident, {field: name})))


def test_a_snapshot_without_a_label_decodes_with_an_empty_one():
    ident = Identity.generate()
    snap = _snap(ident, {})
    del snap["label"]
    assert open_envelope(seal_snapshot(ident, snap)).label == Label()


def test_sanitize_name_drops_controls_and_formatting_and_cuts_to_63():
    assert sanitize_name("<script>alert(1)</script>\x07\x1b[31m") == "<script>alert(1)</script>[31m"
    assert sanitize_name("  a\tb\n\nc  ") == "a b c"
    assert sanitize_name("evil\u202egnp\u200b") == "evilgnp"
    long = sanitize_name("ab\x00" * 5000)
    assert len(long) == NAME_MAX and set(long) == {"a", "b"}
    assert sanitize_name("e\u0301") == "é"  # NFC: one character
    # Whatever it is given, the result passes the decoder's bounds.
    for raw in ("x" * 300, "\u202e" * 10 + "y", "\x85\x9f z"):
        msgspec.convert({"name": sanitize_name(raw)}, Label)


def test_node_label_takes_the_name_or_the_hostname_and_the_instance_from_the_environment():
    assert node_label("", "host\x07-01", {}) == Label(name="host-01")
    assert node_label("\x1b", "host\x07-01", {}) == Label(name="host-01")  # nothing left of --name: the hostname
    assert node_label("trainer a", "h", {"VAST_CONTAINERLABEL": "C.12345"}) == \
        Label(name="trainer a", provider="vast.ai", instance="C.12345")
    assert node_label("b", "h", {"RUNPOD_POD_ID": " abc\u202e123 "}) == Label(name="b", provider="runpod",
                                                                          instance="abc123")
    assert node_label("c", "h", {"VAST_CONTAINERLABEL": "", "RUNPOD_POD_ID": "p" * 500}).instance == "p" * NAME_MAX


def test_status_shows_the_label_as_text(tmp_path):
    from rich.console import Console

    from p2pnode.cli._status import _status_render

    member = {"id": "abc123", "name": "[bold]x[/] <script>", "provider": "runpod", "instance": "pod-9",
              "state": "alive", "received_at": 0, "resources": {}, "sync": {}}
    data = {"node": {"id": "abc123", "addr": "a", "version": 1}, "election": {}, "members": [member]}
    console = Console(width=200, record=True, file=open(tmp_path / "out.txt", "w"))  # noqa: SIM115
    console.print(_status_render(data, None))
    text = console.export_text()
    assert "[bold]x[/] <script> runpod pod-9" in text  # markup in a name is shown, not applied
    assert "abc123" in text
