"""The probe driver on loopback UDP: two real nodes ack each other's probes; with datagrams lost, the stream
fallback keeps the member alive. Waits on conditions with deadlines, never fixed sleeps."""

import random
import time

import trio

from p2pnode.drivers._gossip_probe import ProbeDriver
from p2pnode.gossip import Membership, MembershipConfig, MemberState, ProbeCodec, ProbeConfig, ProbeKeys, Prober
from p2pnode.identity import Identity

PCFG = ProbeConfig(probe_interval_s=0.2, probe_timeout_s=0.1)


def make_node(me, other, addrs, pubs, seed):
    m = Membership(me.node_id, MembershipConfig(), adopt_suspicions=True)
    m.observe(other.node_id, version=1, incarnation=0, leaving=False, suspects={}, now=trio.current_time())
    prober = Prober(m, PCFG, rng=random.Random(seed))
    codec = ProbeCodec(ProbeKeys(me.node_id, me.private_key, pubs.get))
    return ProbeDriver(prober, codec, addr_of=addrs.get, now=trio.current_time,
                       wall_ms=lambda: int(time.time() * 1000))


async def wait_for(cond, timeout_s=10.0):
    with trio.fail_after(timeout_s):
        while not cond():
            await trio.sleep(0.01)


async def test_two_nodes_ack_each_others_probes_over_udp():
    a, b = Identity.generate(), Identity.generate()
    pubs = {a.node_id: a.public_key, b.node_id: b.public_key}
    addrs = {}
    da, db = make_node(a, b, addrs, pubs, 1), make_node(b, a, addrs, pubs, 2)
    async with trio.open_nursery() as nursery:
        ha, hb = await da.bind("127.0.0.1", 0), await db.bind("127.0.0.1", 0)
        addrs[a.node_id], addrs[b.node_id] = f"{ha[0]}:{ha[1]}", f"{hb[0]}:{hb[1]}"
        await nursery.start(da.run)
        await nursery.start(db.run)
        ma, mb = da.prober.membership.members[b.node_id], db.prober.membership.members[a.node_id]
        await wait_for(lambda: da.prober.probes >= 3 and db.prober.probes >= 3)
        assert ma.last_acked_at > 0 and mb.last_acked_at > 0
        assert da.prober.probes_failed == 0 and ma.state is MemberState.ALIVE
        assert da.codec.accepted > 0 and not da.codec.rejected
        nursery.cancel_scope.cancel()


async def test_stream_fallback_keeps_a_member_whose_datagrams_are_lost_alive():
    a, b = Identity.generate(), Identity.generate()
    pubs = {a.node_id: a.public_key, b.node_id: b.public_key}
    addrs = {}
    da, db = make_node(a, b, addrs, pubs, 1), make_node(b, a, addrs, pubs, 2)

    async def post_to_b(addr, packet):  # the HTTP POST /probe of the agent, in process
        return db.handle_stream(packet, "127.0.0.1")

    da.stream_post = post_to_b
    dead = trio.socket.socket(type=trio.socket.SOCK_DGRAM)
    await dead.bind(("127.0.0.1", 0))
    black_hole = dead.getsockname()  # bound and never read: datagrams to it vanish
    async with trio.open_nursery() as nursery:
        ha = await da.bind("127.0.0.1", 0)
        await db.bind("127.0.0.1", 0)
        addrs[a.node_id], addrs[b.node_id] = f"{ha[0]}:{ha[1]}", f"{black_hole[0]}:{black_hole[1]}"
        await nursery.start(da.run)
        await nursery.start(db.run)
        await wait_for(lambda: da.prober.probes >= 4)
        ma = da.prober.membership.members[b.node_id]
        assert ma.last_acked_at > 0 and ma.state is MemberState.ALIVE
        assert da.prober.probes_failed == 0  # every probe acked, over the stream
        assert db.codec.accepted > 0
        nursery.cancel_scope.cancel()
    dead.close()


async def test_a_lease_is_renewed_by_the_voters_direct_acks_and_lapses_when_they_stop():
    """Issue 42: node a keeps a lease over voters {a, b} (quorum 2): b's acks to a's own pings renew it, from each
    ping's send; when b's datagrams vanish (and no stream fallback is given) nothing renews it."""
    from p2pnode.node._lease import Lease

    a, b = Identity.generate(), Identity.generate()
    pubs = {a.node_id: a.public_key, b.node_id: b.public_key}
    addrs = {}
    da, db = make_node(a, b, addrs, pubs, 1), make_node(b, a, addrs, pubs, 2)
    lease = Lease(a.node_id, lease_s=1.2, stop_lead_s=0.2)
    lease.set_voters((a.node_id, b.node_id))
    da.lease = lease
    assert da.prober.keep_direct_acks
    dead = trio.socket.socket(type=trio.socket.SOCK_DGRAM)
    await dead.bind(("127.0.0.1", 0))
    black_hole = dead.getsockname()
    async with trio.open_nursery() as nursery:
        ha, hb = await da.bind("127.0.0.1", 0), await db.bind("127.0.0.1", 0)
        addrs[a.node_id], addrs[b.node_id] = f"{ha[0]}:{ha[1]}", f"{hb[0]}:{hb[1]}"
        await nursery.start(da.run)
        await nursery.start(db.run)
        await wait_for(lambda: lease.renewals >= 3)
        assert lease.held(trio.current_time())
        assert lease.expires_at(trio.current_time()) <= trio.current_time() + 1.2  # from a send, never later
        addrs[b.node_id] = f"{black_hole[0]}:{black_hole[1]}"  # b no longer reachable
        await wait_for(lambda: not lease.held(trio.current_time()))
        renewals = lease.renewals
        expired_at = lease.expires_at(trio.current_time())
        await wait_for(lambda: trio.current_time() > expired_at + 0.5)
        assert lease.renewals == renewals and not lease.held(trio.current_time())
        nursery.cancel_scope.cancel()
    dead.close()
