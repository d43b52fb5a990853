"""The dashboard in a real browser: headless Chromium (Debian's ``chromium``) driven by Playwright opens the page of
a 3-agent loopback cluster, sees every member, the leader and running jobs, sees a new job start and a killed
member turn suspect or dead without a reload, logs no JavaScript error, and leaves screenshots in the test's tmp
dir. Never ``playwright install`` (it downloads browsers): the test uses the system's Chromium or skips."""

import shutil
import signal
import time

import pytest
from agents import AgentProc, free_port, wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
except ImportError:
    sync_playwright = None

# Checked before any agent starts.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: install Debian's chromium (apt-get install chromium); "
                                                "the test never downloads a browser"),
    pytest.mark.skipif(sync_playwright is None, reason="the playwright package is not installed (pip install "
                                                       "playwright, in the test extra; never `playwright install`)"),
]
GPUS = ["H100", "A100", "RTX 4090"]
ENV = {
    "P2PNODE_GOSSIP_PROFILE": "local-test",
    "P2PNODE_SCHEDULER_INTERVAL_S": "1",
    "P2PNODE_CPU_MAX_PERCENT": "0",
    "P2PNODE_CPU_WARN_PERCENT": "100",
}
# Short jobs (a new one starts every few seconds), and one template no node can hold (pending, with its reason).
CATALOG = """
[[job]]
name = "work"
kind = "selfplay"
config = "c1"
argv = ["{python}", "-c", "import time; time.sleep(5)"]
max_concurrency = 4
max_runtime_s = 60
env = ["PATH"]
[job.resources]
num_gpus = 0.5
vram_gib = 2

[[job]]
name = "too-big"
kind = "training"
config = "c2"
argv = ["{python}", "-c", "pass"]
max_runtime_s = 60
env = ["PATH"]
[job.resources]
num_gpus = 1
vram_gib = 4000
"""


@pytest.fixture
def three(tmp_path):
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG)
    ports = [free_port() for _ in GPUS]
    procs = []
    for i, gpu in enumerate(GPUS):
        args = ["--no-mdns", "--fake-gpus", gpu, "--catalog", str(cat)]
        if i:
            args += ["--join", f"127.0.0.1:{ports[0]}"]
        procs.append(AgentProc(tmp_path / f"n{i}", ports[i], *args, env=ENV).start())
    try:
        for p in procs:
            p.wait_ready()
        yield procs
    finally:
        for p in procs:
            p.kill()


