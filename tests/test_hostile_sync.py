"""Hostile input to sync, replayed against real agent processes on 127.0.0.1 (issue 12, findings 7, 8, 11, 13).

One durable agent ``d`` and one ephemeral member ``e`` serve the module. The test process holds ``e``'s node key
(read from its data dir), so it can also sign requests as that member, as a member gone rogue would.
"""

import base64
import os
import socket
import sys
import threading
import time

import httpx
import psutil
import pytest
from agents import AgentProc, free_port, wait_until

from p2pnode.identity import load_or_create_identity
from p2pnode.inputs import decode_push_reply
from p2pnode.sync import PushItem, ReplicaStore, encode_push, sign_headers
from p2pnode.sync._store import FREE_SPACE_MARGIN_BYTES
from p2pnode.sync._wire import encode_stream_header
from p2pnode.synccore import Manifest, hash_block

pytestmark = pytest.mark.slow

MiB = 2**20
RSS_BOUND_BYTES = 100 * MiB
"""docs/sync.md: 24 concurrent hostile 40 MiB uploads raise a durable node's RSS by at most this."""
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SYNC_INTERVAL_S": "1"}


def start(tmp_path, name, tag, *join):
    p = AgentProc(tmp_path / name, free_port(), "--no-mdns", "--tag", tag,
                  *[a for j in join for a in ("--join", f"127.0.0.1:{j.port}")], env=ENV)
    return p.start()


def sync_status(p):
    return p.get("/sync/status")


def refused(p):
    return sync_status(p)["received"]["refused_requests"]


