"""The agent's HTTP surface through httpx.ASGITransport (no sockets): views, metrics and every bad input."""

import logging
from pathlib import Path

import httpx
import msgpack
import msgspec
import pytest
import trio
from helpers import envelope

from p2pnode.agent import Agent
from p2pnode.config import load_config
from p2pnode.http import _views as views
from p2pnode.http import create_app
from p2pnode.identity import Identity
from p2pnode.node._table import Started
from p2pnode.snapshot import PlanJob
from p2pnode.wire import decode_gossip, encode_gossip

TOKEN = "test-cluster-token-0123456789"


@pytest.fixture
async def agent(tmp_path):
    cfg = load_config(None, env={}, overrides={"agent": {"data_dir": tmp_path, "fake_gpus": "H100,RTX 4090", "port": 0},
                                               "discovery": {"mdns": False}})
    a = Agent(cfg)
    a.addr = "127.0.0.1:1"
    a.sample()
    a.publish()
    return a


DEMO = Path(__file__).parent.parent / "deploy" / "examples" / "demo" / "catalog.toml"


def app_of(agent):
    """The agent's ASGI app, built as the agent builds it: from its HTTP surfaces and its metrics registry."""
    return create_app(agent.surfaces, agent.metrics_registry)


def demo_agent(tmp_path, **sections):
    """An in-process agent with the demo catalog (not running: routes are called through ASGITransport)."""
    overrides = {"agent": {"data_dir": tmp_path, "port": 0, "catalog": str(DEMO)}, "discovery": {"mdns": False}}
    overrides.update(sections)
    a = Agent(load_config(None, env={}, overrides=overrides))
    a.sample()
    a.publish()
    return a


@pytest.fixture
async def client(agent):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(agent)), base_url="http://node") as c:
        yield c


def msg(sender, envs, digest=None):
    return encode_gossip(sender.node_id, "", digest or {}, envs)


async def post(client, body):
    return await client.post("/gossip", content=body, headers={"content-type": "application/msgpack"})


async def test_status_members_healthz_metrics(agent, client):
    st = (await client.get("/status")).json()
    assert st["node"]["id"] == agent.node_id and st["node"]["cluster_open"] is True
    res = st["snapshot"]["resources"]
    assert res["gpu_source"] == "fake" and res["power_score"] == 2330 and len(res["gpus"]) == 2
    assert [m["id"] for m in st["members"]] == [agent.node_id]
    assert (await client.get("/members")).json()["members"][0]["self"] is True
    assert (await client.get("/healthz")).json() == {"status": "ok", "node_id": agent.node_id}
    text = (await client.get("/metrics")).text
    assert "p2pnode_power_score 2330.0" in text
    assert 'p2pnode_gpu_memory_total_bytes{gpu="0"' in text
    assert 'p2pnode_members{state="alive"} 1.0' in text and "p2pnode_incarnation 1.0" in text


async def test_push_pull_over_http(agent, client):
    peer = Identity.generate()
    r = await post(client, msg(peer, [envelope(peer, 3)]))
    assert r.status_code == 200
    reply = decode_gossip(r.content)
    assert reply.sender == agent.node_id
    assert [e.origin for e in reply.envelopes] == [agent.node_id]  # what the peer lacked
    assert reply.digest[peer.node_id] == 3
    members = (await client.get("/members")).json()["members"]
    assert {m["id"] for m in members} == {agent.node_id, peer.node_id}


async def rejected(client):
    return (await client.get("/status")).json()["gossip"]["rejected"]


