"""Sync across three hosts in network namespaces: an ephemeral node cut off from both durable nodes keeps writing;
when its link comes back its data reaches R=2 replicas; when it then dies (kill -9) the replicas stay. Built and
removed by the test itself."""

import filecmp
import json
import os
import sqlite3
import sys
import time

import pytest
from agents import AgentProc, wait_until
from netns import NetnsLab, require_netns

pytestmark = [pytest.mark.netns, pytest.mark.slow]

ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SYNC_INTERVAL_S": "1", "P2PNODE_LOG_LEVEL": "info",
       "P2PNODE_SYNC_DATA_PORT": "8771"}  # one host per namespace: the default data port, as deployed


def sync_status_inside(lab, i):
    """``/sync/status`` of host ``i``, asked from inside its namespace (works while its link is cut)."""
    out = lab.sh(lab.names[i], "python3", "-c",
                 "import json,urllib.request as u;"
                 f"print(json.dumps(json.load(u.urlopen('http://{lab.addrs[i]}:8770/sync/status',timeout=3))))")
    return json.loads(out.stdout)


def members_inside(lab, i):
    """``/members`` of host ``i``, asked from inside its namespace."""
    out = lab.sh(lab.names[i], "python3", "-c",
                 "import json,urllib.request as u;"
                 f"print(json.dumps(json.load(u.urlopen('http://{lab.addrs[i]}:8770/members',timeout=3))))")
    return json.loads(out.stdout)["members"]


def wait_for(pred, timeout, what):
    # an agent still starting, a namespace command failing once: not yet
    return wait_until(pred, timeout, interval=0.5, what=what, retry_on=(Exception,))


def test_partitioned_ephemeral_node_catches_up_and_replicas_outlive_it(tmp_path, capsys):
    require_netns()
    lab = NetnsLab(3, net=3)
    procs = []
    try:
        tags = ["ephemeral", "durable", "durable"]
        for i, tag in enumerate(tags):
            args = ["--no-mdns", "--tag", tag] + (["--join", f"{lab.addrs[1]}:8770"] if i != 1 else [])
            procs.append(AgentProc(tmp_path / f"n{i}", 8770, *args, bind=lab.addrs[i], prefix=lab.prefix_for(i),
                                   env=ENV).start())
        wait_for(lambda: sync_status_inside(lab, 0)["durable_members"] == 2, 30, "two durable members known")
        wait_for(lambda: sum(1 for m in members_inside(lab, 0) if m.get("sync", {}).get("data_port")) == 2, 30,
                 "both durable nodes' data channels known")
        eid = sync_status_inside(lab, 0)["node_id"]

        lab.link(0, up=False)  # the ephemeral node is cut off, and keeps producing
        data = tmp_path / "n0" / "data" / "cfg"
        data.mkdir(parents=True)
        con = sqlite3.connect(data / "games.db")
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("CREATE TABLE games (id INTEGER PRIMARY KEY, moves BLOB)")
        con.executemany("INSERT INTO games (moves) VALUES (?)", [(os.urandom(300),) for _ in range(500)])
        con.commit()
        shard = data / "shard-1.npz"
        tmp = data / ".shard-1.npz.tmp"
        tmp.write_bytes(os.urandom(5 * 2**20))
        os.replace(tmp, shard)
        seen = {}

        def waiting():
            files = seen["files"] = sync_status_inside(lab, 0)["files"]
            return files if len(files) == 2 and all(x["replicas"] == 0 and x["lag_s"] > 3 for x in files) else None

        try:
            under = wait_for(waiting, 30, "files waiting, lag growing")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last files: {seen.get('files')}") from None
        cut_lag = max(f["lag_s"] for f in under)

        t_heal = time.monotonic()
        lab.link(0, up=True)
        wait_for(lambda: all(f["replicas"] == 2 for f in sync_status_inside(lab, 0)["files"]), 60,
                 "both files on both durable nodes")
        heal_s = time.monotonic() - t_heal
        for i in (1, 2):
            rep = tmp_path / f"n{i}" / "replicas" / eid / "cfg"
            assert filecmp.cmp(shard, rep / "shard-1.npz", shallow=False)
            r = sqlite3.connect(f"file:{rep / 'games.db'}?mode=ro", uri=True)
            assert r.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert r.execute("SELECT count(*) FROM games").fetchone() == (500,)
            r.close()
        con.close()
        sent = sync_status_inside(lab, 0)["sent"]
        assert sent["streams"] >= 2 and sent["channel_fallbacks"] == 0  # the shard's blocks took each data channel

        procs[0].kill()  # the spot machine vanishes: what it produced is already safe, and stays
        time.sleep(5)
        for i in (1, 2):
            assert (tmp_path / f"n{i}" / "replicas" / eid / "cfg" / "shard-1.npz").exists()
        with capsys.disabled():
            print(f"\n[netns sync] cut off: files waited ({cut_lag:.0f} s lag); after the link came back both "
                  f"reached R=2 in {heal_s:.1f} s; replicas kept after kill -9 of the ephemeral node", file=sys.stderr)
    finally:
        for p in procs:
            p.kill()
        lab.close()
