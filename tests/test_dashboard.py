"""The dashboard without a browser: the page and its assets over HTTP (ASGITransport, no sockets), the fields of
``/ui/state`` the page reads, the read rule in token mode, and the pure series and totals."""

import re
import time
from pathlib import Path

import httpx
import pytest
from test_http import TOKEN, app_of, demo_agent

from p2pnode.http._ui import STATIC_FILES, STATIC_PATHS
from p2pnode.series import ClusterSeries, SeriesPoint, cluster_point, cluster_totals
from p2pnode.snapshot import SCHEMA_VERSION, GpuInfo, JobReport, PlanRef, Resources, Snapshot, jobs_section

STATIC = Path(__file__).resolve().parent.parent / "p2pnode" / "http" / "static"
GIB = 1 << 30
READ = "read-only-token-for-the-dashboard"


async def _client(agent):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(agent)), base_url="http://node")


async def test_page_and_assets_are_served_with_their_types_and_a_strict_policy(tmp_path):
    a = demo_agent(tmp_path)
    async with await _client(a) as c:
        for path in ("/", "/ui"):
            r = await c.get(path)
            assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
            assert 'src="ui/app.js"' in r.text and 'href="ui/style.css"' in r.text
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
            assert r.headers["x-content-type-options"] == "nosniff"
        js = await c.get("/ui/app.js")
        assert js.status_code == 200 and js.headers["content-type"] == "text/javascript; charset=utf-8"
        css = await c.get("/ui/style.css")
        assert css.status_code == 200 and css.headers["content-type"] == "text/css; charset=utf-8"
        assert js.content == (STATIC / "app.js").read_bytes()
        assert (await c.get("/ui/nothing.js")).status_code == 404


def test_the_package_ships_every_static_file_and_the_page_reaches_no_other_origin():
    assert sorted(p.name for p in STATIC.iterdir()) == sorted(STATIC_FILES)
    html = (STATIC / "index.html").read_text()
    js = (STATIC / "app.js").read_text()
    css = (STATIC / "style.css").read_text()
    # No CDN, no web font, no inline script or style (the policy forbids them anyway).
    assert not re.search(r"(src|href)=\"(https?:)?//", html)
    assert "<style" not in html and " style=" not in html and re.search(r"<script>", html) is None
    assert "url(" not in css and "@import" not in css
    assert re.findall(r"https?://[^\"' ]+", js) == ["http://www.w3.org/2000/svg"]
    assert ".innerHTML" not in js and "eval(" not in js
    # Every element the script looks up by id exists on the page.
    ids = set(re.findall(r'id="([^"]+)"', html))
    assert set(re.findall(r'\$\("([^"]+)"\)', js)) <= ids
    assert set(re.findall(r'fill\("([^"]+)"', js)) <= ids
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert '"p2pnode.http" = ["static/*"]' in text


async def test_ui_state_has_what_the_page_reads(tmp_path):
    a = demo_agent(tmp_path)
    now = time.time()
    for i in range(3):
        a.series.record(now + i, (m.snapshot for m in a.members(live=True)), a.core.view.leader)
    async with await _client(a) as c:
        r = await c.get("/ui/state")
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        s = r.json()
        members = (await c.get("/members")).json()["members"]  # the page's member rows: GET /members
    assert set(s) >= {"now", "node", "cluster", "totals", "jobs", "sync", "events", "series"}
    assert "members" not in s  # served apart, with an ETag (tests/test_viewcache.py)
    assert set(s["node"]) >= {"id", "addr", "agent_version", "uptime_s", "trust", "read_protected"}
    assert set(s["cluster"]) >= {"leader", "term", "quorum", "voters", "votes_for_leader", "members_by_state"}
    assert set(s["totals"]) >= {"members", "gpus_total", "gpus_busy", "gpu_util_percent", "vram_used_bytes",
                                "vram_total_bytes", "cpus", "cpu_percent", "mem_used_bytes", "mem_total_bytes",
                                "jobs_running"}
    (m,) = members
    assert m["id"] == a.node_id and m["self"] is True and m["state"] == "alive"
    assert set(m) >= {"addr", "incarnation", "resources", "power_score", "level", "level_name", "reasons", "tags",
                      "sync", "running_count", "leader", "voter", "received_at", "gpus_full", "leaving"}
    assert s["now"] - 60 < m["received_at"] <= s["now"]
    assert set(s["jobs"]) >= {"running", "running_total", "running_counts", "pending", "plan", "refused", "refusing"}
    assert set(s["sync"]) >= {"replication_factor", "r_effective", "durable_members", "files", "below_r"}
    assert s["series"]["fields"][0] == "t" and len(s["series"]["points"]) == 3
    assert s["totals"]["members"] == 1 and s["totals"]["cpus"] == m["resources"]["cpu_count"]
    async with await _client(a) as c:
        newest = s["series"]["points"][-2][0]
        assert len((await c.get(f"/ui/state?since={newest}")).json()["series"]["points"]) == 1
        assert len((await c.get("/ui/state?since=nan")).json()["series"]["points"]) == 3  # ignored
        assert len((await c.get("/ui/series")).json()["points"]) == 3


