"""Issue 42's first acceptance line, measured: five agents in five network namespaces (``lan`` gossip profile, SWIM
probes on unless ``--probes off``; fake GPUs H200, H100, A100, RTX 4090 and none, as ``tests/test_netns_election.py``,
whose helpers it uses), once per seed:

1. (first run only, ``--udp-drop-s``) one member's UDP dropped both ways by iptables in its namespace, TCP left
   open (as some marketplaces map ports): how often any member saw it other than ``alive`` (sampled), its
   refutations, and the others' ``p2pnode_suspicions_total`` over that time. Expected: 0 (probes fall back to
   ``POST /probe``).
2. once the five agree with every member alive and nothing moved for ``SETTLE_S`` + 2 s (:func:`quiet`), after a
   seeded delay (0-2 s), a 2 | 3 partition: iptables DROP between the two sides in every namespace (both ways,
   TCP and UDP; the bench's own link to every agent stays up, so both sides are sampled over HTTP) for ``--hold``
   s. Odd seeds put the leader in the minority, even seeds do not; the other minority member(s) are drawn by the
   seed. Seconds until the three agree on one leader of their own side; when each of the three first accused (its
   own failed probe) each of the two, and when all three held them suspect and dead; whether the two ever named a
   leader of a term newer than the cut's (an election without a quorum), and until when they named any leader.
   Then the heal.
3. once quiet again (after a heal, a member that refuted a suspicion is not voted for until it has settled, and
   then may take the lead back: either would fall into the figure), after a seeded delay, ``kill -9`` of the
   leader: seconds until every survivor's ``/status`` names the same new leader, and until all of them held the
   killed one suspect and dead.

Throughout, every agent's ``/status`` is sampled by its own thread every ``--period`` seconds (0.2): each
``(term, leader)`` seen by anyone is kept, and a term in which two different nodes were named leader is a safety
violation (the run's samples and the agents' logs are then kept under ``--keep``). Prints one JSON line per run
and a summary; exits 1 on any violation.

Needs root, ``ip netns`` and ``iptables`` (as ``tests/test_netns_election.py``). Settle time (a returning stronger
node may lead again after it) is 10 s and the gossip redial backoff is capped at 2 s, as in the test, so a heal takes
seconds; neither bears on detection. One run takes about 100 s, plus the first agents' start on a busy machine.

    sudo .venv/bin/python bench/election_netns.py --seeds 20 --probes on
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from netns import NetnsLab  # noqa: E402
from test_netns_election import PROFILES, start  # noqa: E402

PORT = 8770
SETTLE_S = 10.0  # election.leader_settle_s here, as in the test (the default is 120 s)


def gpu(i: int | None) -> str | None:
    """Agent ``i``'s fake GPU (its name in the JSON: ``H200`` ... ``none``)."""
    return None if i is None else (PROFILES[i] or "none")


def env_for(probes: bool) -> dict[str, str]:
    return {"P2PNODE_GOSSIP_PROFILE": "lan", "P2PNODE_GOSSIP_PROBES": "1" if probes else "0",
            "P2PNODE_GOSSIP_MAX_BACKOFF_S": "2", "P2PNODE_ELECTION_LEADER_SETTLE_S": str(SETTLE_S),
            "P2PNODE_LOG_LEVEL": "info"}