def test_dashboard_in_chromium_follows_the_cluster(three, tmp_path):
    ids = [p.status()["node"]["id"] for p in three]
    shots = tmp_path / "screenshots"
    shots.mkdir()
    errors: list[str] = []
    t0 = time.monotonic()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url} {r.failure}"))
            asked: list[str | None] = []  # the page asks /members with the ETag it holds (304: the table stays)
            page.on("request", lambda r: asked.append(r.headers.get("if-none-match"))
                    if r.url.split("?")[0].endswith("/members") else None)
            page.goto(three[0].url + "/", wait_until="load")
            assert page.title().startswith("p2pnode")

            # Every member alive, the leader named in the header and marked in the table.
            page.wait_for_function(
                "ids => ids.every(id => "
                "document.querySelector(`#members tr[data-node-id='${id}'][data-state='alive']`))",
                arg=ids, timeout=20_000)
            page.wait_for_function("() => document.getElementById('leader').dataset.nodeId", timeout=20_000)
            leader = page.get_attribute("#leader", "data-node-id")
            assert leader in ids and three[0].status()["election"]["leader"] == leader
            assert page.locator(f"#members tr[data-node-id='{leader}'] .mark.leader").count() == 1
            assert page.locator("#members tbody tr").count() == 3
            assert page.locator("#conn").get_attribute("data-state") == "live"

            # A running job appears; then a job that was not on the page starts and appears without a reload.
            page.wait_for_selector("#running tr[data-job-id]", timeout=20_000)
            seen = set(page.eval_on_selector_all("#running tr[data-job-id]", "rs => rs.map(r => r.dataset.jobId)"))
            try:
                page.wait_for_function(
                    "seen => [...document.querySelectorAll('#running tr[data-job-id]')]"
                    ".some(r => !seen.includes(r.dataset.jobId))", arg=list(seen), timeout=40_000)
            except PlaywrightTimeout:  # say what the cluster did meanwhile: a stalled page, or no new job at all?
                jobs = [{k: p.get("/jobs").get(k) for k in ("running", "pending", "offer", "waiting", "refused")}
                        for p in three]
                raise AssertionError(f"no new job on the page in 40 s; seen {sorted(seen)}; agents: {jobs}; "
                                     f"page errors: {errors}") from None
            page.wait_for_selector("#pending tbody td.reason", timeout=10_000)  # too-big: pending, with its reason
            page.wait_for_function("() => document.querySelectorAll('#plot-jobs polyline').length === 2",
                                   timeout=10_000)
            gpus = page.locator("#totals .card").nth(1).inner_text()
            assert "/ 3" in gpus, gpus  # GPUs busy / total: one fake GPU per node
            page.screenshot(path=str(shots / "1-cluster.png"), full_page=True)

            # Kill a member that neither serves the page nor leads: it turns suspect, then dead, on the page.
            victim = next(i for i in (2, 1) if ids[i] != leader)
            three[victim].stop(signal.SIGKILL)
            page.wait_for_function(
                "id => ['suspect', 'dead'].includes("
                "document.querySelector(`#members tr[data-node-id='${id}']`)?.dataset.state)",
                arg=ids[victim], timeout=20_000)
            page.screenshot(path=str(shots / "2-member-suspect.png"), full_page=True)
            try:
                page.wait_for_function(
                    "id => document.querySelector(`#members tr[data-node-id='${id}']`)?.dataset.state === 'dead'",
                    arg=ids[victim], timeout=10_000)
                page.screenshot(path=str(shots / "3-member-dead.png"), full_page=True)
            except Exception:  # suspect long enough to be seen is what the page must show; dead may take longer
                pass
            else:  # a dead member's last readings are not shown as its GPUs' state: no bars, the models only
                row = f"#members tr[data-node-id='{ids[victim]}']"
                assert page.locator(f"{row} .bar").count() == 0
                assert "×" in page.locator(f"{row} td").nth(3).inner_text()
            state = page.get_attribute(f"#members tr[data-node-id='{ids[victim]}']", "data-state")
            assert state in ("suspect", "dead")
            members = page.inner_text("#members-count")
            assert "alive" in members and ("suspect" in members or "dead" in members)
            assert asked[0] is None and any(tag and tag.startswith('"') for tag in asked[1:]), asked[:5]
        finally:
            browser.close()
    assert not errors, "\n".join(errors)
    assert sorted(p.name for p in shots.iterdir())[:2] == ["1-cluster.png", "2-member-suspect.png"]
    assert time.monotonic() - t0 < 60
    # For a person looking at a failed run: where the pictures are.
    print(f"screenshots in {shots}")


def test_dashboard_asks_for_the_read_token_in_chromium(tmp_path):
    """With ``agent.read_token`` set, the page loads, shows 'unauthorized' and a token form, and shows the cluster
    once the token is given (kept in the tab, sent as a bearer token)."""
    port = free_port()
    env = {**ENV, "P2PNODE_READ_TOKEN": "dashboard-read-token-0123"}
    agent = AgentProc(tmp_path / "n0", port, "--no-mdns", "--fake-gpus", "H100", env=env).start()
    try:
        wait_until(lambda: agent.get("/healthz")["status"] == "ok", 20, what="the agent")
        errors: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
                page.goto(agent.url + "/ui")
                page.wait_for_selector("#conn[data-state='unauthorized']", timeout=10_000)
                assert page.is_visible("#auth") and page.locator("#members tr[data-node-id]").count() == 0
                page.fill("#auth-token", "dashboard-read-token-0123")
                page.click("#auth button")
                page.wait_for_selector("#conn[data-state='live']", timeout=10_000)
                page.wait_for_selector("#members tr[data-node-id][data-state='alive']", timeout=10_000)
                assert not page.is_visible("#auth")
                page.screenshot(path=str(tmp_path / "token.png"))
            finally:
                browser.close()
        # The browser's own 401s are logged as console errors by Chromium; page (script) errors must be none.
        assert not errors, "\n".join(errors)
    finally:
        agent.kill()


FLEET = 1000
XSS = "<script>alert(1)</script>"


def _post_fleet(url: str, idents: list, names: list[str], bad: list) -> None:
    """Sign and post one snapshot of each fake member (the status bench's fixture, with a label and a role tag),
    200 per gossip POST, then of each of ``bad`` (a label with control characters), alone: refused (422)."""
    import httpx
    from member_cap import fake_snapshot

    from p2pnode.wire import encode_gossip, seal_snapshot

    envs = []
    for k, (ident, name) in enumerate(zip(idents, names, strict=True)):
        snap = fake_snapshot(ident, 1)
        snap["tags"] = [("voter", "durable", "ephemeral", "gpu")[k % 4]]
        snap["label"] = {"name": name, "provider": "vast.ai", "instance": f"C.{k}"}
        envs.append(seal_snapshot(ident, snap))
    with httpx.Client(trust_env=False, timeout=30) as c:
        for k in range(0, len(envs), 200):
            c.post(f"{url}/gossip", content=encode_gossip("x", "", {}, envs[k:k + 200]),
                   headers={"content-type": "application/msgpack"}).raise_for_status()
        for ident in bad:
            snap = fake_snapshot(ident, 1)
            snap["label"] = {"name": XSS + "\x07\x1b[31m"}
            r = c.post(f"{url}/gossip", content=encode_gossip("x", "", {}, [seal_snapshot(ident, snap)]),
                       headers={"content-type": "application/msgpack"})
            assert r.status_code == 422, r.status_code


