"""Placement proofs of checkpoints (issue 41): which placements a leader-signed plan part attached to a checkpoint
shows. Pure (a signature check and a decode): :func:`placement_prover` makes the ``prove`` hook of
:class:`p2pnode.synccore.CheckpointTrust` from the leaders this node knows per term and its catalog."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import RejectedMessage
from ..snapshot import GangSlot
from ..synccore._checkpoints import MAX_PROOF_BYTES, Prove, ProvedPlacement
from ._plandist import open_proof

__all__ = ["gang_writer", "placement_prover", "trains"]


def placement_prover(leader_key_of_term: Callable[[int], bytes | None],
                     config_of_template: Callable[[str], str | None],
                     trains_template: Callable[[str], bool]) -> Prove:
    """``prove(proof, term)``: a :class:`~p2pnode.synccore.ProvedPlacement` per assignment in ``proof`` (a sealed
    plan part, :func:`~._plandist.open_proof`) when it is signed by the key of term ``term``'s leader
    (``leader_key_of_term``: None when this node does not know who led that term) and is a part of that term;
    ``config_of_template``: the catalog's config of a template (None: not in this node's catalog, skipped);
    ``trains_template``: whether the catalog's template is one whose checkpoints a config resumes from (kind
    ``training`` or ``exclusive``, with a ``[job.checkpoint]``: :func:`trains`). Only those placements are marked
    ``trains``: a selfplay job of the config proves nothing about its checkpoints (refused ``not_training``), nor
    does a gang member of rank above 0 (:func:`gang_writer`: a gang's checkpoints are its rank-0 member's, the
    DDP convention). [] when anything does not check: the checkpoint is then not trusted (``unknown_placement``)."""

    def prove(proof: bytes, term: int) -> list[ProvedPlacement]:
        key = leader_key_of_term(term)
        if key is None:
            return []
        try:
            part = open_proof(proof, leader_key=key, max_bytes=MAX_PROOF_BYTES)
        except RejectedMessage:
            return []
        if part.term != term:
            return []
        out = []
        for j in part.assignments:
            pid = j.plan_id
            config = config_of_template(j.template)
            if pid is not None and pid.term == term and config is not None:
                out.append(ProvedPlacement(config, j.job_id, j.node, j.template,
                                           bool(trains_template(j.template)) and gang_writer(j.gang)))
        return out

    return prove


def trains(template: object) -> bool:
    """Whether a catalog template's placements may prove a checkpoint (issue 41, review H1): it is fenced (kind
    ``training`` or ``exclusive``: one per config) and declares ``[job.checkpoint]``."""
    return bool(getattr(template, "fenced", False)) and getattr(template, "checkpoint", None) is not None


def gang_writer(gang: GangSlot | None) -> bool:
    """Whether a job in gang slot ``gang`` (None: no gang member) writes its config's checkpoints: any job that is no
    gang member, and a gang's rank-0 member (``P2PNODE_GANG_RANK=0``: the node the plan gave the gang's id, whose
    job id the gang's bears). One writer per gang, as DDP's convention of saving on one rank; under an elastic
    torchrun gang torchrun numbers the workers itself, so the writer is the first worker of that member
    (``deploy/examples/ddp_elastic.py``), not necessarily torchrun's rank 0. A member of another rank neither
    announces the files of its checkpoint dir (:func:`p2pnode.sync._checkpoints.checkpoint_writers`) nor proves
    anyone's (:func:`placement_prover`): its checkpoints, under a later placement seq, would otherwise order above
    rank 0's."""
    return gang is None or gang.rank == 0
