"""Fuzz and attack run (issue 12, item 7): hostile, valid-shaped snapshots through every consumer.

Phase 1, in-process: ``--cases`` (default 100,000) cases from the seeded generator of ``tests/fuzz/strategies.py``
through a real agent (``tests/fuzz/drive.py``: gossip merge, membership, election, planning as leader, acting on a
fuzz leader's plan, every view as JSON with ``allow_nan=False``). Any exception in a consumer is a crash; it is
printed with its snapshot shrunk on a fresh agent.

Phase 2, over HTTP: one real agent subprocess on loopback (demo catalog with harmless ``sleep`` commands, fake
GPUs, local-test timings; we create its data dir first, so we hold its key and can also send envelopes of its own
origin). ``--http-cases`` signed envelopes are posted to ``/gossip`` in batches of ``--batch``; after each batch
every view is read (``/status``, ``/members``, ``/events``, ``/guard``, ``/jobs``, ``/plan``, ``/sync/status``,
``/metrics``, ``/healthz``). Counted: gossip statuses, 5xx answers, tracebacks in the agent's log, quarantines
(``/status`` ``gossip.quarantines``), the agent's RSS before and after.

Exit status 1 on any crash, quarantine, 5xx, traceback, or RSS growth above ``--rss-growth-mb`` (default 100).

    .venv/bin/python bench/fuzz_snapshots.py                      # 100,000 in-process + 5,000 over HTTP
    .venv/bin/python bench/fuzz_snapshots.py --cases 2000 --http-cases 500 --seed 7
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402
import psutil  # noqa: E402
from agents import AgentProc, free_port  # noqa: E402
from fuzz.drive import DEMO_CATALOG, FAKE_GPUS, CaseMaker, run_fuzz  # noqa: E402
from fuzz.strategies import RandomDraw  # noqa: E402

from p2pnode.identity import load_or_create_identity  # noqa: E402
from p2pnode.scheduler import load_catalog  # noqa: E402
from p2pnode.wire import encode_gossip  # noqa: E402

VIEWS = ("/status", "/members", "/events", "/guard", "/jobs", "/plan", "/sync/status", "/metrics", "/healthz")
ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1"}


def harmless_catalog(dst: Path) -> Path:
    """The demo catalog with every command replaced by ``sleep 1`` (jobs a fuzz leader assigns us cost nothing)."""
    text = re.sub(r"(?m)^argv = .*$", 'argv = ["sleep", "1"]', DEMO_CATALOG.read_text())
    dst.write_text(text)
    return dst


def find_key(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            if (r := find_key(v, key)) is not None:
                return r
    return None


def _starts(text: str, word: str) -> list[int]:
    return [m.start() for m in re.finditer(re.escape(word), text)]


def _excerpt(tb: str) -> str:
    """A traceback's p2pnode frames and its exception line (the library frames are left out)."""
    lines = tb.splitlines()
    keep = [ln for i, ln in enumerate(lines) if "/p2pnode/" in ln or (i and "/p2pnode/" in lines[i - 1])]
    exc = [ln for ln in lines if re.match(r"^[\s|+-]*[A-Za-z_.]+(Error|Exception|Group)\b.*:", ln)]
    return "\n".join(keep[-12:] + exc[-3:])


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def http_phase(tmp: Path, *, cases: int, seed: int, batch: int) -> dict[str, Any]:
    import random

    data_dir = tmp / "agent"
    data_dir.mkdir(parents=True)
    me = load_or_create_identity(data_dir)  # the agent will load this key: we can sign as it, too
    catalog = harmless_catalog(tmp / "catalog.toml")
    cat = load_catalog(catalog)
    proc = AgentProc(data_dir, free_port(), "--no-mdns", "--fake-gpus", FAKE_GPUS, "--catalog", str(catalog), env=ENV)
    proc.start()
    out: dict[str, Any] = {"statuses": Counter(), "view_5xx": Counter(), "gossip_5xx": 0, "cases": 0,
                           "unencodable": 0, "errors": Counter()}
    try:
        proc.wait_ready()
        time.sleep(1.0)
        out["rss_before_mb"] = rss_mb(proc.proc.pid)
        maker = CaseMaker(me, lambda o: None, token=None, templates=sorted(cat.templates), catalog_digest=cat.digest,
                          gpu_count=2, configs=sorted(cat.configs))
        d = RandomDraw(random.Random(seed))
        t0 = time.monotonic()
        with httpx.Client(base_url=proc.url, timeout=10.0, trust_env=False) as c:
            while out["cases"] < cases:
                envs = []
                for _ in range(min(batch, cases - out["cases"])):
                    out["cases"] += 1
                    _, _, env, _ = maker.make(d)
                    if env is None:
                        out["unencodable"] += 1
                    else:
                        envs.append(env)
                body = encode_gossip("fuzz", "127.0.0.1:9", {}, envs)
                try:
                    r = c.post("/gossip", content=body, headers={"content-type": "application/msgpack"})
                    out["statuses"][r.status_code] += 1
                    out["gossip_5xx"] += r.status_code >= 500 and r.status_code != 503  # 503 = busy, by design
                except httpx.HTTPError as exc:
                    out["errors"][f"POST /gossip: {exc.__class__.__name__}"] += 1
                for path in VIEWS:
                    try:
                        r = c.get(path)
                        if r.status_code >= 500:
                            out["view_5xx"][path] += 1
                    except httpx.HTTPError as exc:
                        out["errors"][f"GET {path}: {exc.__class__.__name__}"] += 1
                if proc.proc.poll() is not None:
                    out["errors"]["agent exited"] += 1
                    break
            out["seconds"] = time.monotonic() - t0
            out["seconds"] = time.monotonic() - t0
            try:
                st = c.get("/status").json()
            except httpx.HTTPError as exc:
                out["errors"][f"GET /status at the end: {exc.__class__.__name__}"] += 1
                time.sleep(0.5)
                out["exit_code"] = proc.proc.poll()
                return _finish(out, proc)
            q = find_key(st, "quarantines")
            out["quarantines"] = q if q is not None else 0
            out["quarantine_counter"] = q is not None
            out["rejected"] = find_key(st, "rejected")
            out["members"] = len(st.get("members", []))
            out["leader"] = st.get("election", {}).get("leader")
        out["rss_after_mb"] = rss_mb(proc.proc.pid)
    finally:
        proc.stop()
    return _finish(out, proc)


