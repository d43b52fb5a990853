"""Deterministic simulator: the agent's membership and election cores on a virtual clock and a seeded
in-memory network (loss, latency, partitions), plus the push-pull spread model at any N.

``p2pnode simulate`` runs :func:`simulate` and prints :func:`format_report`; the same seed gives the same
figures (wall times aside).
"""

from __future__ import annotations

from ._autoscale import compare_autoscale, format_autoscale_report, run_autoscale
from ._cluster import ClusterSim
from ._experiments import profile, run_cluster, run_partitions, run_spread, wire_sizes
from ._false_voters import run_false_voters
from ._goodput import format_goodput_report, parse_lifetimes, run_goodput, simulate_goodput
from ._sched import greedy_first_fit, run_scheduling
from ._spread import serf_fraction, serf_rounds_to, simulate_spread
from ._stops import StopsConfig
from ._swim import SwimCluster, detection, memberlist_detection_s

__all__ = [
    "ClusterSim",
    "compare_autoscale",
    "format_autoscale_report",
    "run_autoscale",
    "format_goodput_report",
    "format_report",
    "format_scheduling_report",
    "greedy_first_fit",
    "parse_lifetimes",
    "run_goodput",
    "run_scheduling",
    "run_cluster",
    "run_false_voters",
    "run_partitions",
    "run_spread",
    "serf_fraction",
    "serf_rounds_to",
    "simulate",
    "simulate_goodput",
    "StopsConfig",
    "SwimCluster",
    "detection",
    "memberlist_detection_s",
    "simulate_spread",
    "wire_sizes",
]

MAX_CLUSTER_NODES = 10000
"""Above this N the cluster experiments (N² version vectors and N member tables per node) are skipped. At 10,000 they
take about 8 GiB (columnar member tables, 66 bytes a member per node: docs/benchmarks.md)."""