async def test_every_bad_input_is_4xx_counted_and_the_agent_keeps_serving(agent, client):
    peer, other = Identity.generate(), Identity.generate()
    good = envelope(peer, 5)
    assert (await post(client, msg(peer, [good]))).status_code == 200

    flipped = msgspec.structs.replace(envelope(peer, 6), sig=bytes(64))
    wrong_key = msgspec.structs.replace(envelope(peer, 7), key=other.public_key)
    cases = [
        (msg(peer, [flipped]), 422, "bad_signature"),
        (msg(peer, [wrong_key]), 422, "wrong_key"),
        (msg(peer, [good]), 409, "stale"),  # replay of the same version
        (msg(peer, [envelope(peer, 4)]), 409, "stale"),  # older version
        (b"\xc1\x00garbage", 400, "malformed"),
        (msgpack.packb({"schema": 1, "from": 42}), 422, "bad_type"),
        (msgpack.packb({"schema": 77, "from": "x"}), 422, "bad_schema"),
        (b"\x00" * (1024 * 1024 + 1), 413, "oversized"),
    ]
    for body, status, reason in cases:
        before = (await rejected(client)).get(reason, 0)
        r = await post(client, body)
        assert r.status_code == status, reason
        assert (await rejected(client)).get(reason, 0) == before + 1, reason
    # Still serving, and a good newer snapshot is still accepted.
    assert (await post(client, msg(peer, [envelope(peer, 8)]))).status_code == 200
    assert (await client.get("/healthz")).status_code == 200
    metrics = (await client.get("/metrics")).text
    assert 'p2pnode_gossip_rejected_total{reason="stale"} 2.0' in metrics


async def test_batch_with_one_forgery_keeps_the_rest(agent, client):
    a, b = Identity.generate(), Identity.generate()
    forged = msgspec.structs.replace(envelope(a, 1), sig=bytes(64))
    r = await post(client, msg(a, [forged, envelope(b, 1)]))
    assert r.status_code == 422
    assert decode_gossip(r.content).rejected == [(a.node_id, "bad_signature")]
    ids = {m["id"] for m in (await client.get("/members")).json()["members"]}
    assert b.node_id in ids and a.node_id not in ids


async def test_get_on_gossip_is_405(client):
    assert (await client.get("/gossip")).status_code == 405


async def test_token_mode_rejects_unendorsed_nodes(tmp_path):
    cfg = load_config(None, env={"P2PNODE_TRUST": "token", "P2PNODE_CLUSTER_TOKEN": TOKEN},
                      overrides={"agent": {"data_dir": tmp_path, "port": 0}, "discovery": {"mdns": False}})
    a = Agent(cfg)
    a.sample()
    a.publish()
    assert a.state.get(a.node_id).envelope.endorsement is not None
    outsider, member = Identity.generate(), Identity.generate()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        r = await post(c, msg(outsider, [envelope(outsider, 1)]))
        assert r.status_code == 422 and decode_gossip(r.content).rejected == [(outsider.node_id, "unendorsed")]
        r = await post(c, msg(member, [envelope(member, 1, token=TOKEN)]))
        assert r.status_code == 200
        st = (await c.get("/status")).json()
        assert st["node"]["cluster_open"] is False and st["gossip"]["rejected"] == {"unendorsed": 1}
        assert {m["id"] for m in st["members"]} == {a.node_id, member.node_id}


async def test_metrics_pass_promtool_lint(client):
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) not installed")
    text = (await client.get("/metrics")).content
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


async def test_events_and_guard_routes(agent, client):
    agent.guard.monitor.log.emit("DISK_SPACE_LOW", {"disk_percent": 61.0}, 1234.0)
    agent.publish()  # the event now travels in our snapshot
    peer = Identity.generate()
    ev = {"seq": 1, "name": "NODE_OVERLOADED", "at": 2000.0, "payload": {"level": 3}}
    assert (await post(client, msg(peer, [envelope(peer, 1, events=[ev])]))).status_code == 200
    body = (await client.get("/events")).json()
    assert body["events"][0]["name"] == "DISK_SPACE_LOW"
    assert [(e["node_id"], e["name"]) for e in body["cluster"]] == [(peer.node_id, "NODE_OVERLOADED"),
                                                                    (agent.node_id, "DISK_SPACE_LOW")]
    g = (await client.get("/guard")).json()
    assert set(g["admits"]) == {"training", "selfplay", "evaluation"} and "level" in g
    bad = msgspec.structs.replace(envelope(peer, 2, events="lots"))
    assert (await post(client, msg(peer, [bad]))).status_code == 422


