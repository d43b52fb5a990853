"""A fake gang rank against real agents (issue 37, attack 4): a member gossips signed snapshots whose jobs section
lists a running "rank 0" of a real gang's id (under the gang's own job id, and under another). The leader ignores
the claims (the plan never gave that node that slot), counts them against the member in ``GET /jobs``, and the real
gang keeps running: the same job ids, started once, while the claims are counted plan after plan."""

import threading

import httpx
import pytest
from agents import AgentProc, free_port, wait_until
from attack import Attacker
from roles import MODES, Trust
from test_gangs_cluster import CATALOG, ENV, _members

pytestmark = pytest.mark.slow

PLANS = 8
"""Plans that must see (and ignore) the fake's claim while the gang holds: the leader plans every second."""


def _fake_reports(gang: dict, template: str) -> list[dict]:
    """Rank 0 of the real gang, under its real id (rank 0's job id) and under an id of the fake's own."""
    slot = dict(gang, rank=0)
    term = int(gang["id"].split("-")[0])
    return [{"job_id": gang["id"], "template": template, "term": term, "gang": slot},
            {"job_id": f"{term}-999", "template": template, "term": term, "gang": slot}]


@pytest.mark.parametrize("mode", MODES)
def test_a_fake_rank_0_does_not_end_a_real_gang_and_is_named(tmp_path, mode):
    """``token``: the fake holds the cluster token (a rented box with the keyring): an insider; ``operator-key``:
    as well, with an operator key pinned and the real nodes certified (the fake is not)."""
    trust = Trust(mode)
    env = dict(ENV, **trust.env())
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(CATALOG)
    ports = [free_port() for _ in range(3)]
    agents = []
    stop = threading.Event()
    thread = None
    for i, port in enumerate(ports):
        args = ["--no-mdns", "--catalog", str(catalog)] + (["--join", f"127.0.0.1:{ports[0]}"] if i else [])
        trust.certify(tmp_path / f"n{i}", ("voter", "lead"))
        agents.append(AgentProc(tmp_path / f"n{i}", port, *args, env=env).start())
    try:
        for a in agents:
            a.wait_ready()

        def whole():
            ms = _members(agents)
            return len(ms) == 3 and len({j["gang"]["id"] for _, j in ms}) == 1 and ms

        ms = wait_until(whole, 60, interval=0.5, what="a gang of 3 running")
        gang = next(j["gang"] for _, j in ms if j["gang"]["rank"] == 0)
        gid, jobs, pids = gang["id"], {j["job_id"] for _, j in ms}, {j["job_id"]: j["pid"] for _, j in ms}
        leader_id = wait_until(lambda: agents[0].status()["election"]["leader"], 20, what="a leader")
        leader = next(a for a in agents if a.get("/healthz")["node_id"] == leader_id)

        att = Attacker(token=trust.token)
        running = _fake_reports(gang, "gang-echo")

        def gossip():
            while not stop.is_set():
                snap = att.snapshot(jobs={"running": running, "running_count": len(running)})
                for a in agents:
                    try:
                        att.post(a.url, [att.envelope(snap)])
                    except httpx.HTTPError:
                        pass
                stop.wait(0.3)

        thread = threading.Thread(target=gossip, daemon=True)
        thread.start()

        def claims():
            mine = [c for c in leader.get("/jobs")["suspicious_claims"] if c["member"] == att.node_id]
            return {(c["job_id"], c["gang"], c["rank"]): c["count"] for c in mine}

        def held():
            """The gang whole with the same members throughout, until the fake's claim was ignored in PLANS plans."""
            ms = whole()
            assert ms and {j["job_id"] for _, j in ms} == jobs and {j["gang"]["id"] for _, j in ms} == {gid}, ms
            assert {j["job_id"]: j["pid"] for _, j in ms} == pids  # started once: the same processes
            c = claims()
            return len(c) == 2 and min(c.values()) >= PLANS and c

        seen = wait_until(held, 90, interval=0.5, what=f"the fake's claims ignored in {PLANS} plans, the gang whole")
        assert set(seen) == {(gid, gid, 0), (f"{gid.split('-')[0]}-999", gid, 0)}, seen
        ends = [a.get("/jobs")["gang_ends"] for a in agents]
        assert not any(ends), ends
        ended = [h for a in agents for h in a.get("/jobs")["history"] if h["job_id"] in jobs and h.get("ended_at")]
        assert not ended, ended
        assert leader.get("/jobs")["claims_ignored"]["gang_claim_unplanned"] >= 2 * PLANS
        for a in agents:  # /jobs gangs shows the slots the plan gave, not the fake's
            view = next(g for g in a.get("/jobs", timeout=10)["gangs"] if g["id"] == gid)
            assert view["whole"] and {m["job_id"] for m in view["members"]} == jobs, view
            assert att.node_id not in {m["node_id"] for m in view["members"]}
        metrics = httpx.get(f"{leader.url}/metrics", timeout=5, trust_env=False).text
        assert 'p2pnode_claims_ignored_total{reason="gang_claim_unplanned"}' in metrics
        print(f"[gang-claims] {mode}: a fake rank 0 ignored in {min(seen.values())} plans; the gang {gid} held whole")
    finally:
        stop.set()
        if thread is not None:
            thread.join(10)
        for a in agents:
            a.stop()