def simulate(
    *,
    nodes: int = 1000,
    fanout: int = 3,
    interval_s: float = 1.0,
    loss: float = 0.0,
    latency_ms: float = 1.0,
    seed: int = 0,
    gossip_profile: str = "lan",
    cluster_nodes: int | None = None,
    partition_runs: int = 20,
    partition_nodes: int = 15,
    swim_nodes: int = 100,
    push_pull_s: float = 0.0,
) -> dict:
    """Run every experiment and return the figures as one JSON-ready dict.

    ``nodes`` drives the spread experiment; ``cluster_nodes`` (default: ``nodes``, skipped above
    :data:`MAX_CLUSTER_NODES`) the leader agreement, steady-state rates, false suspicions and kill experiments;
    ``partition_runs`` random splits of ``partition_nodes`` nodes check the election's safety; SWIM detection
    (:func:`p2pnode.sim._swim.detection`: real probe and membership cores) runs at ``min(cluster N, swim_nodes)``
    (0: skipped; its full-N cost is bench material: N = 1,000 takes minutes). ``push_pull_s`` > 0: the cluster
    experiments send partial digests between full push-pulls of that base interval (:class:`ClusterSim`).
    """
    import time

    t0 = time.perf_counter()
    cfg = profile(gossip_profile, interval_s)
    latency_s = latency_ms / 1000.0
    out: dict = {
        "params": {
            "nodes": nodes, "fanout": fanout, "interval_s": interval_s, "loss": loss, "latency_ms": latency_ms,
            "seed": seed, "gossip_profile": gossip_profile, "push_pull_s": push_pull_s,
        },
        "spread": run_spread(nodes, fanout=fanout, loss=loss, interval_s=interval_s, seed=seed),
    }
    cn = nodes if cluster_nodes is None else cluster_nodes
    if cn > MAX_CLUSTER_NODES:
        out["cluster"] = {"skipped": f"cluster experiments need N <= {MAX_CLUSTER_NODES}; use --cluster-nodes"}
    else:
        out["cluster"] = run_cluster(cn, fanout=fanout, loss=loss, latency_s=latency_s, cfg=cfg, seed=seed,
                                     push_pull_s=push_pull_s)
    if partition_runs > 0:
        out["partitions"] = run_partitions(
            partition_runs, partition_nodes, fanout=fanout, loss=loss, latency_s=latency_s, cfg=cfg, seed=seed
        )
    sn = min(cn, swim_nodes)
    if sn >= 2:
        t1 = time.perf_counter()
        out["swim"] = detection(sn, seed=seed, loss=loss, cfg=cfg)
        out["swim"]["wall_s"] = round(time.perf_counter() - t1, 2)
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    return out


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def format_report(r: dict) -> str:
    """Human-readable report of :func:`simulate`'s figures."""
    p, sp = r["params"], r["spread"]
    lines = [
        f"p2pnode simulate: N={p['nodes']} fanout={p['fanout']} interval={p['interval_s']}s loss={p['loss']:.0%} "
        f"latency={p['latency_ms']}ms seed={p['seed']} profile={p['gossip_profile']}",
        "",
        "Fresh update, push-pull anti-entropy       50%    99%  99.9%   100%",
        "  simulated rounds                    " + "".join(f"{_fmt(v):>7}" for v in sp["rounds"].values()),
        "  simulated seconds                   " + "".join(f"{_fmt(v):>7}" for v in sp["seconds"].values()),
        "  Serf estimate, rounds               "
        + "".join(f"{_fmt(v):>7}" for v in sp["serf_estimate_rounds"].values()),
        f"  (Serf: 1/(1+(N+1)e^(-b x)), b = 0.5 x fanout x (1-loss); messages/node/round "
        f"{sp['messages_per_node_per_round']:.2f}; wall {sp['wall_s']} s)",
    ]
    c = r.get("cluster", {})
    if "skipped" in c:
        lines += ["", f"Cluster experiments: {c['skipped']}"]
    elif c:
        rates = c["rates_steady"]
        lines += [
            "",
            f"Cluster of {c['n']} real membership + election cores (voters: {c['voters']}, loss {c['loss']:.0%}, "
            + (f"partial digests, full push-pull base {c['push_pull_s']:g} s)" if c.get("push_pull_s")
               else "full digests)"),
            f"  time to agree on a leader (fresh start)      {_fmt(c['agree_on_leader_s'])} s",
            f"  kill -9 of the leader: dead everywhere after  {_fmt(c['killed_leader_dead_everywhere_s'])} s",
            f"  ... new leader agreed after                  {_fmt(c['new_leader_agreed_s'])} s",
            f"  false suspicions / false deaths in {c['steady_s']:g} s    "
            f"{c['false_suspicions']} / {c['false_deaths']}",
            f"  distinct leaders per term, max               {c['max_leaders_per_term']}",
            f"  per node per second: messages {rates['messages_per_node_per_s']:.2f}, "
            f"bytes {rates['bytes_per_node_per_s']:,.0f}, "
            f"signature verifications {rates['verifications_per_node_per_s']:.1f}",
            f"  wall {c['wall_s']} s",
        ]
    pt = r.get("partitions")
    if pt:
        v = pt["violations"]
        lines += [
            "",
            f"Partitions: {pt['runs']} seeded random splits of {pt['n']} nodes (every third cuts off the strongest)",
            f"  runs with two leaders in one term            {v['two_leaders_in_a_term']}",
            f"  runs with a leader on the minority side      {v['leader_on_minority']}",
            f"  runs not healed (one leader, all alive)      {v['not_healed']}",
            f"  majority side has its own leader after <=    {_fmt(pt['majority_side_leader_s_max'])} s",
            f"  healing to one leader: mean {_fmt(pt['heal_s_mean'])} s, max {_fmt(pt['heal_s_max'])} s; "
            f"wall {pt['wall_s']} s",
        ]
    sw = r.get("swim")
    if sw:
        parts = sw["memberlist_parts"]
        lines += [
            "",
            f"SWIM probes: {sw['nodes']} real probe + membership cores, one node killed (loss {sw['loss']:.0%}, "
            f"news push {'on' if sw['push'] else 'off'})",
            f"  suspect: first observer {_fmt(sw['suspect_first_s'])} s, every survivor {_fmt(sw['suspect_all_s'])} s",
            f"  dead: first observer {_fmt(sw['dead_first_s'])} s, every survivor {_fmt(sw['dead_all_s'])} s",
            f"  memberlist's bound {_fmt(sw['memberlist_formula_s'])} s = first probe {_fmt(parts['first_probe_s'])} + "
            f"failed probe {_fmt(parts['failed_probe_s'])} + suspicion {_fmt(parts['suspicion_s'])} + dead message "
            f"{parts['dissemination_rounds']} rounds {_fmt(parts['dissemination_s'])} s",
            f"  false suspicions / deaths (per observer) {sw['false_suspicions']} / {sw['false_deaths']}; wall "
            f"{sw['wall_s']} s",
            f"  per node per second: probe packets {sw['packets_per_node_s']:.2f} "
            f"({sw['probe_bytes_per_node_s']:,.0f} bytes), exchanges {sw['exchanges_per_node_s']:.2f} "
            f"(pushes {sw['push_exchanges_per_node_s']:.2f}), snapshot versions verified "
            f"{sw['verifications_per_node_s']:.1f} ({sw['snapshot_bytes_per_node_s']:,.0f} bytes)",
        ]
    lines += ["", f"total wall time {r['wall_s']} s"]
    return "\n".join(lines)