async def test_alert_rules_use_metrics_the_agent_exports(client):
    import re
    from pathlib import Path

    rules = (Path(__file__).parent.parent / "deploy" / "prometheus" / "alerts.yml").read_text()
    text = (await client.get("/metrics")).text
    names = set(re.findall(r"expr: (p2pnode_\w+)", rules))
    assert names and all(f"\n{n} " in text or f"\n{n}{{" in text for n in names), names


async def test_catalog_digest_travels_and_mismatch_is_flagged(tmp_path):
    from pathlib import Path

    example = Path(__file__).parent.parent / "deploy" / "examples" / "catalog.toml"
    cfg = load_config(None, env={}, overrides={"agent": {"data_dir": tmp_path, "port": 0, "catalog": str(example)},
                                               "discovery": {"mdns": False}})
    a = Agent(cfg)
    a.sample()
    a.publish()
    same, other = Identity.generate(), Identity.generate()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        await post(c, msg(same, [envelope(same, 1, jobs={"catalog_digest": a.catalog.digest})]))
        await post(c, msg(other, [envelope(other, 1, jobs={"catalog_digest": "0" * 32})]))
        st = (await c.get("/status")).json()
    assert st["catalog"]["digest"] == a.catalog.digest and st["catalog"]["templates"] == 8
    assert st["catalog"]["mismatch"] == [other.node_id]
    assert st["snapshot"]["jobs"]["catalog_digest"] == a.catalog.digest


async def test_signals_are_validated_with_clear_4xx(tmp_path):
    a = demo_agent(tmp_path)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        ok = await c.post("/signals", json={"config": "hex8_2p", "elo_velocity": 12, "quality": 0.9})
        assert ok.status_code == 200 and ok.json() == {"accepted": ["hex8_2p"]}
        assert (await c.post("/signals", content=b"{nope",
                             headers={"content-type": "application/json"})).status_code == 400
        r = await c.post("/signals", json={"config": "chess_2p", "quality": 0.5})
        assert r.status_code == 422 and "not in the catalog" in r.json()["reasons"][0]
        r = await c.post("/signals", json=[{"config": "hex8_2p", "quality": 3}, {"config": "hex8_2p", "bogus": 1}])
        assert r.status_code == 422 and len(r.json()["reasons"]) == 2
        assert (await c.post("/signals", content=b"x" * 300_000)).status_code == 413
        a.publish()
        assert a.jobs.newest_signals()["hex8_2p"].elo_velocity == 12.0
        assert (await c.get("/jobs")).json()["signals_rejected"] == 2
    await trio.lowlevel.checkpoint()


async def test_job_metrics_exported_with_a_catalog(tmp_path):
    a = demo_agent(tmp_path)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        text = (await c.get("/metrics")).text
        assert "p2pnode_jobs_running 0.0" in text and "p2pnode_capacity_offer 0.0" in text
        assert 'p2pnode_job_stops_total{rule="max_runtime"} 0.0' in text  # every stop rule's, from 0
        a.jobs.stops.rules.counts["operator"] += 2
        text = (await c.get("/metrics")).text
        assert 'p2pnode_job_stops_total{rule="operator"} 2.0' in text
        assert (await c.get("/plan")).json()["plan"] is None


