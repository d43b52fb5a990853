"""The pending-reason checker of ``bench/seed003_fleet.py`` (issue 38): the blockers it recomputes from a sampled
view (a node in its band, offers the plan used, the guard's cap, GPU room, tiers) and the causes it reads in a
reason, on hand-built views. Pure: no agent is started."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("seed003_fleet", ROOT / "bench" / "seed003_fleet.py")
bench = sys.modules["seed003_fleet"] = importlib.util.module_from_spec(_spec)  # dataclasses look their module up
_spec.loader.exec_module(bench)

CATALOG = bench.load_catalog(bench.CATALOG)
NEEDS = bench.needs_of(CATALOG)
TEMPLATES = dict(CATALOG.templates)


def node(gpus, offer, *, level=0, tags=(), cpus=64, memory_gib=256):
    return {"gpus": list(gpus), "tags": list(tags), "declared": {"cpus": cpus, "memory_gib": memory_gib},
            "offer": offer, "level": level, "full": []}


def job(node_id, gpu, fraction, vram, template="selfplay-hex8_2p", new=False, job_id=None):
    return {"job_id": job_id or f"{node_id}-{gpu}-{vram}-{fraction}", "node": node_id, "template": template,
            "gpus": [gpu], "fraction": fraction, "vram": vram, "new": new}


def view(nodes, jobs=()):
    jobs = list(jobs)
    return {"nodes": nodes, "jobs": jobs, "ratio": 0.8, "used": Counter(j["node"] for j in jobs if j["new"])}


def test_the_floors_and_fractions_come_from_the_example_catalog():
    assert (NEEDS["selfplay-hex8_2p"].vram, NEEDS["selfplay-hex8_2p"].num_gpus) == (8, 0.25)  # 4 GiB, floor 8
    assert NEEDS["selfplay-hexagonal_2p"].vram == 32 and NEEDS["train-hexagonal_2p"].tiers == (1, 2)


def test_a_4090_holding_16_gib_is_blocked_by_the_cap_not_by_room():
    # Two 0.25-GPU selfplays at 8 GiB on each GPU: 16 of 19.2 usable GiB committed, 8 GiB of the card free.
    v = view({"n": node([24.0] * 2, offer=2)}, [job("n", g, 0.25, 8, job_id=f"{g}{k}") for g in (0, 1) for k in "ab"])
    found, per_node = bench.blockers(v, NEEDS["selfplay-hex8_2p"], TEMPLATES)
    assert found == {"cap"} and per_node == {"n": "cap"}


def test_a_gpu_with_nothing_free_even_without_the_cap_is_room():
    v = view({"n": node([24.0], offer=2)}, [job("n", 0, 0.5, 16), job("n", 0, 0.25, 8)])
    assert bench.blockers(v, NEEDS["selfplay-hex8_2p"], TEMPLATES)[0] == {"room"}


def test_a_node_offering_nothing_is_in_its_band_and_the_plans_own_assignments_use_offers():
    assert bench.blockers(view({"n": node([24.0], offer=0)}), NEEDS["selfplay-hex8_2p"], TEMPLATES)[0] == {"band"}
    v = view({"n": node([24.0] * 2, offer=1)}, [job("n", 0, 0.25, 8, new=True)])
    assert bench.blockers(v, NEEDS["selfplay-hex8_2p"], TEMPLATES)[0] == {"offers_used"}


def test_work_that_fits_somewhere_has_no_blocker_and_a_degraded_node_is_named():
    nodes = {"a": node([80.0], offer=0), "b": node([80.0], offer=1)}
    found, per_node = bench.blockers(view(nodes), NEEDS["train-hex8_2p"], TEMPLATES)
    assert found == set() and per_node == {"a": "band", "b": "fits"}
    degraded = {"a": node([80.0], offer=1, level=4)}
    assert bench.blockers(view(degraded), NEEDS["train-hex8_2p"], TEMPLATES)[0] == {"level"}


def test_the_cap_alone_keeps_a_5090_from_32_gib_work():
    # Alone, the 5090 can never take it under the cap (25.6 usable GiB); beside an H200 in its band, the band
    # is what holds the work and the 5090 is shown, not counted.
    alone = view({"5090": node([32.0], offer=1)})
    assert bench.blockers(alone, NEEDS["selfplay-hexagonal_2p"], TEMPLATES)[0] == {"cap"}
    nodes = {"5090": node([32.0], offer=1), "h200": node([141.0], offer=0)}
    found, per_node = bench.blockers(view(nodes), NEEDS["selfplay-hexagonal_2p"], TEMPLATES)
    assert found == {"band"} and per_node == {"5090": "cap_always", "h200": "band"}


def test_no_node_in_the_tiers():
    assert bench.blockers(view({"small": node([8.0], offer=4)}), NEEDS["train-hex8_2p"], TEMPLATES)[0] == {"tiers"}


@pytest.mark.parametrize(("reason", "causes"), [
    ("no node in tiers 3/2/1 has a GPU with 8 GiB free", {"room"}),
    ("waits ~38 s for 1-20 (selfplay-square19_2p) on n3 to end (predicted); no node in tiers 3/2/1 has a GPU with "
     "32 GiB free", {"room"}),
    ("no capacity offered for GPU work: this plan used every offer (5); nodes with GPUs offering none: 3 in their "
     "GPU utilization band or cordoned", {"offers_used", "band"}),
    ("no capacity offered for GPU work: nodes with GPUs offering none: 1 in their GPU utilization band or cordoned",
     {"band"}),
    ("nodes that fit are degraded (level 3 refuses NORMAL work)", {"level"}),
    ("unsatisfiable: asks 1 GPU with 32 GiB each, the most any node can commit on one GPU is 25.6 GiB",
     {"unsatisfiable", "cap"}),
    ("training may use tiers 1/2, no node is in them", {"tiers"}),
    ("nodes that fit lack 8 free CPUs", {"resources"}),
])
def test_the_causes_a_reason_names(reason, causes):
    assert bench.reason_causes(reason) == causes