def format_scheduling_report(r: dict) -> str:
    """Human-readable report of :func:`run_scheduling`'s figures."""
    pm, gm = r["plan_ms"], r["greedy_first_fit_ms"]
    lines = [
        f"p2pnode simulate --scenario scheduling: {r['nodes']} nodes ({r.get('inventory', 'random')} inventory), "
        f"{r['configs']} configs "
        f"({r['templates']} templates), {r['duration_s']:g} s in {r['interval_s']:g} s plans, leader failover at "
        f"half time (final term {r['final_term']})",
        "",
        f"  plan time: median {pm['median']} ms, p99 {pm['p99']} ms, max {pm['max']} ms",
        f"  greedy first-fit baseline, same views: median {gm['median']} ms, p99 {gm['p99']} ms "
        f"(median ratio {r['ratio_median_vs_greedy']}x)",
        "  GPU utilization per tier (mean over GPUs after warm-up, band 60-80 %):",
    ]
    for tier, u in r["util_by_tier"].items():
        lines.append(f"    tier {tier}: {u['mean_util_percent']} % {'in band' if u['in_band'] else 'OUT OF BAND'}")
    if r.get("training_on_durable_percent") is not None:
        lines.append(f"  training GPU time on durable nodes ([policy] stable): {r['training_on_durable_percent']} %")
    lines += [
        f"  quota error per config (tier-1 share vs quota): mean {r['quota_error_mean']}, max {r['quota_error_max']}",
        f"  longest wait of any config: {r['longest_wait_s']:g} s (starvation cap {r['starvation_cap_s']:g} s)",
    ]
    if "wait_s" in r:
        g, s1 = r["wait_s"]["gang"], r["wait_s"]["single"]
        lines.append(f"  wait before placement: gangs ({r['gang_templates']} templates of 2-8 members, all or nothing) "
                     f"p50 {g['p50']:g} s, p99 {g['p99']:g} s over {g['placements']}; single jobs p50 {s1['p50']:g} s, "
                     f"p99 {s1['p99']:g} s over {s1['placements']}")
    if r.get("vram_committed_percent") is not None:
        by_tier = ", ".join(f"tier {k} {v} %" for k, v in r["vram_committed_percent_by_tier"].items())
        lines.append(f"  VRAM committed on a busy GPU, of its usable VRAM (gpu_max_percent {r['gpu_max_percent']:g} "
                     "%): "
                     f"{r['vram_committed_percent']} % ({by_tier}); busy-GPU samples under 90 %: "
                     f"{100 * r['busy_gpus_under_90_percent']:.1f} %; GPUs whose free share fits waiting work at two "
                     f"samples in a row: {r['stranded_gpu_samples']} ({100 * r['stranded_share']:.2f} % of samples)")
    lines += _stops_lines(r)
    lines.append(f"  invariant violations (gangs whole, never partly preempted, one training per config, ...): "
                 f"{r['violation_count']}")
    lines += [f"    {v}" for v in r["violations"]]
    return "\n".join(lines)


def _stops_lines(r: dict) -> list[str]:
    """The report's lines on stops (by rule), refusals (by reason), drains and job-table transition errors."""
    if "stops_by_rule" not in r:
        return []
    rules = ", ".join(f"{k} {v}" for k, v in r["stops_by_rule"].items()) or "none"
    refusals = ", ".join(f"{k!r} {v}" for k, v in r["refusals_by_reason"].items()) or "none"
    lines = [f"  stops by rule: {rules}", f"  refusals (admission conflicts) by reason: {refusals}"]
    d = r["drains"]
    if d["nodes_drained"]:
        tte = d["time_to_empty_s"]
        emptied = (f"{d['nodes_emptied']} emptied (time to empty median {tte['median']:g} s, max {tte['max']:g} s)"
                   if tte else "none emptied yet")
        lines.append(f"  drains (deadline {d['drain_deadline_s']:g} s): {d['nodes_drained']} nodes drained, "
                     f"{d['jobs_stopped_by_drain']} jobs stopped by the drain, {emptied}")
    lines.append(f"  job-table transition errors (every node): {r['transition_errors']}")
    return lines
