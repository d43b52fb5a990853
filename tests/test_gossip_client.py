"""The gossip client (h11 over kept-alive connections): concurrency, reuse, bounds and failures, against a real
hypercorn server on loopback."""

import functools
import socket

import pytest
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from p2pnode.drivers._gossip_client import GossipClient, GossipTransportError


def _app(reply: bytes):
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                if m["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif m["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        out = reply if reply else body  # echo by default
        headers = [(b"content-type", b"application/msgpack"), (b"content-length", str(len(out)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": out})
    return app


async def _server(nursery, reply: bytes = b"", keep_alive_s: float = 5.0) -> str:
    hc = HypercornConfig()
    hc.bind = ["127.0.0.1:0"]
    hc.keep_alive_timeout = keep_alive_s
    hc.accesslog = None
    binds = await nursery.start(serve, _app(reply), hc)
    return binds[0].removeprefix("http://")


async def test_concurrent_posts_share_and_expire_connections_without_races():
    async with trio.open_nursery() as n:
        addrs = [await _server(n) for _ in range(3)]
        client = GossipClient(max_reply_bytes=1 << 20, keepalive_s=60.0)
        for addr in addrs:  # one idle connection kept per address
            await client.post(addr, b"warm", 5.0)
        assert len(client._idle) == 3
        client.keepalive_s = 0.0  # now every call finds every kept connection expired, concurrently
        results = []

        async def one(i):
            r = await client.post(addrs[i % 3], f"hello {i}".encode(), 5.0)
            results.append((r.status_code, r.content_type, r.content))

        async with trio.open_nursery() as m:
            for i in range(40):
                m.start_soon(one, i)
        assert sorted(c for _, _, c in results) == sorted(f"hello {i}".encode() for i in range(40))
        assert {(s, t) for s, t, _ in results} == {(200, "application/msgpack")}
        await client.aclose()
        n.cancel_scope.cancel()


async def test_kept_connection_is_reused_and_a_closed_one_retried_once():
    async with trio.open_nursery() as n:
        addr = await _server(n, keep_alive_s=0.3)
        client = GossipClient(max_reply_bytes=1 << 20, keepalive_s=60.0)  # we keep it longer than the server
        assert (await client.post(addr, b"a", 5.0)).content == b"a"
        assert (await client.post(addr, b"b", 5.0)).content == b"b"
        assert client.connections_opened == 1  # reused
        await trio.sleep(0.8)  # the server closes the idle connection
        assert (await client.post(addr, b"c", 5.0)).content == b"c"  # retried on a fresh connection
        assert client.connections_opened == 2
        await client.aclose()
        n.cancel_scope.cancel()


async def test_an_oversized_reply_is_refused():
    async with trio.open_nursery() as n:
        addr = await _server(n, reply=b"x" * 5000)
        client = GossipClient(max_reply_bytes=4096)
        with pytest.raises(GossipTransportError, match="reply"):
            await client.post(addr, b"q", 5.0)
        assert not client._idle  # the connection was dropped, never reused
        n.cancel_scope.cancel()


async def test_refused_and_undialable_addresses_are_transport_errors():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = GossipClient(max_reply_bytes=1024)
    with pytest.raises(GossipTransportError):
        await client.post(f"127.0.0.1:{port}", b"q", 5.0)
    with pytest.raises(GossipTransportError):
        await client.post("127.0.0.1:99999", b"q", 5.0)


async def test_a_silent_peer_times_out():
    async with trio.open_nursery() as n:
        serve_silently = functools.partial(trio.serve_tcp, lambda stream: trio.sleep_forever(), 0, host="127.0.0.1")
        listener = (await n.start(serve_silently))[0]
        port = listener.socket.getsockname()[1]
        client = GossipClient(max_reply_bytes=1024)
        with trio.fail_after(5):
            with pytest.raises(GossipTransportError, match="no reply"):
                await client.post(f"127.0.0.1:{port}", b"q", 0.3)
        n.cancel_scope.cancel()