class Watch:
    """One sampling thread per agent: its ``/status`` every ``period`` s. ``latest[i]`` is the newest sample
    ``(t, leader, term, {member id: state}, status)``; ``seen`` maps each term to ``{leader: first (t, by)}``."""

    def __init__(self, lab: NetnsLab, period: float) -> None:
        self.lab, self.period = lab, period
        self.latest: dict[int, tuple] = {}
        self.seen: dict[int, dict[str, tuple[float, int]]] = {}
        self.log: list[tuple[float, int, str | None, int]] = []  # every (t, by, leader, term) that changed
        # every (t, by, member, state) that changed; state "accused": ``by`` lists it in its own suspects
        self.states: list[tuple[float, int, str, str]] = []
        self.changed_at = time.monotonic()  # the last sample in which any leader, term, state or incarnation moved
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(len(lab.addrs))]
        for t in self.threads:
            t.start()

    def _loop(self, i: int) -> None:
        url = f"http://{self.lab.addrs[i]}:{PORT}/status"
        last, last_states, last_own, last_sig = None, {}, {}, None
        with httpx.Client(timeout=1.0, trust_env=False) as client:
            while not self.halt.is_set():
                t = time.monotonic()
                try:
                    st = client.get(url).json()
                except (httpx.HTTPError, ValueError):
                    st = None
                if st is not None:
                    lead, term = st["election"]["leader"], st["election"]["term"]
                    states = {m["id"]: m["state"] for m in st["members"]}
                    sig = (lead, term, sorted((m["id"], m["state"], m["incarnation"]) for m in st["members"]))
                    with self.lock:
                        self.latest[i] = (t, lead, term, states, st)
                        if sig != last_sig:
                            self.changed_at, last_sig = t, sig
                        if lead is not None:
                            self.seen.setdefault(term, {}).setdefault(lead, (t, i))
                        if (lead, term) != last:
                            self.log.append((t, i, lead, term))
                            last = (lead, term)
                        self.states += [(t, i, m, v) for m, v in states.items() if last_states.get(m) != v]
                        own = {m: "accused" for m in st["membership"]["suspects"]}  # its own accusations
                        self.states += [(t, i, m, v) for m, v in own.items() if last_own.get(m) != v]
                        last_states, last_own = states, own
                self.halt.wait(max(0.0, self.period - (time.monotonic() - t)))

    def violations(self) -> dict[int, dict[str, tuple[float, int]]]:
        """Terms in which two different nodes were named leader (by anyone, at any time)."""
        with self.lock:
            return {term: dict(who) for term, who in self.seen.items() if len(who) > 1}

    def agree(self, idx, since: float, timeout: float, *, among: set[str] | None = None):
        """First ``(t, leader, term)`` at which the newest samples (all taken after ``since``) of the agents ``idx``
        name one leader (one of ``among`` if given); ``t`` is the newest of those samples. None after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                got = [self.latest.get(i) for i in idx]
            if all(g is not None and g[0] >= since for g in got):
                views = {(g[1], g[2]) for g in got}
                if len(views) == 1 and got[0][1] is not None and (among is None or got[0][1] in among):
                    return max(g[0] for g in got), got[0][1], got[0][2]
            time.sleep(self.period / 2)
        return None

    def firsts(self, idx, member: str, states: set[str], since: float, until: float = float("inf")) -> list:
        """Per agent of ``idx``: seconds after ``since`` when it first saw ``member`` in one of ``states`` before
        ``until`` (None: it did not)."""
        with self.lock:
            got = [min((t for t, by, m, v in self.states if by == i and m == member and v in states
                        and since <= t < until), default=None) for i in idx]
        return [None if t is None else round(t - since, 2) for t in got]

    def first_all(self, idx, member: str, states: set[str], since: float) -> float | None:
        """Seconds after ``since`` when the last of the agents ``idx`` first saw ``member`` in one of ``states``
        (None: one never did)."""
        got = self.firsts(idx, member, states, since)
        return None if None in got else max(got)

    def named_until(self, i: int, since: float, until: float) -> float:
        """Seconds after ``since`` until which agent ``i`` last named a leader, before ``until`` (0: none)."""
        with self.lock:
            mine = [(t, lead) for t, by, lead, _ in self.log if by == i and t < until]
        at_since = next((lead for t, lead in reversed(mine) if t < since), None)
        after = [(t, lead) for t, lead in mine if t >= since]
        if (after[-1][1] if after else at_since) is not None:
            return round(until - since, 2)  # still naming one at ``until``
        named = at_since is not None or any(lead is not None for _, lead in after)
        return round(after[-1][0] - since, 2) if named and after else 0.0

    def stop(self) -> None:
        self.halt.set()
        for t in self.threads:
            t.join(5)


def ipt(lab: NetnsLab, i: int, *rule: str) -> None:
    lab.sh(lab.names[i], "iptables", *rule)


def cut(lab: NetnsLab, side_a, side_b, add: bool) -> None:
    """DROP every packet between ``side_a`` and ``side_b`` (both ways, any protocol), or remove those rules."""
    op = "-A" if add else "-D"
    for i, other in ((i, o) for i in side_a for o in side_b):
        for a, b in ((i, other), (other, i)):
            ipt(lab, a, op, "INPUT", "-s", lab.addrs[b], "-j", "DROP")
            ipt(lab, a, op, "OUTPUT", "-d", lab.addrs[b], "-j", "DROP")


def suspicions(lab: NetnsLab, i: int) -> float | None:
    """``p2pnode_suspicions_total`` of agent ``i`` (None: no such family, probes off, or no answer)."""
    try:
        text = httpx.get(f"http://{lab.addrs[i]}:{PORT}/metrics", timeout=2.0, trust_env=False).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("p2pnode_suspicions_total "):
            return float(line.split()[1])
    return None


def udp_drop(lab: NetnsLab, w: Watch, ids: dict[int, str], u: int, hold_s: float) -> dict:
    """Drop agent ``u``'s UDP both ways for ``hold_s`` s; count how the others saw it meanwhile."""
    others = [i for i in ids if i != u]
    before = {i: suspicions(lab, i) for i in others}
    ref0 = w.latest[u][4]["membership"]["refutations"]
    probes0 = w.latest[u][4]["membership"].get("probes", {})
    for chain in ("INPUT", "OUTPUT"):
        ipt(lab, u, "-A", chain, "-p", "udp", "-j", "DROP")
    t0, not_alive, samples = time.monotonic(), 0, 0
    try:
        while time.monotonic() - t0 < hold_s:
            with w.lock:
                got = [w.latest.get(i) for i in others]
            for g in got:
                if g is not None and g[0] >= t0:
                    samples += 1
                    not_alive += g[3].get(ids[u]) != "alive"
            time.sleep(w.period)
    finally:
        for chain in ("INPUT", "OUTPUT"):
            ipt(lab, u, "-D", chain, "-p", "udp", "-j", "DROP")
    after = {i: suspicions(lab, i) for i in others}
    probes1 = w.latest[u][4]["membership"].get("probes", {})
    return {"node": gpu(u), "hold_s": hold_s, "samples": samples, "seen_not_alive": not_alive,
            "refutations": w.latest[u][4]["membership"]["refutations"] - ref0,
            "suspicions_by_others": (sum(after[i] - before[i] for i in others)
                                     if all(v is not None for v in (*before.values(), *after.values())) else None),
            "its_probes": {k: probes1.get(k, 0) - probes0.get(k, 0) for k in ("probes", "acks", "failed", "indirect")}}