def _finish(out: dict[str, Any], proc: AgentProc) -> dict[str, Any]:
    text = proc.log.read_text(errors="replace")
    out["tracebacks"] = text.count("Traceback")
    out["traceback_excerpts"] = [_excerpt(text[i:i + 20000]) for i in _starts(text, "Traceback")[:3]]
    out.setdefault("exit_code", proc.proc.returncode)
    errors = re.findall(r"(?m)^.*\bERROR\b.*$", text)
    out["log_errors"] = Counter(re.sub(r"^\S+ \S+ |[0-9a-f]{16,}", "<id>", m)[:100] for m in errors)
    out["error_examples"] = [m[:1000] for m in errors[:3]]
    out["log"] = proc.log
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000, help="in-process cases (default 100,000)")
    ap.add_argument("--http-cases", type=int, default=5_000, help="envelopes posted to a real agent (default 5,000)")
    ap.add_argument("--batch", type=int, default=8, help="envelopes per POST /gossip (views read after each)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--epoch-cases", type=int, default=1000, help="in-process agent rebuilt every N cases")
    ap.add_argument("--rss-growth-mb", type=float, default=100.0, help="allowed RSS growth of the HTTP agent")
    args = ap.parse_args()
    logging.getLogger("p2pnode").setLevel(logging.CRITICAL + 1)  # warnings about hostile peers are expected
    failed = False
    with tempfile.TemporaryDirectory(prefix="p2pnode-fuzz-") as t:
        tmp = Path(t)
        if args.cases:
            print(f"phase 1: {args.cases} cases in-process (seed {args.seed})", flush=True)
            stats = run_fuzz(tmp / "inproc", cases=args.cases, seed=args.seed, epoch_cases=args.epoch_cases,
                             progress_s=30.0)
            print(stats.summary())
            for c in stats.crashes[:10]:
                print(c.report())
            failed |= stats.failures > 0
        if args.http_cases:
            print(f"phase 2: {args.http_cases} cases over HTTP in batches of {args.batch}", flush=True)
            h = http_phase(tmp / "http", cases=args.http_cases, seed=args.seed + 1, batch=args.batch)
            rate = h["cases"] / h["seconds"] if h.get("seconds") else 0.0
            growth = h.get("rss_after_mb", 0.0) - h.get("rss_before_mb", 0.0)
            print(f"cases {h['cases']} ({rate:.0f}/s), unencodable {h['unencodable']}, members held at the end "
                  f"{h.get('members')}, leader {h.get('leader')}")
            print(f"POST /gossip statuses: {dict(h['statuses'])}; agent's rejections: {h.get('rejected')}")
            print(f"5xx: gossip {h['gossip_5xx']}, views {dict(h['view_5xx']) or 0}; client errors "
                  f"{dict(h['errors']) or 0}")
            if h.get("exit_code") not in (0, None):
                print(f"THE AGENT DIED (exit status {h['exit_code']})")
            print(f"tracebacks in the agent log: {h['tracebacks']}; ERROR lines: {dict(h['log_errors']) or 0}")
            print(f"quarantines: {h.get('quarantines', 0)}"
                  + ("" if h.get("quarantine_counter") else " (the agent exposes no quarantine counter in /status)"))
            print(f"agent RSS: {h.get('rss_before_mb', 0):.1f} MB before, {h.get('rss_after_mb', 0):.1f} MB after "
                  f"(growth {growth:.1f} MB, bound {args.rss_growth_mb:.0f} MB)")
            bad = (h["gossip_5xx"] or h["view_5xx"] or h["tracebacks"] or h.get("quarantines") or h["errors"]
                   or h["log_errors"] or growth > args.rss_growth_mb)
            for ex in h.get("error_examples", []):
                print("--- ERROR line in the agent log: " + ex)
            for ex in h["traceback_excerpts"]:
                print("--- agent log from a traceback on:\n" + ex)
            failed |= bool(bad)
    print("FAIL" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
