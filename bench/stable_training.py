"""Training on the durable box (issue 38, item 1): three real agents on loopback shaped like seed 003's fleet as
the operator ran it -- a durable 1xH200, an ephemeral 8xA100 (a RunPod spot box) and an ephemeral 8xRTX 4090 (a
Vast.ai box), fake GPUs -- started together with the example catalog (``deploy/examples/catalog.toml``, its
commands replaced by ``sleep``: trainings run past the measurement, selfplay 30-60 s), every other setting default.
Polls every agent's ``GET /jobs`` every 0.5 s and counts, from the first moment any agent names a leader:

* the samples in which the H200 runs a training (the acceptance line: at least 80 %);
* where the running trainings were, per node (samples x trainings);
* what ran on the H200 before a leader existed (autonomous work: it should leave the H200's GPU free).

    python bench/stable_training.py               # about 2 minutes
    python bench/stable_training.py --seconds 60 --json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from agents import AgentProc, free_port, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SLEEP = {"training": "exec sleep 3600", "selfplay": "exec sleep $((30 + $$ % 31))", "evaluation": "exec sleep 20"}


def catalog_text() -> str:
    """The example catalog with each template's argv replaced by a ``sleep`` of its kind."""
    out, kind = [], None
    for line in (ROOT / "deploy" / "examples" / "catalog.toml").read_text().splitlines():
        m = re.match(r'kind = "(\w+)"', line)
        if m:
            kind = m.group(1)
        if line.startswith("argv = ") and kind is not None:
            line = f'argv = ["sh", "-c", "{SLEEP[kind]}"]'
        out.append(line)
    return "\n".join(out) + "\n"


def run(seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="p2pnode-stable-") as tmp:
        root = Path(tmp)
        catalog = root / "catalog.toml"
        catalog.write_text(catalog_text())
        ports = [free_port() for _ in range(3)]
        shapes = [("h200", "H200", "durable"), ("a100", "8xA100", "ephemeral"), ("rtx", "8xRTX 4090", "ephemeral")]
        agents = {}
        for (name, gpus, tag), port in zip(shapes, ports, strict=True):
            join = ["--join", f"127.0.0.1:{ports[0]}"] if name != "h200" else ["--join", f"127.0.0.1:{ports[1]}"]
            agents[name] = AgentProc(root / name, port, "--fake-gpus", gpus, "--tag", tag, "--catalog",
                                     str(catalog), "--no-mdns", *join).start()
        try:
            for a in agents.values():
                wait_until(a.status, 60, what="the agents' APIs")
            t0 = time.monotonic()
            leader_at = None
            before: Counter[str] = Counter()  # template -> samples on the H200 before a leader existed
            trainings: Counter[str] = Counter()  # node -> training samples, once a leader exists
            samples = h200_training = 0
            while time.monotonic() - t0 < seconds:
                try:
                    jobs = {n: a.get("/jobs") for n, a in agents.items()}
                except Exception:  # noqa: BLE001 - a slow answer: skip this sample
                    time.sleep(0.5)
                    continue
                led = any(j.get("leader") for j in jobs.values())
                if led and leader_at is None:
                    leader_at = time.monotonic() - t0
                kinds = {n: [r["template"] for r in j["running"]] for n, j in jobs.items()}
                if not led:
                    before.update(kinds["h200"])
                else:
                    samples += 1
                    h200_training += any(t.startswith("train-") for t in kinds["h200"])
                    for n, ts in kinds.items():
                        trainings[n] += sum(1 for t in ts if t.startswith("train-"))
                time.sleep(0.5)
            return {"seconds": seconds, "leader_after_s": round(leader_at, 1) if leader_at is not None else None,
                    "samples_with_leader": samples,
                    "h200_training_percent": round(100.0 * h200_training / samples, 1) if samples else None,
                    "training_samples_by_node": dict(trainings), "h200_before_leader": dict(before)}
        finally:
            for a in agents.values():
                a.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args()
    r = run(ns.seconds)
    if ns.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"3 agents (durable 1xH200, ephemeral 8xA100 and 8xRTX 4090), example catalog, {ns.seconds:g} s")
        print(f"leader after {r['leader_after_s']} s; H200 ran a training in {r['h200_training_percent']} % of "
              f"{r['samples_with_leader']} samples with a leader")
        print(f"training samples by node: {r['training_samples_by_node']}")
        print(f"on the H200 before a leader (samples x jobs): {r['h200_before_leader'] or 'nothing'}")
    ok = r["h200_training_percent"] is not None and r["h200_training_percent"] >= 80.0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
