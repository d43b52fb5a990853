"""Views encoded once per change (issue 43, item 2): ``/status`` and ``/members`` carry a strong ``ETag`` that changes
when a member joins, gets a newer snapshot or changes state, and not otherwise; a request holding the current tag
gets a bodiless 304, only once its authentication passed; ``/members`` pages by id (``?limit=&after=``) cover
every member exactly once while members join; hostile query values and ``If-None-Match`` headers are refused or
ignored, counted. The in-process agent is called through ASGITransport (no sockets, no sleeps)."""

import httpx
import pytest
from helpers import envelope
from test_http import app_of, demo_agent, msg, post

from p2pnode.identity import Identity
from p2pnode.inputs import InputError, if_none_match

READ = "read-only-token-for-the-views"


@pytest.fixture
async def agent(tmp_path):
    return demo_agent(tmp_path)


@pytest.fixture
async def client(agent):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(agent)), base_url="http://node") as c:
        yield c


async def _join(client, ident, version=1):
    r = await post(client, msg(ident, [envelope(ident, version)]))
    assert r.status_code == 200


async def test_members_etag_changes_on_a_join_a_new_version_and_a_state_change_and_not_otherwise(agent, client):
    first = await client.get("/members")
    tag = first.headers["etag"]
    assert first.status_code == 200 and first.headers["cache-control"] == "no-cache"
    assert tag.startswith('"') and tag.endswith('"') and not tag.startswith("W/")
    again = await client.get("/members")
    assert again.headers["etag"] == tag and again.content == first.content  # nothing changed: same bytes, same tag
    held = await client.get("/members", headers={"if-none-match": tag})
    assert held.status_code == 304 and held.content == b"" and held.headers["etag"] == tag

    peer = Identity.generate()
    await _join(client, peer, 3)  # a member joins
    joined = await client.get("/members", headers={"if-none-match": tag})
    assert joined.status_code == 200 and joined.headers["etag"] != tag
    assert {m["id"] for m in joined.json()["members"]} == {agent.node_id, peer.node_id}
    tag = joined.headers["etag"]
    assert (await client.get("/members", headers={"if-none-match": tag})).status_code == 304

    await _join(client, peer, 4)  # a newer snapshot of it
    newer = await client.get("/members", headers={"if-none-match": tag})
    assert newer.status_code == 200 and newer.headers["etag"] != tag
    assert {m["id"]: m["version"] for m in newer.json()["members"]}[peer.node_id] == 4
    tag = newer.headers["etag"]

    inc = agent.core.membership.members[peer.node_id].incarnation
    assert agent.core.membership.probe_failed(peer.node_id, inc, agent.now())  # it turns suspect here
    suspect = await client.get("/members", headers={"if-none-match": tag})
    assert suspect.status_code == 200 and suspect.headers["etag"] != tag
    assert {m["id"]: m["state"] for m in suspect.json()["members"]}[peer.node_id] == "suspect"
    assert (await client.get("/members", headers={"if-none-match": suspect.headers["etag"]})).status_code == 304


async def test_status_is_tagged_and_answers_304_until_a_member_joins(agent, client):
    first = await client.get("/status")
    body = first.json()
    assert [m["id"] for m in body["members"]] == [agent.node_id] and "age_s" not in body["members"][0]
    assert body["members"][0]["received_at"] > 0 and body["node"]["started_at"] > 0
    tag = first.headers["etag"]
    held = await client.get("/status", headers={"if-none-match": tag})
    assert held.status_code == 304 and held.content == b""
    await _join(client, Identity.generate())
    joined = await client.get("/status", headers={"if-none-match": tag})
    assert joined.status_code == 200 and joined.headers["etag"] != tag and len(joined.json()["members"]) == 2
    metrics = (await client.get("/metrics")).text
    assert "p2pnode_http_not_modified_total 1.0" in metrics
    assert 'p2pnode_http_view_inputs_refused_total{reason="if_none_match"} 0.0' in metrics
    again = await client.get("/status", headers={"if-none-match": joined.headers["etag"]})
    assert again.status_code == 304  # its own 304s are not in the view: a poller holding the tag keeps getting 304


@pytest.mark.parametrize("header", ["W/{t}", '"other", {t}', '  {t} , "x"', "*", 'W/"x", W/{t}'])
async def test_if_none_match_forms_that_hold_the_tag(client, header):
    tag = (await client.get("/members")).headers["etag"]
    r = await client.get("/members", headers={"if-none-match": header.replace("{t}", tag)})
    assert r.status_code == 304


@pytest.mark.parametrize("header", ['"other"', "W/other", 'x"y', '"a" "b"', ",", '"a",', "", "W/",
                                    '"' + "a" * 5000 + '"', ", ".join(f'"{i}"' for i in range(40))])