def node_id(p):
    return p.status()["node"]["id"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    d = start(tmp, "durable", "durable")
    e = None
    try:
        d.wait_ready()
        e = start(tmp, "eph", "ephemeral", d)
        e.wait_ready()
        wait_until(lambda: sync_status(e)["durable_members"] == 1, 15, what="the durable member known")
        ident = load_or_create_identity(e.data_dir)
        wait_until(lambda: any(m.get("id") == ident.node_id
                               for m in d.get("/members")["members"]), 15, what="d holds e's snapshot")
        d.data_port = sync_status(d)["data_port"]
        yield d, e, ident
    finally:
        for p in (e, d):
            if p is not None:
                p.kill()


def put(e, rel, size):
    dest = e.data_dir / "data" / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp"
    data = os.urandom(size)
    tmp.write_bytes(data)
    old = time.time() - 60
    os.utime(tmp, (old, old))
    os.replace(tmp, dest)
    return data


def replicated(d, e, rel):
    p = d.data_dir / "replicas" / node_id(e) / rel
    return p.read_bytes() if p.exists() else None


def trigger(p):
    httpx.post(p.url + "/sync/trigger", timeout=2, trust_env=False)


def forged_headers(ident):
    """Headers naming a real member, with a fresh time and a well-formed signature that verifies for nothing."""
    return {"x-p2pnode-origin": ident.node_id, "x-p2pnode-time": f"{time.time():.3f}",
            "x-p2pnode-signature": base64.b64encode(os.urandom(64)).decode()}


def log_tail(p, offset):
    with open(p.log, "rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")


# -- finding 7: bodies are not read before what the headers can prove is checked; large reads are capped ------

def upload(port, path, headers, total, *, chunked, first=b"", abort_after=None):
    """Send a POST of ``total`` bytes (``first``, then zeros) in 1 MiB pieces; return the status line or the
    error. ``abort_after``: close the socket after that many body bytes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    try:
        head = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/msgpack",
                *(f"{k}: {v}" for k, v in headers.items()),
                "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"]
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent = 0
        piece = first + bytes(MiB - len(first))
        while sent < total:
            n = min(MiB, total - sent, abort_after - sent if abort_after is not None else MiB)
            s.sendall(b"%x\r\n%s\r\n" % (n, piece[:n]) if chunked else piece[:n])
            sent += n
            piece = bytes(MiB)
            if abort_after is not None and sent >= abort_after:
                return "aborted"
        if chunked:
            s.sendall(b"0\r\n\r\n")
        return s.recv(4096).split(b"\r\n", 1)[0].decode()
    except OSError as exc:
        return f"error {exc.__class__.__name__}"
    finally:
        s.close()


def test_24_hostile_40_mib_uploads_raise_rss_by_a_small_bound(pair, capsys):
    d, e, ident = pair
    proc = psutil.Process(d.proc.pid)
    time.sleep(0.5)
    rss0 = proc.memory_info().rss
    before = refused(d)
    # the worst case for early signature checks: a length prefix whose "header" is the whole body
    prefix = (40 * MiB - 4).to_bytes(4, "big")
    jobs = ([dict(headers={}, chunked=True)] * 8  # no auth headers: refused before a byte of body is read
            + [dict(headers=forged_headers(ident), chunked=True, first=prefix)] * 8  # a member's name, forged
            + [dict(headers=forged_headers(ident), chunked=False, first=prefix)] * 8)
    results: list[str] = [""] * len(jobs)

    def run(i):
        results[i] = upload(d.port, "/sync/push", jobs[i]["headers"], 40 * MiB, chunked=jobs[i]["chunked"],
                            first=jobs[i].get("first", b""))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    peak = rss0
    while any(t.is_alive() for t in threads):
        peak = max(peak, proc.memory_info().rss)
        time.sleep(0.01)
    elapsed = time.monotonic() - t0
    growth = peak - rss0
    with capsys.disabled():
        print(f"\n[hostile push] 24 x 40 MiB uploads: RSS {rss0 / MiB:.0f} -> peak {peak / MiB:.0f} MiB "
              f"(+{growth / MiB:.0f} MiB, bound {RSS_BOUND_BYTES / MiB:.0f}) in {elapsed:.2f} s; {sorted(results)}",
              file=sys.stderr)
    assert growth <= RSS_BOUND_BYTES
    after = refused(d)
    assert after.get("bad_signature", 0) - before.get("bad_signature", 0) >= 8  # the 8 without headers at least
    assert not any(r.startswith("HTTP/1.1 200") for r in results)
    # those that passed the header check were refused for their signature or for the budget, never served
    assert sum(after.get(k, 0) - before.get(k, 0) for k in ("bad_signature", "overloaded")) >= 24 - sum(
        r.startswith("error") for r in results)
    assert d.get("/healthz")["status"] == "ok"
    # the budget is free again: a member's real push is served
    body = encode_push([])
    r = httpx.post(d.url + "/sync/push", content=body, trust_env=False, timeout=5,
                   headers={**sign_headers(ident, "POST", "/sync/push", body), "content-type": "application/msgpack"})
    assert r.status_code == 200 and decode_push_reply(r.content) == []


def test_pushes_beyond_the_body_budget_are_refused_at_once_with_retry_after(pair):
    d, e, ident = pair
    before = refused(d).get("overloaded", 0)
    holders = []
    try:
        for _ in range(2):  # two 40 MiB bodies declared, neither sent: 80 MiB > the 64 MiB budget
            s = socket.create_connection(("127.0.0.1", d.port), timeout=3)
            h = "".join(f"{k}: {v}\r\n" for k, v in forged_headers(ident).items())
            s.sendall(f"POST /sync/push HTTP/1.1\r\nHost: x\r\n{h}Content-Length: {40 * MiB}\r\n\r\n".encode())
            holders.append(s)
        time.sleep(0.3)
        refusal = holders[1].recv(4096)
        assert refusal.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in refusal.lower()
        assert refused(d).get("overloaded", 0) == before + 1
        t0 = time.monotonic()
        r = httpx.post(d.url + "/sync/push", content=bytes(30 * MiB), headers=forged_headers(ident),
                       trust_env=False, timeout=5)
        assert r.status_code == 503 and time.monotonic() - t0 < 2  # refused before its body was read
        metrics = httpx.get(d.url + "/metrics", trust_env=False, timeout=5).text
        line = next(x for x in metrics.splitlines() if x.startswith('p2pnode_sync_rejected_total{reason="overloaded"}'))
        assert float(line.split()[-1]) == before + 2
    finally:
        for s in holders:
            s.close()


# -- finding 11: aborted uploads are counted, not logged as tracebacks ---------------------------------------

def abort_uploads(d, jobs):
    """Run ``jobs`` (path, headers, declared length, bytes sent before hanging up, first bytes) from 8 threads;
    return the agent's log written meanwhile."""
    offset = d.log.stat().st_size
    results: list[str] = []
    lock = threading.Lock()

    def worker(part):
        for path, headers, total, cut, first in part:
            r = upload(d.port, path, headers, total, chunked=False, abort_after=cut, first=first)
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, args=(jobs[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("aborted") == len(jobs)
    time.sleep(0.5)
    return log_tail(d, offset)


def test_450_aborted_push_uploads_log_no_traceback(pair):
    """Half of finding 11's 900 aborted uploads: pushes naming a member, whose bodies are being read (the header
    they announce fills the body) when the client hangs up."""
    d, e, ident = pair
    before = refused(d).get("disconnected", 0)
    prefix = (4 * MiB - 4).to_bytes(4, "big")
    text = abort_uploads(d, [("/sync/push", forged_headers(ident), 4 * MiB, 256 * 1024, prefix)] * 450)
    assert "Traceback" not in text and "ClientDisconnect" not in text, text[-3000:]
    assert len(text) < 5_000, f"{len(text)} bytes of log for 450 aborted uploads"
    wait_until(lambda: refused(d).get("disconnected", 0) - before >= 400, 10, what="disconnects counted")
    assert d.get("/healthz")["status"] == "ok"


def test_450_aborted_gossip_uploads_log_no_traceback(pair):
    """The other half: ``POST /gossip`` bodies cut off (``_read_bounded`` turns the disconnect into a counted
    malformed body)."""
    d, e, ident = pair
    text = abort_uploads(d, [("/gossip", {}, 512 * 1024, 64 * 1024, b"")] * 450)
    assert "Traceback" not in text and "ClientDisconnect" not in text, text[-3000:]
    assert d.get("/healthz")["status"] == "ok"


# -- finding 8: idle sockets on the data port cannot block block streams ---------------------------------------

class IdleSockets:
    """``n`` connections to the data port that never send a byte; reopened as the receiver drops them."""

    def __init__(self, port, n):
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.opened = 0
        self.thread = threading.Thread(target=self.run)

    def run(self):
        socks = []
        while not self.stop.is_set():
            alive = []
            for s in socks:
                try:
                    gone = s.recv(4096, socket.MSG_DONTWAIT) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    s.close()
                else:
                    alive.append(s)
            socks = alive
            while len(socks) < self.n:
                socks.append(socket.create_connection(("127.0.0.1", self.port)))
                self.opened += 1
            time.sleep(0.05)
        for s in socks:
            s.close()

    def __enter__(self):
        self.thread.start()
        wait_until(lambda: self.opened >= self.n, 5, what="idle sockets open")
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def test_64_idle_sockets_on_the_data_port_do_not_stop_a_20_mb_file(pair):
    d, e, ident = pair
    streams0 = sync_status(d)["received"].get("streams", 0)
    slow0 = refused(d).get("too_slow", 0)
    with IdleSockets(d.data_port, 64):
        time.sleep(0.5)  # every one of them is waiting for a header when the stream arrives
        data = put(e, "cfg/idle.npz", 20 * MiB)
        t0 = time.monotonic()
        trigger(e)
        wait_until(lambda: replicated(d, e, "cfg/idle.npz") == data, 20, what="the 20 MB replica")
        elapsed = time.monotonic() - t0
        wait_until(lambda: refused(d).get("too_slow", 0) - slow0 >= 64, 10, what="idle sockets dropped after 2 s")
    assert sync_status(d)["received"]["streams"] > streams0  # it travelled over the channel, not around it
    print(f"20 MB replicated in {elapsed:.2f} s beside 64 idle data-port sockets")


def test_beyond_256_connections_waiting_for_a_header_the_oldest_are_dropped(pair):
    d, e, ident = pair
    over0 = refused(d).get("overloaded", 0)
    socks = [socket.create_connection(("127.0.0.1", d.data_port), timeout=5) for _ in range(320)]
    try:
        wait_until(lambda: refused(d).get("overloaded", 0) - over0 >= 64, 5, what="the oldest 64 dropped")
        assert socks[0].recv(16) == b""  # the oldest: closed by the receiver, without a word
        assert refused(d).get("overloaded", 0) - over0 == 64
        socks[-1].setblocking(False)
        with pytest.raises(BlockingIOError):
            socks[-1].recv(16)  # the newest still waits for its header
    finally:
        for s in socks:
            s.close()


def stall_streams(d, ident, n):
    """``n`` valid, signed block streams that take a slot and then send nothing (a rogue member, or slow ones)."""
    socks = []
    for i in range(n):
        data = os.urandom(4096)
        m = Manifest.build(len(data), 128 * 1024, hash_block(data))
        frame = encode_stream_header(ident, PushItem(f"stall/{i}.npz", m, 1), [(0, 1)])
        s = socket.create_connection(("127.0.0.1", d.data_port), timeout=5)
        s.sendall(frame)
        n_ = int.from_bytes(s.recv(4, socket.MSG_WAITALL), "big")
        assert b"ok" in s.recv(n_, socket.MSG_WAITALL)  # the go-ahead: this stream holds a slot now
        socks.append(s)
    return socks


def test_a_busy_data_channel_makes_the_sender_fall_back_to_http(pair):
    d, e, ident = pair
    fallbacks0 = sync_status(e)["sent"]["channel_fallbacks"]
    busy0 = refused(d).get("busy", 0)
    socks = stall_streams(d, ident, 16)
    try:
        data = put(e, "cfg/busy.npz", 20 * MiB)
        trigger(e)
        wait_until(lambda: replicated(d, e, "cfg/busy.npz") == data, 20, what="the 20 MB replica over HTTP")
    finally:
        for s in socks:
            s.close()
    assert refused(d).get("busy", 0) > busy0
    assert sync_status(e)["sent"]["channel_fallbacks"] > fallbacks0


# -- finding 13: the free-space check reserves what transfers under way will still write -----------------------

def sparse_item(path, size, bs=16 * MiB, seq=1):
    blocks = -(-size // bs)
    return PushItem(path, Manifest.build(size, bs, os.urandom(32 * blocks)), seq, [], True, "sealed")


def test_store_reserves_the_remaining_bytes_of_partials_under_way(tmp_path):
    free = [1000 * MiB]
    store = ReplicaStore(tmp_path, free_bytes=lambda: free[0])
    bs = 128 * 1024
    data = os.urandom(4 * bs)
    m = Manifest.build(len(data), bs, b"".join(hash_block(data[i:i + bs]) for i in range(0, len(data), bs)))
    big = sparse_item("a.bin", 600 * MiB)
    assert store.apply("o1", big)["status"] == "need"  # a sparse partial: takes no space yet
    assert store.reserved_bytes() == 600 * MiB
    r = store.apply("o1", sparse_item("b.bin", 600 * MiB))
    assert r["status"] == "rejected" and r["reason"] == "no_space" and r["http_status"] == 507
    assert store.rejected["no_space"] == 1
    # what fits beside it is accepted: 1000 - 600 - 64 margin = 336 MiB, and then nothing more
    assert store.apply("o1", sparse_item("c.bin", 336 * MiB))["status"] == "need"
    assert store.apply("o2", PushItem("d.bin", m, 1, [(0, data[:bs])], commit=False))["status"] == "rejected"
    free[0] = 2000 * MiB
    r = store.apply("o2", PushItem("d.bin", m, 1, [(0, data[:bs])], commit=False))
    assert r["status"] == "need" and store.reserved_bytes() == 936 * MiB + 3 * bs  # verified blocks are not
    assert store.apply("o2", PushItem("d.bin", m, 1, [(i, data[i * bs:(i + 1) * bs]) for i in range(1, 4)]))[
        "status"] == "committed"
    assert store.reserved_bytes() == 936 * MiB  # a committed transfer reserves nothing
    # after a restart, partial files on disk are still transfers under way
    again = ReplicaStore(tmp_path, free_bytes=lambda: 1000 * MiB)
    assert again.reserved_bytes() == 936 * MiB
    assert again.apply("o1", sparse_item("e.bin", 200 * MiB))["reason"] == "no_space"
    assert again.apply("o1", big)["status"] == "need"  # resuming one of them needs no new room


def test_a_transfer_that_cannot_fit_beside_partials_is_refused_507_over_http(tmp_path, pair):
    _, e, ident = pair
    d2 = start(tmp_path, "durable2", "durable", e)
    try:
        d2.wait_ready()
        wait_until(lambda: any(m.get("id") == ident.node_id
                               for m in d2.get("/members")["members"]), 15, what="d2 holds e's snapshot")
        st = os.statvfs(d2.data_dir)
        free = st.f_bavail * st.f_frsize
        size = int(free * 0.55)  # fits alone (with the margin), never twice

        def push(path):
            body = encode_push([sparse_item(path, size)])
            return httpx.post(d2.url + "/sync/push", content=body, trust_env=False, timeout=10, headers={
                **sign_headers(ident, "POST", "/sync/push", body), "content-type": "application/msgpack"})

        r = push("huge/1.bin")
        assert r.status_code == 200 and decode_push_reply(r.content)[0].status == "need"
        r = push("huge/2.bin")
        assert r.status_code == 507 and "retry-after" in r.headers
        assert decode_push_reply(r.content)[0].reason == "no_space"
        rec = sync_status(d2)["received"]
        assert rec["rejected"].get("no_space") == 1 and rec["reserved_bytes"] >= size - 16 * MiB
        assert size + FREE_SPACE_MARGIN_BYTES < free  # the first one really fit on its own
    finally:
        d2.kill()


# -- the pieces, without processes ------------------------------------------------------------------------------

def test_push_auth_is_checked_from_headers_then_from_the_signed_prefix_alone():
    from p2pnode.identity import Identity
    from p2pnode.sync import SyncReject
    from p2pnode.sync._wire import header_part_length, precheck_headers

    me = Identity.generate()
    data = os.urandom(300_000)
    item = PushItem("a.npz", Manifest.build(len(data), 128 * 1024, b"".join(
        hash_block(data[i:i + 128 * 1024]) for i in range(0, len(data), 128 * 1024))), 1,
        [(0, data[:128 * 1024])])
    body = encode_push([item])
    h = sign_headers(me, "POST", "/sync/push", body, now=1000.0)
    keys = {me.node_id: me.public_key}
    auth = precheck_headers(h, key_of=keys.get, now=1001.0, max_skew_s=300)
    end = header_part_length(body, len(body))
    assert end == len(body) - 128 * 1024  # the block comes after the signed part
    assert auth.verify("POST", "/sync/push", memoryview(body)[:end]) == me.node_id  # before any block arrived
    assert auth.verify("POST", "/sync/push", body) == me.node_id
    tampered = bytearray(body)
    tampered[end - 1] ^= 1
    with pytest.raises(SyncReject):
        auth.verify("POST", "/sync/push", tampered)

    def reason(headers, now=1001.0, keys=keys):
        with pytest.raises(SyncReject) as exc:
            precheck_headers(headers, key_of=keys.get, now=now, max_skew_s=300)
        return exc.value.reason

    assert reason({}) == "bad_signature"
    assert reason(h, keys={}) == "not_member"
    assert reason(h, now=1000.0 + 301) == "bad_signature"
    assert reason({**h, "x-p2pnode-signature": base64.b64encode(b"x" * 10).decode()}) == "bad_signature"
    with pytest.raises(SyncReject) as exc:
        header_part_length((2**31).to_bytes(4, "big"), 40 * MiB)
    assert exc.value.reason == "malformed"


def test_byte_budget_never_holds_more_than_its_capacity():
    from p2pnode.sync._inbound import ByteBudget

    b = ByteBudget(64)
    assert b.take_nowait(40) and not b.take_nowait(40) and b.take_nowait(24) and not b.take_nowait(1)
    b.release(40)
    assert b.take_nowait(40) and b.used == 64 and b.peak == 64


# -- POST /sync/wal: a live database's segments, authenticated twice, applied only in order ---------------------

def _wal_post(d, ident, seg, *, sign=True, headers=None):
    from p2pnode.sync._walship import WAL_PATH
    h = dict(headers or (sign_headers(ident, "POST", WAL_PATH, seg) if sign else forged_headers(ident)))
    h["content-type"] = "application/octet-stream"
    return httpx.post(d.url + WAL_PATH, content=seg, headers=h, timeout=10, trust_env=False)


def test_wal_segments_are_refused_unsigned_out_of_order_or_bound_to_another_payload(pair, tmp_path):
    import msgpack

    from p2pnode.sync._walwire import SegmentHeader, encode_segment, payload_hash

    d, _e, ident = pair
    page = 4096
    db = tmp_path / "h.db"
    import sqlite3
    c = sqlite3.connect(db)
    c.execute("CREATE TABLE t (x)")
    c.commit()
    c.close()
    snap = db.read_bytes()

    def seg(kind, seq, prev, payload, *, pages=(), claimed=None):
        h = SegmentHeader(ident.node_id, "hostile/h.db", kind, seq, prev, page, len(snap) // page, list(pages),
                          len(payload), claimed or payload_hash(payload), (1, 2), 0, time.time())
        return encode_segment(ident, h) + payload

    before = dict(refused(d))
    good = seg("snapshot", 10, 0, snap)
    assert _wal_post(d, ident, good, sign=False).status_code in (401, 403)  # forged request signature
    assert _wal_post(d, ident, seg("snapshot", 11, 0, snap, claimed=bytes(32))).status_code == 422  # bad payload
    r = _wal_post(d, ident, good)
    assert r.status_code == 200 and msgpack.unpackb(r.content)["seq"] == 10
    gap = seg("frames", 13, 12, snap[:page], pages=[1])
    r = _wal_post(d, ident, gap)
    assert r.status_code == 409 and msgpack.unpackb(r.content)["error"] == "out_of_order"
    assert _wal_post(d, ident, good).status_code == 409  # a replay: stale_version
    rep = d.data_dir / "walreplicas" / ident.node_id / "hostile" / "h.db"
    assert rep.read_bytes()[100:] == snap[100:]  # the applied snapshot, nothing of the refused ones
    after = refused(d)
    for reason in ("bad_signature", "bad_block_hash", "out_of_order", "stale_version"):
        assert after.get(reason, 0) > before.get(reason, 0), (reason, after)
    wal = sync_status(d)["wal"]["received"]
    assert wal["applied"] == {"snapshot": 1} and wal["refused"].get("out_of_order") == 1