async def test_signals_file_is_watched(tmp_path):
    import json as _json
    import os

    sig = tmp_path / "signals.json"
    a = demo_agent(tmp_path / "d", scheduler={"signals_file": str(sig)})
    a.jobs.signals.watch_file(a.jobs.settings.signals_file)  # missing file: nothing, no error
    sig.write_text(_json.dumps([{"config": "square19_2p", "curriculum_weight": 1.5, "data_age_s": 120}]))
    a.jobs.signals.watch_file(a.jobs.settings.signals_file)
    assert a.jobs.signals.entries["square19_2p"].values["curriculum_weight"] == 1.5
    sig.write_text(_json.dumps([{"config": "square19_2p", "quality": 7}]))  # invalid: kept out, old value stays
    os.utime(sig, (1, 1))
    a.jobs.signals.watch_file(a.jobs.settings.signals_file)
    assert a.jobs.signals.entries["square19_2p"].values["curriculum_weight"] == 1.5 and a.jobs.signals.rejected == 1


async def test_circuit_breaker_stops_spawning_after_failures(tmp_path):
    cat = tmp_path / "catalog.toml"
    cat.write_text('[[job]]\nname = "broken"\nkind = "selfplay"\nconfig = "c"\nargv = ["false"]\nenv = ["PATH"]\n'
                   "max_concurrency = 10\n")
    a = Agent(load_config(None, env={}, overrides={
        "agent": {"data_dir": tmp_path / "d", "port": 0, "catalog": str(cat)}, "discovery": {"mdns": False},
        "guard": {"breaker_failures": 2, "breaker_cooldown_s": 60.0}}))
    a.sample()
    jc = a.jobs
    async with trio.open_nursery() as n:
        await n.start(jc.runner.run)
        for i in range(2):
            assert jc.admit(PlanJob(job_id=f"j{i}", node=a.node_id, template="broken"))
            jc.start(PlanJob(job_id=f"j{i}", node=a.node_id, template="broken"), 1)
            with trio.fail_after(10):
                while f"j{i}" in jc.runner.jobs:
                    await trio.sleep(0.05)
        assert jc.breaker.state == "open"
        assert not jc.admit(PlanJob(job_id="j2", node=a.node_id, template="broken"))
        assert "circuit breaker open after 2 failed jobs" in jc.refused[-1].reason
        assert views.jobs_view(a.surfaces, a.surfaces.jobs)["breaker"]["trips"] == 1
        n.cancel_scope.cancel()


async def test_state_changing_routes_need_a_signed_request_in_token_mode(tmp_path):
    """No secret on the wire: the cluster token itself (as a bearer token) is refused; an HMAC-signed request is
    accepted once; its replay, a changed body, an old time or an unknown key are refused, each counted."""
    import json as _json
    import time as _time

    from p2pnode.keyring import key_id_of
    from p2pnode.reqauth import AUTH_HEADER, sign_request

    a = demo_agent(tmp_path, agent={"data_dir": tmp_path, "port": 0, "catalog": str(DEMO), "trust": "token",
                                    "cluster_token": TOKEN})
    kid = key_id_of(TOKEN)

    def signed(path, body, now=None, token=TOKEN):
        return {AUTH_HEADER: sign_request(token, key_id_of(token), "POST", path, body, now or _time.time(),
                                                  receiver=a.node_id),
                "content-type": "application/json"}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        body = _json.dumps({"config": "hex8_2p", "quality": 0.9}).encode()
        for path, b in (("/signals", body), ("/sync/trigger", b"")):
            assert (await c.post(path, content=b)).status_code == 401
            assert (await c.post(path, content=b, headers={"authorization": f"Bearer {TOKEN}"})).status_code == 401
            h = signed(path, b)
            assert (await c.post(path, content=b, headers=h)).status_code == 200
            r = await c.post(path, content=b, headers=h)  # replayed
            assert r.status_code == 401 and r.json()["reason"] == "replayed"
        r = await c.post("/signals", content=body.replace(b"0.9", b"0.1"), headers=signed("/signals", body))
        assert r.json()["reason"] == "bad_mac"
        r = await c.post("/signals", content=body, headers=signed("/signals", body, now=_time.time() - 120))
        assert r.json()["reason"] == "expired"
        other = "another-cluster-token-xyz"
        r = await c.post("/signals", content=body, headers=signed("/signals", body, token=other))
        assert r.json()["reason"] == "unknown_key"
        st = (await c.get("/status")).json()  # read-only routes stay open
        auth = st["node"]["request_auth"]
        assert auth["accepted"] == 2 and auth["refused"]["replayed"] == 2 and auth["refused"]["expired"] == 1
        assert auth["refused"]["missing"] == 4  # no header, or the token itself as a bearer token
        assert st["node"]["keyring"] == {"primary": kid, "key_ids": [kid]} and TOKEN not in _json.dumps(st)


