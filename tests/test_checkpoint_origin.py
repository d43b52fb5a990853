"""The origin's side of checkpoints (issue 41; :mod:`p2pnode.sync._checkpoints`) on real files: a checkpoint
written by an atomic rename (or a directory with ``.complete``) is announced once sync has its manifests, signed
by the node and accepted by a member that trusts the plan's placement; a restart, or the config's next job on this
node, never announces an entry twice; the signed files are bounded."""

from __future__ import annotations

import os
from pathlib import Path

from p2pnode.identity import Identity
from p2pnode.sync._checkpoints import KEPT_PER_CONFIG, CheckpointJob, CheckpointOrigin
from p2pnode.sync._source import LocalFiles
from p2pnode.synccore import AssignmentBook, CheckpointTrust, decode_signed_checkpoint

DIR = "ck/hex8_2p"


class Node:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        (self.root / DIR).mkdir(parents=True)
        self.ident = Identity.generate()
        self.files = LocalFiles(self.root, globs=(), append_globs=(), state_dir=tmp / ".sync", settle_s=0.0)
        self.files.set_checkpoint_globs((("hex8_2p", f"{DIR}/**"),))
        self.origin = self.new_origin()

    def new_origin(self) -> CheckpointOrigin:
        return CheckpointOrigin(root=self.root, state_dir=self.tmp / ".sync", node_id=self.ident.node_id,
                                sign=self.ident.sign, settle_s=1.0)

    def write(self, name: str, data: bytes) -> None:
        tmp = self.root / DIR / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.root / DIR / name)

    def scan(self, job_id: str, now: float) -> list[bytes]:
        manifests = {p: f.manifest for p, f in self.files.scan(now=1e12).items()}
        return self.origin.scan([CheckpointJob(job_id, "hex8_2p", DIR)], manifests, now)


def _trust(node: Node, job_id: str) -> CheckpointTrust:
    book = AssignmentBook()
    book.record("hex8_2p", job_id, node.ident.node_id)
    return CheckpointTrust(book, {node.ident.node_id: node.ident.public_key}.get)


def test_a_renamed_checkpoint_is_signed_once_settled_and_accepted_by_a_member(tmp_path: Path) -> None:
    n = Node(tmp_path)
    n.write("step-10.pt", b"w" * 5000)
    assert n.scan("4-2", 0.0) == []  # seen, not settled
    assert n.origin.next_deadline() == 1.0
    (digest,) = n.scan("4-2", 1.0)
    assert n.scan("4-2", 5.0) == []  # once
    (ref,) = n.origin.refs
    assert (ref.config, ref.job_id, ref.seq, ref.origin, ref.digest) == ("hex8_2p", "4-2", 1, n.ident.node_id, digest)
    sc, body = decode_signed_checkpoint(n.origin.signed_bytes(digest))
    assert body.name == "step-10.pt" and body.size == 5000 and body.files[0].path == ""
    assert body.files[0].root == n.files.files[f"{DIR}/step-10.pt"].manifest.root
    assert _trust(n, "4-2").accept(sc, body)


def test_a_directory_counts_with_its_marker_and_waits_for_sync_manifests(tmp_path: Path) -> None:
    n = Node(tmp_path)
    d = n.root / DIR / "step-20"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"m" * 3000)
    (d / "optim.safetensors").write_bytes(b"o" * 100)
    assert n.scan("4-2", 0.0) == []
    (d / ".complete").write_bytes(b"")
    # complete now, but sync has not seen the files yet: it waits for the manifests
    assert n.origin.scan([CheckpointJob("4-2", "hex8_2p", DIR)], {}, 0.5) == []
    (digest,) = n.scan("4-2", 0.6)
    _, body = decode_signed_checkpoint(n.origin.signed_bytes(digest))
    assert [(f.path, f.size) for f in body.files] == [("model.safetensors", 3000), ("optim.safetensors", 100)]


def test_a_restart_and_the_next_job_never_announce_an_entry_twice(tmp_path: Path) -> None:
    n = Node(tmp_path)
    n.write("step-1.pt", b"a" * 100)
    n.scan("4-2", 0.0)
    (d1,) = n.scan("4-2", 2.0)
    n.origin = n.new_origin()  # the agent restarts; the job goes on
    assert [r.digest for r in n.origin.refs] == [d1]
    n.write("step-2.pt", b"b" * 100)
    n.scan("4-2", 10.0)
    (d2,) = n.scan("4-2", 12.0)
    assert [(r.job_id, r.seq) for r in n.origin.refs] == [("4-2", 2), ("4-2", 1)]
    n.origin = n.new_origin()  # the next job of the config on this node: only its own entries
    n.write("step-3.pt", b"c" * 100)
    n.scan("5-1", 20.0)
    (d3,) = n.scan("5-1", 22.0)
    assert [(r.job_id, r.seq) for r in n.origin.refs] == [("5-1", 1), ("4-2", 2), ("4-2", 1)]
    _, body = decode_signed_checkpoint(n.origin.signed_bytes(d3))
    assert body.name == "step-3.pt"