def partition(lab: NetnsLab, w: Watch, ids: dict[int, str], rng: random.Random, seed: int, hold_s: float) -> dict:
    """A 2 | 3 cut (the leader in the 2 on odd seeds), held ``hold_s`` s, then healed."""
    agreed = w.agree(ids, time.monotonic(), 60.0)
    if agreed is None:
        raise RuntimeError("no agreed leader before the cut")
    leader_i = next(i for i, n in ids.items() if n == agreed[1])
    cut_term = agreed[2]
    rest = [i for i in ids if i != leader_i]
    minority = sorted([leader_i, rng.choice(rest)] if seed % 2 else rng.sample(rest, 2))
    majority = [i for i in ids if i not in minority]
    time.sleep(rng.uniform(0.0, 2.0))  # the seeded phase of the cut against probe and gossip rounds
    cut(lab, minority, majority, add=True)
    t0 = time.monotonic()
    out = {"minority": [gpu(i) for i in minority], "leader_in_minority": leader_i in minority}
    try:
        got = w.agree(majority, t0, 60.0, among={ids[i] for i in majority})
        out["majority_leader_s"] = round(got[0] - t0, 2) if got else None
        out["majority_leader"] = gpu(next(i for i in majority if ids[i] == got[1])) if got else None
        while time.monotonic() - t0 < hold_s:
            time.sleep(w.period)
        out["minority_leaderless_at_heal"] = all(w.latest[i][1] is None for i in minority)
    finally:
        t_heal = time.monotonic()
        cut(lab, minority, majority, add=False)
    with w.lock:
        mlog = [(t, by, lead, term) for t, by, lead, term in w.log if t0 <= t < t_heal and by in minority]
    out["minority_new_term_leader"] = any(lead is not None and term > cut_term for _, _, lead, term in mlog)
    out["minority_leader_until_s"] = max(w.named_until(i, t0, t_heal) for i in minority)
    # when each majority node itself first accused each minority node (a failed probe of its own)
    out["accused_s"] = {gpu(m): sorted(x for x in w.firsts(majority, ids[m], {"accused"}, t0, t_heal) if x is not None)
                        for m in minority}
    for key, states in (("majority_suspect_s", {"suspect", "dead"}), ("majority_dead_s", {"dead"})):
        each = [w.first_all(majority, ids[m], states, t0) for m in minority]
        out[key] = None if None in each else max(each)
    return out


