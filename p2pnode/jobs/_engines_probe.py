"""Engine fingerprinting (issue 26), as Nomad fingerprints its task drivers: which engines this node can run.

``process`` always; ``torchrun`` where the engine's interpreter (``[jobs.engines]``, default the agent's own)
imports ``torch.distributed.run``; ``ray`` where it imports ``ray`` and its command line. Each probe runs the
interpreter once at start, bounded in time and output; a probe that fails, hangs or prints nonsense means the engine
is absent here (the planner then never sends this node a member of that engine). Driver-level I/O (processes).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess

__all__ = ["PROBE_TIMEOUT_S", "PROBES", "probe_engines"]

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 120.0
"""Seconds one probe may take (importing torch with its CUDA libraries takes several on a busy node)."""
PROBES = {
    "torchrun": "import torch, torch.distributed.run; print(torch.__version__)",
    "ray": "import ray, ray.scripts.scripts; print(ray.__version__)",
}
"""What each engine's interpreter must import; it prints the engine's version."""
_VERSION = re.compile(r"^[0-9A-Za-z.+_-]{1,64}$")


def probe_engines(pythons: dict[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, str]:
    """``{engine: what was found}`` for the engines this node runs, ``process`` first, from ``{engine:
    interpreter}``. Never raises: an engine whose probe fails is left out, and logged."""
    found = {"process": "built in"}
    for engine, code in PROBES.items():
        python = pythons.get(engine)
        if not python:
            continue
        try:
            out = subprocess.run([python, "-c", code], capture_output=True, timeout=timeout_s, check=False,
                                 stdin=subprocess.DEVNULL, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        except (OSError, subprocess.SubprocessError) as exc:
            log.info("engine %s: not here (%s: %s)", engine, python, exc)
            continue
        lines = out.stdout.decode(errors="replace").strip().splitlines()
        version = lines[-1].strip() if lines else ""
        if out.returncode != 0 or not _VERSION.match(version):
            tail = out.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"status {out.returncode}"]
            log.info("engine %s: not here (%s: %s)", engine, python, tail[0][:200])
            continue
        found[engine] = f"{version} via {python}"
    return found