async def test_read_token_protects_views_but_not_healthz(tmp_path):
    from p2pnode.keyring import key_id_of
    from p2pnode.reqauth import AUTH_HEADER, sign_request

    a = demo_agent(tmp_path, agent={"data_dir": tmp_path, "port": 0, "trust": "token", "cluster_token": TOKEN,
                                    "read_token": "read-only-token-for-prometheus"})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        assert (await c.get("/healthz")).status_code == 200
        for path in ("/status", "/metrics", "/members"):
            assert (await c.get(path)).status_code == 401
            ok = await c.get(path, headers={"authorization": "Bearer read-only-token-for-prometheus"})
            assert ok.status_code == 200
            signed = {AUTH_HEADER: sign_request(TOKEN, key_id_of(TOKEN), "GET", path, b"",
                                                __import__("time").time(), receiver=a.node_id)}
            assert (await c.get(path, headers=signed)).status_code == 200
        assert a.trust.read_refusals == 3


async def test_a_full_gpu_refuses_work_on_itself_not_on_the_node(tmp_path):
    """One of two GPUs at 100 % utilization with its memory past the limit: new work on it is refused with the
    reason, work on the other GPU is admitted, and the node's degradation level stays normal."""
    cat = tmp_path / "catalog.toml"
    cat.write_text('[[job]]\nname = "sp"\nkind = "selfplay"\nconfig = "c"\nargv = ["true"]\n'
                   "[job.resources]\nnum_gpus = 1\nvram_gib = 4\n")
    a = Agent(load_config(None, env={}, overrides={
        "agent": {"data_dir": tmp_path / "d", "port": 0, "catalog": str(cat), "fake_gpus": "2xH100"},
        "discovery": {"mdns": False}}))
    fake = a.sampler.gpu_source
    total = fake.read()[0].mem_total_bytes
    fake.set_load(0, util_percent=100.0, mem_used_bytes=int(total * 0.95))
    a.sample()
    # A calm host (this machine may be busy with other tests): only the GPUs are under test.
    a.last_sample = msgspec.structs.replace(a.last_sample, cpu_percent=1.0, mem_percent=10.0, disk_percent=10.0)
    a.guard.check(a.last_sample)
    assert a.guard.level == 0 and a.guard.gpus_full() == (0,)
    jc = a.jobs
    assert not jc.admit(PlanJob(job_id="on-full", node=a.node_id, template="sp", gpus=[0], gpu_fraction=1.0,
                                 vram_gib=4.0))
    assert "GPU 0 memory is at or above the GPU limit" in jc.refused[-1].reason
    assert jc.admit(PlanJob(job_id="on-free", node=a.node_id, template="sp", gpus=[1], gpu_fraction=1.0,
                             vram_gib=4.0))


async def test_a_chunked_body_is_charged_in_full_whatever_content_length_it_claims(agent):
    """Admission charges the declared length; a chunked body's length is its chunks', so a ``content-length: 1``
    beside ``transfer-encoding: chunked`` is no declaration: the host pays a whole ``max_body_bytes``."""
    from p2pnode.http import GossipEndpoint, serve_gossip

    limit = agent.config.gossip.max_body_bytes
    burst = max(agent.config.gossip.max_inbound_bytes_per_s, 2 * limit)

    async def post_raw(headers, host):
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"\xc1", "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/gossip", "headers": headers, "client": (host, 1)}
        await serve_gossip(GossipEndpoint.of(agent.surfaces), scope, receive, send)
        return sent[0]["status"]

    honest = [(b"content-length", b"1")]
    smuggled = [(b"content-length", b"1"), (b"transfer-encoding", b"chunked")]
    n = burst // limit + 1
    assert [await post_raw(honest, "10.9.9.8") for _ in range(n)] == [400] * n  # 1 byte each: admitted, malformed
    statuses = [await post_raw(smuggled, "10.9.9.9") for _ in range(n)]
    assert statuses == [400] * (n - 1) + [429]  # charged a whole body each: the bucket is spent


