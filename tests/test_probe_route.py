"""``POST /probe`` (the SWIM probes' HTTP fallback) and the probe settings, through httpx.ASGITransport: a member's
sealed ping is answered with its sealed ack, bad bodies are refused and counted, and with ``gossip.probes`` off
(the default) nothing of the probes exists."""

import time

import httpx
import pytest
from helpers import envelope
from test_http import app_of, msg, post

from p2pnode.agent import Agent
from p2pnode.config import load_config
from p2pnode.errors import ConfigError
from p2pnode.gossip import Ack, Ping, ProbeCodec, ProbeKeys
from p2pnode.identity import Identity


def make_agent(tmp_path, **gossip):
    cfg = load_config(None, env={}, overrides={"agent": {"data_dir": tmp_path, "port": 0},
                                               "discovery": {"mdns": False}, "gossip": gossip})
    a = Agent(cfg)
    a.addr = "127.0.0.1:1"
    a.sample()
    a.publish()
    return a


def wall_ms() -> int:
    return int(time.time() * 1000)


async def test_a_members_ping_over_http_gets_its_sealed_ack(tmp_path):
    agent = make_agent(tmp_path, probes=True)
    peer = Identity.generate()
    codec = ProbeCodec(ProbeKeys(peer.node_id, peer.private_key, {agent.node_id: agent.identity.public_key}.get))
    ping = codec.seal(Ping(7, peer.node_id, agent.node_id, 0), wall_ms())
    assert ping is not None
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(agent)), base_url="http://node") as c:
        r = await c.post("/probe", content=ping)
        assert r.status_code == 204  # not a member yet: no pair key (the peer's snapshot is not held)
        assert agent.probes.codec.rejected["unknown_sender"] == 1
        assert (await post(c, msg(peer, [envelope(peer, 3)]))).status_code == 200
        r = await c.post("/probe", content=ping)
        assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
        assert len(r.content) <= len(ping)
        ack = codec.open(r.content, "127.0.0.1", 0.0, wall_ms())
        assert isinstance(ack, Ack) and ack.seq == 7 and ack.sender == agent.node_id
        assert (await c.post("/probe", content=ping)).status_code == 204  # a replay
        assert agent.probes.codec.rejected["replay"] == 1
        assert (await c.post("/probe", content=b"\x93" + b"x" * 600)).status_code == 413
        assert (await c.post("/probe", content=b"\xc1")).status_code == 204  # not a packet
        assert (await c.get("/probe")).status_code == 405
        text = (await c.get("/metrics")).text
        probes = (await c.get("/status")).json()["membership"]["probes"]
    assert probes["rejected"]["replay"] == 1 and probes["awareness"] == 0 and probes["interval_s"] == 1.0
    rejected = agent.probes.codec.rejected
    assert rejected["oversized"] == 1 and rejected["malformed"] == 1
    assert 'p2pnode_probe_rejected_total{reason="oversized"} 1.0' in text
    assert "p2pnode_probe_awareness 0.0" in text and "p2pnode_suspicions_total 0.0" in text


async def test_probes_off_by_default_leave_no_trace(tmp_path):
    agent = make_agent(tmp_path)
    assert agent.probes is None and agent.core.prober is None
    assert agent.core.membership.adopt_suspicions is False
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(agent)), base_url="http://node") as c:
        assert (await c.post("/probe", content=b"x")).status_code == 404
        text = (await c.get("/metrics")).text
        assert "probes" not in (await c.get("/status")).json()["membership"]
    assert "p2pnode_probe" not in text and "p2pnode_suspicions" not in text


@pytest.mark.parametrize("gossip", [{"probe_interval_s": 0.01}, {"probe_timeout_s": 1.0},
                                    {"probe_timeout_s": 0.001}, {"indirect_checks": -1},
                                    {"indirect_checks": 17}, {"awareness_max_multiplier": 0}])
def test_probe_settings_are_bounded(tmp_path, gossip):
    with pytest.raises(ConfigError, match="gossip"):
        load_config(None, env={}, overrides={"agent": {"data_dir": tmp_path}, "gossip": {"probes": True, **gossip}})


async def test_probe_settings_reach_the_prober(tmp_path):
    agent = make_agent(tmp_path, probes=True, probe_interval_s=2.0, probe_timeout_s=0.7, indirect_checks=2,
                       awareness_max_multiplier=4)
    cfg = agent.core.prober.cfg
    assert (cfg.probe_interval_s, cfg.probe_timeout_s, cfg.indirect_checks, cfg.awareness_max_multiplier) == (
        2.0, 0.7, 2, 4)
    assert agent.core.membership.adopt_suspicions is True
    assert agent.core.prober._seq > time.time_ns() // 1000 - 60_000_000  # seqs start at the wall clock (µs)
