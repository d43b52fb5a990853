"""Prometheus families of trainings that survive preemption (issue 41): held stops and their outcomes, the
interruption probe's runs, and goodput per config. Read at scrape time from the job surface's figures."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..node._goodput import ConfigGoodput
from ..node._notice import PROBE_OUTCOMES

__all__ = ["checkpoint_warnings", "goodput"]


def checkpoint_warnings(warnings: Mapping[str, int], probes: Mapping[str, int]) -> Iterator[Metric]:
    """Stops held for a checkpoint by outcome (``warnings``), and the interruption probe's runs by outcome
    (``probes``; none without a probe: no family)."""
    warned = CounterMetricFamily("p2pnode_checkpoint_warnings", "Stops held for a checkpoint since start: "
                                 "signalled, then released on a durable replica (confirmed), on the local "
                                 "checkpoint with no durable member (local), or at the deadline", labels=["outcome"])
    for outcome in ("signalled", "confirmed", "local", "deadline"):
        warned.add_metric([outcome], warnings.get(outcome, 0))
    yield warned
    if probes:  # a node with an interruption probe only
        fam = CounterMetricFamily("p2pnode_interruption_probes", "Runs of agent.interruption_probe since start, by "
                                  "outcome (a failed, timed-out, too long or malformed run is never a notice)",
                                  labels=["outcome"])
        for outcome in PROBE_OUTCOMES:
            fam.add_metric([outcome], probes.get(outcome, 0))
        yield fam


def goodput(totals: Mapping[str, ConfigGoodput], configs: set[str]) -> Iterator[Metric]:
    """Per training config of this node's catalog (every one from 0, so ``rate()`` sees the first): the seconds its
    trainings ran here, the seconds lost to interruptions (work since the newest checkpoint a replica held; settled
    only: a late confirmation may still take back the newest runs' part, ``GET /jobs`` ``goodput`` shows it) and the
    seconds spent fetching its checkpoint (:mod:`p2pnode.node._goodput`); and the goodput ratio where defined."""
    run = CounterMetricFamily("p2pnode_training_seconds", "Seconds trainings of the config ran on this node "
                              "(runs under way up to now)", labels=["config"])
    lost = CounterMetricFamily("p2pnode_training_lost_seconds", "Seconds of training lost to interruptions on this "
                               "node: from the newest checkpoint a replica held (else the run's start) to the stop",
                               labels=["config"])
    fetch = CounterMetricFamily("p2pnode_checkpoint_fetch_seconds", "Seconds trainings of the config spent "
                                "fetching its newest checkpoint on this node before they started", labels=["config"])
    ratio = GaugeMetricFamily("p2pnode_training_goodput_ratio", "(run - lost) / (run + fetch) of the config's "
                              "trainings on this node, 0-1 (only once they held the node)", labels=["config"])
    for config in sorted(configs):
        c = totals.get(config)
        run.add_metric([config], c.run_s if c is not None else 0.0)
        lost.add_metric([config], c.lost_s - c.lost_unsettled_s if c is not None else 0.0)
        fetch.add_metric([config], c.fetch_s if c is not None else 0.0)
        if c is not None and c.goodput is not None:
            ratio.add_metric([config], c.goodput)
    yield from (run, lost, fetch, ratio)