async def test_guard_admits_each_kind_at_its_catalog_priority_and_jobs_say_what_holds_the_level(tmp_path):
    """Issue 24 item 5: ``/guard`` shows each kind admitted at the catalog's ``[policy] priorities`` (the demo's
    training is HIGH, which a heavy node still admits), and ``/jobs`` gives a refusing node's true reason, the
    dwell, when the load is back to normal but the level may not fall yet (it said "load high")."""
    import re

    a = demo_agent(tmp_path, guard={"cpu_window_s": 0.0})  # each sample alone: the test is about the dwell's words
    heavy = msgspec.structs.replace(a.last_sample, cpu_percent=77.0, mem_percent=10.0, disk_percent=10.0)  # 0.96: heavy
    a.guard.check(heavy)
    assert a.guard.level == 3
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        g = (await c.get("/guard")).json()
    assert (g["level"], g["level_name"]) == (3, "heavy")
    assert g["admits"]["training"] == {"ok": True, "reason": "", "priority": "HIGH"}
    assert g["admits"]["evaluation"]["ok"] and g["admits"]["evaluation"]["priority"] == "HIGH"
    sp = g["admits"]["selfplay"]
    assert not sp["ok"] and sp["priority"] == "NORMAL"
    assert sp["reason"] == ("NORMAL work refused at degradation level 3 (heavy): CPU at 77 % is above its warning "
                            "level (70 %; limit 80 %)")
    # The load falls back to normal at once; the dwell (30 s) holds heavy, and every view says so.
    a.guard.check(msgspec.structs.replace(heavy, cpu_percent=1.0))
    assert a.guard.level == 3 and a.guard.assessment.level == 0 and a.guard.assessment.reasons == ()
    a.publish()
    (refusing,) = [r for r in views.jobs_view(a.surfaces, a.surfaces.jobs)["refusing"] if r["node_id"] == a.node_id]
    assert "load high" not in refusing["reason"]
    assert re.fullmatch(r"degradation level 3 \(heavy\) refuses NORMAL work: level 3 \(heavy\) is held by the dwell: "
                        r"load ratio 0\.14 is back under its edge 0\.95; the level may fall in \d+ s",
                        refusing["reason"]), refusing["reason"]
    assert "held by the dwell" in a.guard.view()["reasons"][0]


