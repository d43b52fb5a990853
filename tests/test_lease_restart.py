"""The lease on a real agent (issue 42 item 3): a training runs under its lease wrapper; the agent is killed with
``kill -9`` and restarted within ``lease_s`` (its job re-adopted, the same process), then killed again and left down
past the lease: the wrapper ends the job by the lease's expiry, and the next start finds it ended with the reason
in the history (rule ``lease_expired``). Waits are on conditions, with deadlines."""

from __future__ import annotations

import contextlib
import os
import signal

from agents import AgentProc, free_port, wait_until

from p2pnode.jobs._leasefile import boot_id, boottime, read_expiry

CATALOG = """
[[job]]
name = "train"
kind = "training"
config = "c"
max_concurrency = 1
argv = ["sleep", "600"]
[job.resources]
num_cpus = 0.1
"""
LEASE_S = 20
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1", "P2PNODE_GOSSIP_PROBES": "1",
       "P2PNODE_SCHEDULER_LEASE_S": str(LEASE_S), "P2PNODE_SCHEDULER_STOP_GRACE_S": "2",
       "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100"}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def test_a_restart_within_the_lease_re_adopts_and_one_after_it_finds_the_training_ended(tmp_path):
    cat = tmp_path / "catalog.toml"
    cat.write_text(CATALOG)
    data = tmp_path / "n0"
    lease_file = data / "jobs" / "lease"
    p = AgentProc(data, free_port(), "--no-mdns", "--catalog", str(cat), "--tag", "durable", "--tag", "voter",
                  env={**os.environ, **ENV}).start()
    pid = None
    try:
        p.wait_ready()
        first = wait_until(lambda: p.get("/jobs")["running"], 60, what="the training running")[0]
        pid = first["pid"]
        assert first["template"] == "train"
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            assert str(lease_file).encode() in fh.read().split(b"\0")  # under the lease wrapper
        # a lone voter holds its own lease: the file is kept about lease_s ahead of the boot clock
        wait_until(lambda: (read_expiry(lease_file, boot_id()) or 0) > boottime() + LEASE_S / 2, 10,
                   what="the lease file")
        lease = p.get("/jobs")["lease"]
        assert lease["held"] and lease["lease_s"] == LEASE_S and len(lease["voters"]) == 1, lease

        p.stop(signal.SIGKILL)  # kill -9, restarted at once: well within the lease
        assert _alive(pid)
        p.start()
        p.wait_ready()
        again = wait_until(lambda: p.get("/jobs")["running"], 30, what="the training re-adopted")[0]
        assert (again["job_id"], again["pid"]) == (first["job_id"], pid)

        p.stop(signal.SIGKILL)  # kill -9 again, and down past the lease
        expiry = read_expiry(lease_file, boot_id())
        assert expiry is not None and _alive(pid)
        wait_until(lambda: not _alive(pid), LEASE_S + 15, what="the wrapper ending the training")
        ended_at = boottime()
        assert ended_at <= expiry + 1  # nothing of it ran past the lease (whole seconds in the file)
        p.start()
        p.wait_ready()

        def ended():
            rows = [r for r in p.get("/jobs")["history"] if r["job_id"] == first["job_id"] and r.get("reason")]
            return rows[0] if rows and rows[0].get("ended_at") else None
        row = wait_until(ended, 30, what="the end in the history")
        assert row["rule"] == "lease_expired" and row["outcome"] == "stopped", row
        assert row["reason"].startswith("lease expired"), row
        assert p.stop() < 15  # a clean stop ends the training it placed again meanwhile
    finally:
        p.kill()
        if pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