async def test_ui_state_without_a_catalog_has_no_jobs(tmp_path):
    from p2pnode.agent import Agent
    from p2pnode.config import load_config

    a = Agent(load_config(None, env={}, overrides={"agent": {"data_dir": tmp_path, "port": 0,
                                                             "fake_gpus": "H100,RTX 4090"},
                                                   "discovery": {"mdns": False}}))
    a.sample()
    a.publish()
    async with await _client(a) as c:
        s = (await c.get("/ui/state")).json()
        (m,) = (await c.get("/members")).json()["members"]
    assert s["jobs"] is None and s["totals"]["gpus_total"] == 2
    assert s["totals"]["vram_total_bytes"] == sum(g["mem_total_bytes"] for g in m["resources"]["gpus"])


async def test_read_token_guards_the_data_not_the_page(tmp_path):
    a = demo_agent(tmp_path, agent={"data_dir": tmp_path, "port": 0, "trust": "token", "cluster_token": TOKEN,
                                    "read_token": READ})
    async with await _client(a) as c:
        for path in sorted(STATIC_PATHS):
            assert (await c.get(path)).status_code == 200, path
        for path in ("/ui/state", "/ui/series"):
            r = await c.get(path)
            assert r.status_code == 401 and r.json()["error"] == "unauthorized"
            assert (await c.get(path, headers={"authorization": "Bearer wrong"})).status_code == 401
            ok = await c.get(path, headers={"authorization": f"Bearer {READ}"})
            assert ok.status_code == 200
        s = (await c.get("/ui/state", headers={"authorization": f"Bearer {READ}"})).json()
        assert s["node"]["read_protected"] is True and s["node"]["trust"] == "token"
        assert READ not in str(s) and TOKEN not in str(s)
    assert a.trust.read_refusals == 4


# -- the pure part ---------------------------------------------------------------------------------------------------

def snap(origin, gpus=(), running=(), cpus=8, cpu_percent=50.0, plan=None):
    res = Resources(cpu_count=cpus, cpu_percent=cpu_percent, mem_total_bytes=64 * GIB, mem_used_bytes=16 * GIB,
                    gpus=[GpuInfo(index=i, name="H100", util_percent=u, mem_used_bytes=used * GIB,
                                  mem_total_bytes=80 * GIB) for i, (u, used) in enumerate(gpus)])
    reports = [JobReport(job_id=f"{origin}-{k}", template="t", gpus=list(g)) for k, g in enumerate(running)]
    return Snapshot(schema=SCHEMA_VERSION, origin=origin, version=1, addr="", tags=[], leaving=False, resources=res,
                    jobs=jobs_section(reports), plan=plan)


def test_cluster_totals_sum_the_snapshots():
    a = snap("a", gpus=[(0.0, 0), (95.0, 70), (5.0, 1)], running=[[0]], cpus=16, cpu_percent=25.0)
    b = snap("b", gpus=[(50.0, 40)], cpus=48, cpu_percent=75.0, plan=PlanRef(term=3, pending=4))
    c = snap("c", running=[[]] * 40)  # more than INLINE_RUNNING jobs: carried by count only
    t = cluster_totals([a, b, c])
    assert t.members == 3 and t.gpus_total == 4
    assert t.gpus_busy == 2 + 1  # a: GPU 0 held by a job, GPU 1 at 95 %; GPU 2 idle at 5 %; b: 50 %
    assert t.gpu_util_percent == 37.5
    assert t.vram_used_bytes == 111 * GIB and t.vram_total_bytes == 320 * GIB
    assert t.cpus == 72 and t.cpu_percent == round((16 * 25 + 48 * 75 + 8 * 50) / 72, 2)
    assert t.mem_total_bytes == 3 * 64 * GIB and t.mem_used_bytes == 3 * 16 * GIB
    assert t.jobs_running == 1 + 40
    p = cluster_point(100.0, [a, b, c], leader="b")
    assert (p.jobs_pending, p.jobs_running, p.members, p.gpus_busy) == (4, 41, 3, 3)
    assert p.vram_used_percent == round(100 * 111 / 320, 2)
    assert cluster_point(100.0, [a, b, c], leader=None).jobs_pending == 0
    assert cluster_totals([]).gpu_util_percent == 0.0


def test_series_is_a_bounded_ring_one_point_per_step():
    s = ClusterSeries(capacity=5, step_s=1.0)
    added = [s.add(SeriesPoint(t=t / 4)) for t in range(40)]  # four points a second for 10 s
    assert sum(added) == 10 and s.dropped == 30 and len(s) == 5
    assert [p.t for p in s.points()] == [5.0, 6.0, 7.0, 8.0, 9.0]
    assert [p.t for p in s.points(since=7.0)] == [8.0, 9.0] and s.points(since=9.0) == []
    assert not s.add(SeriesPoint(t=3.0))  # a wall clock stepped back: the series stays ordered
    v = s.view(since=8.0)
    assert v["window_s"] == 5.0 and v["points"] == [[9.0, 0.0, 0, 0, 0.0, 0.0, 0, 0, 0]]
    assert s.record(10.0, [snap("a", gpus=[(100.0, 8)])], None) and s.points()[-1].gpus_busy == 1
    assert not s.record(10.5, [], None)
    with pytest.raises(ValueError):
        ClusterSeries(capacity=0)


def test_the_readme_shows_a_screenshot_of_the_page():
    root = Path(__file__).resolve().parent.parent
    assert (root / "docs" / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "](docs/dashboard.png)" in (root / "README.md").read_text()
    assert "](dashboard.png)" in (root / "docs" / "dashboard.md").read_text()