def one_run(tmp: Path, seed: int, probes: bool, period: float, udp_drop_s: float, hold_s: float,
            keep: Path | None) -> dict:
    lab = NetnsLab(5, net=1, host_link=True)
    procs, w = {}, None
    r: dict = {"seed": seed, "probes": probes}
    try:
        procs = {i: start(lab, tmp, i, env=env_for(probes)) for i in range(5)}
        ids = {i: procs[i].wait_ready(120)["node"]["id"] for i in range(5)}
        w = Watch(lab, period)
        if w.agree(range(5), time.monotonic(), 120.0) is None:
            raise RuntimeError("the five agents did not agree on a leader within 120 s")
        if udp_drop_s > 0:
            u = random.Random(f"udp{seed}").choice([i for i in range(5) if ids[i] != w.latest[0][1]])
            r["udp_drop"] = udp_drop(lab, w, ids, u, udp_drop_s)
        quiet(w, ids)
        r["partition"] = partition(lab, w, ids, random.Random(f"cut{seed}"), seed, hold_s)
        t0 = time.monotonic()
        healed = w.agree(range(5), t0, 90.0)
        r["heal_s"] = round(healed[0] - t0, 2) if healed else None
        if healed:
            r["kill"] = kill_leader(w, ids, procs, random.Random(f"kill{seed}"), quiet(w, ids))
    except Exception as exc:  # a failed run is reported (its logs kept); the next seed runs
        r["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        if w is not None:
            w.stop()
            r["violations"] = {str(k): {n[:8]: v for n, v in who.items()} for k, who in w.violations().items()}
        for p in procs.values():
            p.kill()
        lab.close()
    if (r.get("violations") or "error" in r) and keep is not None:
        save(keep / f"seed{seed}", tmp, w, r)
    return r


def quiet(w: Watch, ids: dict[int, str]) -> str:
    """Wait until all five agree on a leader, hold every member alive, and no agent's leader, term, member state
    or incarnation has moved for :data:`SETTLE_S` + 2 s: a member that came back or refuted a suspicion (as after
    a heal) is not voted for until it has settled (``election.leader_settle_s``), and then may take the lead back,
    which would otherwise fall into the failover measured next. Returns the leader's id."""
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        got = w.agree(ids, time.monotonic(), deadline - time.monotonic())
        with w.lock:
            alive = all(all(w.latest[i][3].get(n) == "alive" for n in ids.values()) for i in ids)
            still = time.monotonic() - w.changed_at
        if got and alive and still >= SETTLE_S + 2.0:
            return got[1]
        time.sleep(max(w.period, SETTLE_S + 2.0 - still) if got and alive else w.period)
    raise RuntimeError("the five did not agree and keep still with every member alive within 120 s")


def kill_leader(w: Watch, ids: dict[int, str], procs: dict, rng: random.Random, leader: str) -> dict:
    """``kill -9`` of the agreed ``leader`` after a seeded delay; seconds until every survivor names one new
    leader."""
    li = next(i for i, n in ids.items() if n == leader)
    time.sleep(rng.uniform(0.0, 2.0))
    procs[li].stop(signal.SIGKILL)
    t0 = time.monotonic()
    survivors = [i for i in ids if i != li]
    got = w.agree(survivors, t0, 60.0, among={ids[i] for i in survivors})
    deadline = time.monotonic() + 30.0  # keep sampling until every survivor holds it dead (for ``dead_s``)
    while w.first_all(survivors, leader, {"dead"}, t0) is None and time.monotonic() < deadline:
        time.sleep(w.period)
    return {"killed": gpu(li), "failover_s": round(got[0] - t0, 2) if got else None,
            "suspect_s": w.first_all(survivors, leader, {"suspect", "dead"}, t0),
            "dead_s": w.first_all(survivors, leader, {"dead"}, t0),
            "accused_s": sorted(x for x in w.firsts(survivors, leader, {"accused"}, t0) if x is not None),
            "new_leader": gpu(next(i for i, n in ids.items() if n == got[1])) if got else None}


def save(dest: Path, tmp: Path, w: Watch | None, r: dict) -> None:
    """Keep a violating run's agent logs, the leader log of every sample and the last ``/status`` of each agent."""
    dest.mkdir(parents=True, exist_ok=True)
    for log in tmp.glob("n*.log"):
        shutil.copy(log, dest / log.name)
    (dest / "run.json").write_text(json.dumps(r))
    if w is None:
        return
    with w.lock:
        (dest / "leaders.jsonl").write_text("".join(json.dumps(e) + "\n" for e in w.log))
        (dest / "status.json").write_text(json.dumps({i: v[4] for i, v in w.latest.items()}))


def summary(runs: list[dict]) -> str:
    ok = [r for r in runs if "partition" in r]
    fo = [r["kill"]["failover_s"] for r in ok if r.get("kill") and r["kill"]["failover_s"] is not None]
    parts = [r["partition"] for r in ok]
    maj = {k: [p["majority_leader_s"] for p in parts if p["leader_in_minority"] == k and p["majority_leader_s"]
               is not None] for k in (True, False)}

    def fmt(xs):
        return (f"median {statistics.median(xs):.1f} s, max {max(xs):.1f} s, {sum(x > 10 for x in xs)} over 10 s "
                f"(n={len(xs)})") if xs else "none"

    drops = [r["udp_drop"] for r in runs if "udp_drop" in r]
    return (f"{sum('error' not in r for r in runs)}/{len(runs)} runs completed; runs with two leaders in one term: "
            f"{sum(bool(r.get('violations')) for r in runs)}; kill -9 of the leader -> survivors agree: {fmt(fo)}; "
            f"2|3 cut, leader in the 2 -> the 3 agree: {fmt(maj[True])}; leader in the 3: {fmt(maj[False])}; "
            f"minority named a leader of a newer term: {sum(p['minority_new_term_leader'] for p in parts)} runs; "
            f"UDP dropped: " + ("; ".join(f"{d['seen_not_alive']} of {d['samples']} samples not alive, "
                                          f"{d['suspicions_by_others']} suspicions" for d in drops) or "not run"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20, help="runs (default 20)")
    ap.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1)")
    ap.add_argument("--probes", choices=("on", "off"), default="on", help="gossip.probes (default on)")
    ap.add_argument("--period", type=float, default=0.2, help="seconds between /status samples per agent (0.2)")
    ap.add_argument("--hold", type=float, default=20.0, help="seconds the 2 | 3 partition lasts (default 20)")
    ap.add_argument("--udp-drop-s", type=float, default=60.0,
                    help="seconds one member's UDP is dropped, in the first run only (default 60; 0: not)")
    ap.add_argument("--keep", type=Path, default=Path(tempfile.gettempdir()) / "election-netns",
                    help="where a violating run's logs and samples are kept")
    a = ap.parse_args()
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        print("needs root, ip netns and iptables", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: agents killed, namespaces removed
    runs = []
    for k, seed in enumerate(range(a.first_seed, a.first_seed + a.seeds)):
        with tempfile.TemporaryDirectory(prefix="election-bench-") as d:
            r = one_run(Path(d), seed, a.probes == "on", a.period, a.udp_drop_s if k == 0 else 0.0, a.hold, a.keep)
        runs.append(r)
        print(json.dumps(r), flush=True)
    print(summary(runs), flush=True)
    return 1 if any(r.get("violations") for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
