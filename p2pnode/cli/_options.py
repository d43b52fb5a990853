"""The agent's options (``agent``, ``config show|validate``, ``guard cleanup``) and the config they select.

Config precedence: flags > ``P2PNODE_*`` environment > TOML file (``--config`` or ``$P2PNODE_CONFIG``, else
``--config-if-exists`` when that file exists) > embedded defaults.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..config import DEFAULT_PORT, Config, load_config

__all__ = ["add_agent_options", "config_from"]


def _agent_overrides(ns: argparse.Namespace) -> dict[str, dict[str, Any]]:
    return {
        "agent": {
            "data_dir": ns.data_dir,
            "bind": ns.bind,
            "port": ns.port,
            "advertise": ns.advertise,
            "join": tuple(ns.join) if ns.join else None,
            "name": ns.name,
            "tags": tuple(ns.tag) if ns.tag else None,
            "fake_gpus": ns.fake_gpus,
            "fake_gpu_load": tuple(ns.fake_gpu_load) if ns.fake_gpu_load else None,
            "resources": tuple(ns.resource) if getattr(ns, "resource", None) else None,
            "catalog": ns.catalog,
            "log_level": ns.log_level,
        },
        "gossip": {"profile": ns.gossip_profile},
        "discovery": {
            "mdns": False if ns.no_mdns else None,
            "mdns_interfaces": tuple(ns.mdns_interface) if ns.mdns_interface else None,
        },
    }


def config_path(ns: argparse.Namespace) -> Path | None:
    """The config file the options select: ``--config``, else ``$P2PNODE_CONFIG``, else ``--config-if-exists`` when
    that path exists (present but unreadable or invalid is an error of :func:`config_from`); None: defaults."""
    path = ns.config or os.environ.get("P2PNODE_CONFIG") or None
    optional = getattr(ns, "config_if_exists", None)
    if path is None and optional and os.path.lexists(optional):
        path = optional
    return Path(path) if path else None


def config_from(ns: argparse.Namespace) -> Config:
    """The agent's config from :func:`config_path`'s file, the environment and the flags. Raises ``ConfigError``."""
    return load_config(config_path(ns), overrides=_agent_overrides(ns))


def add_agent_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML config file (default: $P2PNODE_CONFIG; none needed)")
    p.add_argument("--config-if-exists", dest="config_if_exists", metavar="FILE",
                   help="TOML config file read only when it exists (the systemd unit names /etc/p2pnode/p2pnode.toml); "
                        "--config and $P2PNODE_CONFIG come first")
    p.add_argument("--data-dir", metavar="DIR",
                   help="key, counters, peers file (default: $P2PNODE_DATA_DIR or the user data dir)")
    p.add_argument("--bind", metavar="ADDR", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, metavar="N",
                   help=f"HTTP port for gossip, status and metrics (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--advertise", metavar="HOST[:PORT]", help="address peers should use to reach this node")
    p.add_argument("--join", action="append", metavar="HOST:PORT", help="peer to contact at start (repeatable)")
    p.add_argument("--name", metavar="NAME",
                   help="the name operators know this node by, shown beside its id (default: the hostname; "
                        "published without control characters, cut to 63)")
    p.add_argument("--tag", action="append", metavar="TAG",
                   help="tag carried in the snapshot (repeatable): ephemeral (pushes its data), durable (keeps "
                        "replicas; listens on the sync data port, 8771 by default), voter")
    p.add_argument("--fake-gpus", metavar="SPEC",
                   help='simulate GPUs where NVML is absent, e.g. "H100,RTX 4090" or "2xA100"')
    p.add_argument("--fake-gpu-load", metavar="INDEX=UTIL[/MEM]", action="append",
                   help="hold a simulated GPU busy whatever runs on it, in percent (repeatable), e.g. 0=100/90: "
                        "GPU 0 at 100 %% utilization with 90 %% of its memory used")
    p.add_argument("--resource", metavar="NAME=AMOUNT", action="append",
                   help="declare a resource jobs can request (repeatable), like Ray's --resources: nvlink=1; "
                        "cpus=N and memory_gib=G set the CPUs and memory this node gives to jobs")
    p.add_argument("--catalog", metavar="FILE",
                   help="job catalog (TOML); its digest is gossiped and mismatches flagged")
    p.add_argument("--no-mdns", action="store_true", help="disable mDNS announcement and browsing")
    p.add_argument("--mdns-interface", action="append", metavar="ADDR",
                   help="IPv4 address of an interface mDNS uses (repeatable)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="log verbosity (default info)")
    p.add_argument("--gossip-profile", choices=["lan", "wan", "local-test"],
                   help="failure-detection timings (default lan; see docs/configuration.md)")