async def test_guard_and_metrics_show_the_window_the_raw_sample_and_psi(agent, client, autojump_clock):
    """Issue 38 item 5: ``/guard`` and ``/metrics`` show CPU over its window beside the raw sample and PSI, and
    say PSI never moves the level; a CPU spike the window absorbs admits all work."""
    from p2pnode.resources import PressureStall, decode_stall

    psi = PressureStall(cpu=decode_stall(b"some avg10=42.50 avg60=10.00 avg300=1.00 total=7\n"),
                        memory=decode_stall(b"some avg10=3.00 avg60=1.00 avg300=1.00 total=9\n"
                                            b"full avg10=1.25 avg60=0.00 avg300=0.00 total=5\n"),
                        source="/proc/pressure")
    calm = msgspec.structs.replace(agent.last_sample, cpu_percent=5.0, mem_percent=10.0, disk_percent=10.0, psi=psi)
    for _ in range(10):  # one sample a second (each a new sample: the same one enters the window once)
        agent.guard.check(msgspec.structs.replace(calm))
        await trio.sleep(1.0)
    agent.guard.check(msgspec.structs.replace(calm, cpu_percent=100.0))  # one saturated second
    g = (await client.get("/guard")).json()
    cpu = g["assessment"]["signals"]["cpu"]
    assert g["level"] == 0 and cpu["sample_percent"] == 100.0 and cpu["basis"] == "window", g["reasons"]
    assert 10.0 < cpu["window_percent"] < 20.0 and cpu["psi_some_avg10"] == 42.5 and cpu["psi_moves_level"] is False
    assert g["windows"]["cpu_window_s"] == 10.0 and g["windows"]["psi_moves_level"] is False
    assert g["pressure_stall"]["source"] == "/proc/pressure" and g["pressure_stall"]["memory"]["full"]["avg10"] == 1.25
    assert g["assessment"]["resources"]["cpu"]["used_percent"] == cpu["assessed_percent"]
    text = (await client.get("/metrics")).text
    assert 'p2pnode_pressure_stall_ratio{kind="some",resource="cpu"} 0.425' in text
    assert 'p2pnode_pressure_stall_ratio{kind="full",resource="memory"} 0.0125' in text
    import re

    shown = re.search(r'p2pnode_guard_assessed_percent\{resource="cpu"\} ([0-9.e+-]+)', text)
    assert shown is not None and abs(float(shown.group(1)) - cpu["assessed_percent"]) < 0.01, text
    assert 'p2pnode_pressure_stall_rejected_total{reason="out_of_range"} 0.0' in text


async def test_job_table_transition_errors_are_a_metric_in_jobs_and_a_rate_limited_warning(tmp_path, caplog):
    """Issue 39: an event the job table has no transition for is counted in ``/metrics`` by state and event, listed
    in ``/jobs`` (``transition_errors``), and logged by the driver at its next step (at most once a minute)."""
    a = demo_agent(tmp_path)
    now = a.jobs.ctx.now()
    a.jobs.core.observe(Started("nobody", 7), now)  # the executor reports a process the table never heard of
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        text = (await c.get("/metrics")).text
        assert 'p2pnode_job_transition_errors_total{event="Started",state="unknown"} 1.0' in text
        errs = (await c.get("/jobs")).json()["transition_errors"]
        assert [(e["job_id"], e["state"], e["event"]) for e in errs] == [("nobody", "unknown", "Started")]
    with caplog.at_level(logging.WARNING, logger="p2pnode.jobs._tablelog"):
        a.jobs.step()
        a.jobs.core.observe(Started("again", 8), now)
        a.jobs.step()  # within the minute: no second line
    lines = [r.getMessage() for r in caplog.records if r.name == "p2pnode.jobs._tablelog"]
    assert len(lines) == 1 and "job nobody: no transition for Started from unknown" in lines[0], lines
    await trio.lowlevel.checkpoint()


async def test_counts_made_before_the_first_scrape_are_in_it_as_an_eager_registry_shows_them(agent, client):
    """The registry is made at the first ``GET /metrics`` (``LazyRegistry``), and it collects from the surfaces, so
    what was counted before (here a refused snapshot) is in that first scrape, in the same text an eager registry
    (``make_registry``, what the agent built at start before) gives."""
    from prometheus_client import generate_latest

    from p2pnode.http import make_registry

    peer = Identity.generate()
    forged = msgspec.structs.replace(envelope(peer, 6), sig=bytes(64))
    assert (await post(client, msg(peer, [forged]))).status_code == 422
    assert agent.metrics_registry._registry is None  # no scrape yet: not made
    text = (await client.get("/metrics")).text
    assert 'p2pnode_gossip_rejected_total{reason="bad_signature"} 1.0' in text
    eager = generate_latest(make_registry(agent.surfaces)).decode()
    names = [line.split(" ")[0] for line in text.splitlines()]
    assert names == [line.split(" ")[0] for line in eager.splitlines()]
    assert [ln for ln in text.splitlines() if "_total" in ln] == [ln for ln in eager.splitlines() if "_total" in ln]