async def test_if_none_match_that_does_not_hold_the_tag_gets_the_whole_view(agent, client, header):
    r = await client.get("/members", headers={"if-none-match": header})
    assert r.status_code == 200 and r.json()["members"][0]["id"] == agent.node_id
    views = (await client.get("/status")).json()["gossip"]["http_views"]
    assert views["if_none_match_ignored"] == (0 if header in ('"other"',) else 1)


def test_the_if_none_match_decoder():
    assert if_none_match(None) is None
    assert if_none_match("*") == frozenset({"*"}) and if_none_match(' "*" ') == frozenset({'"*"'})  # a tag "*"
    assert if_none_match('W/"a", "b",W/"c"') == frozenset({'"a"', '"b"', '"c"'})
    assert if_none_match('"\x80\xff"') == frozenset({'"\x80\xff"'})  # obs-text, as Starlette decodes latin-1
    for bad in ("", " ", "a", '"a', '"a"b', '"a",', ',"a"', '"a" "b"', 'w/"a"', '"a\x7f"', '"a\x00"', '"sp ace"',
                '"' + "a" * 4100 + '"', ",".join(['"a"'] * 2 + [f'"{i}"' for i in range(33)])):
        with pytest.raises(InputError):
            if_none_match(bad)


async def test_304_only_after_the_request_is_authenticated(tmp_path):
    a = demo_agent(tmp_path, agent={"data_dir": tmp_path, "port": 0, "read_token": READ})
    bearer = {"authorization": f"Bearer {READ}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(a)), base_url="http://node") as c:
        for path in ("/members", "/status", "/members?limit=1"):
            tag = (await c.get(path, headers=bearer)).headers["etag"]
            anon = await c.get(path, headers={"if-none-match": tag})
            assert anon.status_code == 401 and "etag" not in anon.headers and anon.json()["error"] == "unauthorized"
            star = await c.get(path, headers={"if-none-match": "*", "authorization": "Bearer wrong"})
            assert star.status_code == 401
            # /status shows the refusals (``read_refusals``): its tag moved; /members' did not
            assert ((await c.get(path, headers=bearer)).headers["etag"] == tag) is path.startswith("/members")
            tag = (await c.get(path, headers=bearer)).headers["etag"]
            assert (await c.get(path, headers={"if-none-match": tag, **bearer})).status_code == 304
    assert a.trust.read_refusals == 6


async def test_pages_cover_every_member_exactly_once_while_members_join(agent, client):
    before = [Identity.generate() for _ in range(30)]
    for ident in before:
        await _join(client, ident)
    seen: list[str] = []
    joined: list[str] = []
    after = None
    for _ in range(100):
        r = await client.get("/members", params={"limit": 7, **({"after": after} if after else {})})
        assert r.status_code == 200
        page = r.json()
        assert 0 < len(page["members"]) <= 7
        seen += [m["id"] for m in page["members"]]
        for _ in range(2):  # members join between the pages
            ident = Identity.generate()
            await _join(client, ident)
            joined.append(ident.node_id)
        if page["next"] is None:
            break
        assert page["next"] == seen[-1]
        after = page["next"]
    assert len(seen) == len(set(seen)) and seen == sorted(seen)  # never twice, in id order
    assert {agent.node_id, *(i.node_id for i in before)} <= set(seen)  # every member held throughout: once
    late = set(seen) - {agent.node_id, *(i.node_id for i in before)}
    assert late <= set(joined)  # the others joined meanwhile (those whose ids sort after the cursor)
    whole = (await client.get("/members")).json()
    assert whole["next"] is None and len(whole["members"]) == 1 + len(before) + len(joined)
    past = (await client.get("/members", params={"after": "~", "limit": 5})).json()
    assert past == {"members": [], "next": None}


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=-1", "limit=abc", "limit=%C2%B2", "limit=1.5",
                                   "limit=" + "9" * 400, "after=", "after=" + "a" * 65, "after=%00x",
                                   "limit=1&limit=2", "after=a&after=b", "nope=1"])
async def test_hostile_members_queries_are_400_with_a_reason_and_counted(client, query):
    r = await client.get("/members?" + query)
    assert r.status_code == 400 and r.json()["error"] in ("invalid", "malformed") and r.json()["detail"]
    refused = (await client.get("/status")).json()["gossip"]["http_views"]["queries_refused"]
    assert sum(refused.values()) == 1 and set(refused) == {r.json()["error"]}


async def test_members_etag_moves_with_the_operators_eligibility_mark(agent, client):
    peer = Identity.generate()
    await _join(client, peer)
    before = await client.get("/members")
    assert {m["id"]: m["eligible"] for m in before.json()["members"]}[peer.node_id] is True
    assert agent.change_eligibility(peer.node_id, "ineligible")  # nothing in its snapshot changed
    after = await client.get("/members", headers={"if-none-match": before.headers["etag"]})
    assert after.status_code == 200 and after.headers["etag"] != before.headers["etag"]
    assert {m["id"]: m["eligible"] for m in after.json()["members"]}[peer.node_id] is False