def test_dashboard_shows_names_as_text_and_filters_a_1000_member_fleet(tmp_path):
    """A member named ``<script>alert(1)</script>`` (from a peer) is shown as that text, and the agent's own name
    given with control characters is shown without them: no dialog opens, no script element is added. A peer whose
    name holds control characters is refused by the decoder (never shown). At 1,000 members (the status bench's
    fixture) the page shows a summary by tier and state and at most 200 rows, and a typed filter redraws the rows
    within 1 s (measured in the page, from the input event to the redrawn table)."""
    import sys
    from pathlib import Path

    from p2pnode.identity import Identity

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    port = free_port()
    own = XSS + "\x07\x1b[31m" + "y" * 80
    agent = AgentProc(tmp_path / "n0", port, "--no-mdns", "--fake-gpus", "H100", "--name", own,
                      env={**ENV, "P2PNODE_ALLOW_PRIVATE_ADVERTISE": "1"}).start()
    try:
        wait_until(lambda: agent.get("/healthz")["status"] == "ok", 20, what="the agent")
        idents = [Identity.generate() for _ in range(FLEET - 1)]
        names = [XSS] + [f"gpu-{k:04d}" for k in range(1, FLEET - 1)]
        bad = [Identity.generate()]
        _post_fleet(agent.url, idents, names, bad)
        wait_until(lambda: len(agent.get("/members", timeout=10)["members"]) >= FLEET, 60,
                   what="1,000 members learned")
        members = {m["id"]: m for m in agent.get("/members", timeout=10)["members"]}
        assert bad[0].node_id not in members  # refused: its name holds control characters
        mine = [m for m in members.values() if m["self"]][0]
        assert mine["name"] == (XSS + "[31m" + "y" * 80)[:63]  # sent without controls, cut to 63
        assert members[idents[0].node_id]["name"] == XSS and members[idents[0].node_id]["instance"] == "C.0"
        dialogs: list[str] = []
        errors: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
                page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
                page.goto(agent.url + "/", wait_until="load")
                page.wait_for_selector("#members-summary tr[data-tier='voter']", timeout=30_000)
                assert page.locator("#members tr[data-node-id]").count() == 200
                assert "of 1000 shown" in page.text_content("#members-shown")
                total = page.evaluate("() => [...document.querySelectorAll('#members-summary td[data-state]')]"
                                      ".reduce((n, td) => n + Number(td.textContent), 0)")
                assert total == FLEET
                # The names: text, never markup.
                page.fill("#members-filter", "script")
                page.wait_for_function("() => document.querySelectorAll('#members tr[data-node-id]').length === 2",
                                       timeout=5_000)
                shown = page.eval_on_selector_all("#members td.node .name", "els => els.map((e) => e.textContent)")
                assert sorted(shown) == sorted([XSS, mine["name"]])
                assert page.locator("#members script").count() == 0
                # A filter at 1,000 members: from the input event to the redrawn rows, measured in the page.
                ms = page.evaluate("""() => {
                    const f = document.getElementById('members-filter');
                    const t0 = performance.now();
                    f.value = 'gpu-0042';
                    f.dispatchEvent(new Event('input'));
                    const n = document.querySelectorAll('#members tr[data-node-id]').length;
                    return n === 1 ? performance.now() - t0 : -n;
                }""")
                assert 0 <= ms < 1000, ms
                page.fill("#members-filter", "suspect")  # by state: none are
                page.wait_for_selector("#members td.none", timeout=5_000)
                page.fill("#members-filter", "")
                page.wait_for_function("() => document.querySelectorAll('#members tr[data-node-id]').length === 200",
                                       timeout=5_000)
                page.screenshot(path=str(tmp_path / "fleet.png"))
                print(f"filter applied at {FLEET} members in {ms:.1f} ms")
            finally:
                browser.close()
        assert not dialogs, dialogs
        assert not errors, "\n".join(errors)
    finally:
        agent.kill()