def test_signed_checkpoints_are_bounded_per_config_and_a_foreign_file_is_dropped(tmp_path: Path) -> None:
    n = Node(tmp_path)
    for i in range(KEPT_PER_CONFIG + 3):
        n.write(f"step-{i}.pt", bytes([i]) * 10)
        n.scan("4-2", 10.0 * i)
        n.scan("4-2", 10.0 * i + 2)
    assert [r.seq for r in n.origin.refs] == list(range(KEPT_PER_CONFIG + 3, 3, -1))
    assert len(list((tmp_path / ".sync" / "checkpoints").glob("*.ck"))) == KEPT_PER_CONFIG
    other = Identity.generate()  # a signed checkpoint of another node in the folder is not listed as ours
    foreign = Node(tmp_path / "x")
    foreign.ident = other
    foreign.origin = foreign.new_origin()
    foreign.write("step-0.pt", b"z")
    foreign.scan("4-2", 0.0)
    (fd,) = foreign.scan("4-2", 2.0)
    (tmp_path / ".sync" / "checkpoints" / f"{fd.hex()}.ck").write_bytes(foreign.origin.signed_bytes(fd))
    (tmp_path / ".sync" / "checkpoints" / "junk.ck").write_bytes(b"\x00garbage")
    again = n.new_origin()
    assert len(again.refs) == KEPT_PER_CONFIG and fd not in {r.digest for r in again.refs}
    assert sorted(p.name for p in (tmp_path / ".sync" / "checkpoints").glob("*.ck")) == sorted(
        f"{r.digest.hex()}.ck" for r in again.refs)


def test_a_pass_for_the_running_jobs_finds_their_dirs_and_skips_work_that_is_no_placement(tmp_path: Path) -> None:
    n = Node(tmp_path)
    for run in ("a", "b"):
        (n.root / "ck" / "p" / run).mkdir(parents=True)
        (n.root / "ck" / "p" / run / "s.pt").write_bytes(run.encode() * 10)
    n.files.set_checkpoint_globs((("hex8_2p", f"{DIR}/**"), ("p", "ck/p/*/**")))
    manifests = {p: f.manifest for p, f in n.files.scan(now=1e12).items()}
    dirs = (("hex8_2p", DIR), ("p", "ck/p/*"))
    n.write("x.pt", b"x")
    running = [("7-1", "p"), ("n1-a5-1", "hex8_2p"), ("run-abc", "hex8_2p")]
    assert n.origin.pass_for(running, dirs, manifests, 0.0) == []
    got = n.origin.pass_for(running, dirs, manifests, 5.0)
    assert sorted((r.config, r.job_id) for r in n.origin.refs) == [("p", "7-1"), ("p", "7-1")] and len(got) == 2


def test_the_placement_proof_job_control_kept_travels_with_the_checkpoint(tmp_path: Path) -> None:
    from p2pnode.jobs._controlfetch import ControlFetches
    from p2pnode.node._ckproof import placement_prover
    from p2pnode.node._plandist import seal_part
    from p2pnode.snapshot import PlanJob, PlanRef, PlanSection

    n = Node(tmp_path)
    leader = Identity.generate()
    part = PlanSection(term=4, seq=9, digest="d", node=n.ident.node_id,
                       assignments=[PlanJob(job_id="4-2", node=n.ident.node_id, template="train"),
                                    PlanJob(job_id="3-1", node=n.ident.node_id, template="train")])  # carried over
    sealed = seal_part(leader, part)
    jobs = ControlFetches()
    jobs.placement_proofs = {}
    got = jobs._open_part_keeping_proof(sealed, leader_key=leader.public_key,
                                        ref=PlanRef(term=4, seq=9, digest="d"), node_id=n.ident.node_id)
    assert got == part and jobs.placement_proof("4-2") == sealed and jobs.placement_proof("3-1") == b""
    n.origin.proof_of = jobs.placement_proof
    n.write("step-1.pt", b"p" * 10)
    n.scan("4-2", 0.0)
    (digest,) = n.scan("4-2", 2.0)
    sc, body = decode_signed_checkpoint(n.origin.signed_bytes(digest))
    assert sc.proof == sealed
    trust = CheckpointTrust(AssignmentBook(), {n.ident.node_id: n.ident.public_key}.get,
                            prove=placement_prover({4: leader.public_key}.get, {"train": "hex8_2p"}.get,
                                                   {"train"}.__contains__))
    assert trust.accept(sc, body)  # a node that never saw the part trusts the placement it proves
