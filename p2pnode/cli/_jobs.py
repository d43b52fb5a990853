"""``p2pnode jobs [run|stop|logs|history|predict]``: jobs across the cluster (running, pending and refused with
reasons, history), the operator's one-off runs, stops and logs (a vanished node's from a durable member's replica of
its job archive), the cluster's job history (:mod:`._jobs_history`) and the fleet's predictions
(:mod:`._jobs_predict`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ._client import fetch_view, get_json, http_get, list_members, post_json, report, url_of
from ._jobs_history import add_history_parser
from ._jobs_predict import add_predict_parser
from ._screen import fmt_age

RUN_WAIT_S = 30.0
"""How long ``p2pnode jobs run`` follows its request by default (seconds)."""
NOT_RUN_STATUS = 125
"""``p2pnode jobs run --wait``'s exit status when the job did not run to an exit of its own
(:data:`p2pnode.node._runs.NOT_RUN_STATUS`)."""
TIMEOUT_STATUS = 124
"""``p2pnode jobs run --wait --wait-timeout S``'s exit status when the run still runs after S seconds."""
DETACHED_STATUS = 130
"""``p2pnode jobs run --wait``'s exit status when Ctrl-C detached it (the shell's 128 + SIGINT)."""
POLL_S = 0.5

__all__ = ["add_jobs_parser"]


def add_jobs_parser(sub: Any, default_url: str) -> None:
    p = sub.add_parser("jobs", help="jobs across the cluster: running, pending and refused with reasons, history")
    p.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
    p.add_argument("--json", action="store_true", help="print the raw /jobs JSON")
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--watch", action="store_true", help="redraw in place every --interval seconds until Ctrl-C")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between redraws with --watch (default 2)")
    p.set_defaults(func=_cmd_jobs)
    jsub = p.add_subparsers(dest="jobs_command")
    jr = jsub.add_parser("run", help="run a template once, through the leader's plan and the node's admission",
                         description="Run one instance of a catalog template now (job id run-<id>), placed by the "
                         "leader on --node, on a node tagged --tag, or anywhere. The request is kept by the node it "
                         "concerns (--node, else the agent at --url) until the job starts: it survives a leader "
                         "failover and an agent restart.")
    jr.add_argument("template")
    jr.add_argument("--param", action="append", metavar="KEY=VALUE", help="a template parameter (repeatable)")
    where = jr.add_mutually_exclusive_group()
    where.add_argument("--node", metavar="ID", help="the node to run on (a unique id prefix)")
    where.add_argument("--tag", metavar="TAG", help="run on a node carrying this tag")
    jr.add_argument("--wait", nargs="?", const=True, default=None, type=_wait_value, metavar="SECONDS",
                    help="wait for the run's outcome and exit with the job's own exit status, 128+N when signal N "
                    f"killed it, {NOT_RUN_STATUS} (the reason on stderr) when it was refused, stopped, could not be "
                    "placed within --wait-timeout or its node was lost; Ctrl-C detaches (the run goes on). "
                    "Given SECONDS (the older form), only follow the request until it starts, is refused, or the "
                    f"leader says why it waits, at most that long (without --wait: {RUN_WAIT_S:g} s; 0: return at "
                    "once); exit 1 when it was refused or can never be placed")
    jr.add_argument("--wait-timeout", type=_seconds, default=None, metavar="S",
                    help=f"wait (as --wait) but give up after S seconds (exit {NOT_RUN_STATUS} with the leader's "
                    f"reason while it is not placed, {TIMEOUT_STATUS} while it runs); the run is not cancelled")
    jr.add_argument("--json", action="store_true", help="with --wait: print the outcome record (JSON) on stdout")
    jr.__class__ = _RunParser  # (refuses --wait SECONDS with --wait-timeout or --json, and --json without a wait)
    jst = jsub.add_parser("stop", help="stop a running job (on whichever node runs it)")
    jst.add_argument("job_id")
    jl = jsub.add_parser("logs", help="print a job's log from the node that ran it (a gang member's: GANG_ID --rank "
                         "R), or, that node gone, the archived tail a durable member holds")
    jl.add_argument("job_id", help="the job's id, or with --rank a gang's id (its rank 0's job id)")
    jl.add_argument("--rank", type=int, metavar="R", help="the gang member of rank R (docs/gangs.md)")
    jl.add_argument("--follow", "-f", action="store_true", help="keep printing what the job writes")
    add_predict_parser(jsub, default_url)
    add_history_parser(jsub, default_url)
    for sp in (jr, jst, jl):
        sp.add_argument("--url", default=default_url, help=f"agent URL (default {default_url})")
        sp.add_argument("--timeout", type=float, default=5.0)
        sp.set_defaults(func=_cmd_jobs)


def _cmd_jobs(ns: argparse.Namespace) -> int:
    """Running jobs across the cluster, pending work with reasons, refusals with reasons, recent history; with
    ``--watch`` redrawn in place every ``--interval`` seconds until Ctrl-C."""
    if getattr(ns, "jobs_command", None):
        return _cmd_jobs_op(ns)
    if getattr(ns, "watch", False) and not ns.json:
        return _watch_jobs(ns)
    view = fetch_view(ns, "/jobs")
    if isinstance(view, int):
        return view
    data, console = view
    console.print(_jobs_renderable(data))
    return 0


def _watch_jobs(ns: argparse.Namespace) -> int:
    """``p2pnode jobs --watch``: one screen, refreshed in place (rich's Live); a failed read is shown on it and
    retried at the next refresh."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console()
    url = f"{ns.url.rstrip('/')}/jobs"
    try:
        with Live(Text(f"reading {url} ..."), console=console, auto_refresh=False, screen=False) as live:
            while True:
                try:
                    resp = http_get(url, ns.timeout)
                    resp.raise_for_status()
                    shown = _jobs_renderable(resp.json(), footer=f"{url} at {time.strftime('%H:%M:%S')}, every "
                                                                 f"{ns.interval:g} s (Ctrl-C to quit)")
                except Exception as exc:  # noqa: BLE001 - any failed read is shown and retried
                    shown = Text(f"cannot read {url}: {exc} (retrying every {ns.interval:g} s)")
                live.update(shown, refresh=True)
                time.sleep(ns.interval)
    except KeyboardInterrupt:
        return 0


def ended_by(run: dict) -> str:
    """The ``ended by`` column of a ``/jobs`` history entry: the stop rule's name when a rule stopped it
    (``max_runtime``, ``gang_ended``, ...), else its outcome (``completed``, ``failed``, ``lost``); ``""`` while it
    runs, ``-`` for a run an agent recorded before rules and outcomes were kept."""
    if not run.get("ended_at"):
        return ""
    return str(run.get("rule") or run.get("outcome") or "-")


def goodput_table(goodput: dict):
    """The ``goodput`` of ``/jobs`` (issue 41): per config, the training time here, the time lost to interruptions
    (work since the newest checkpoint a replica held; ``*``: a late confirmation may still take part back), the time
    fetching checkpoints, the interruptions by cause and the goodput ((run - lost) / (run + fetch))."""
    from rich.table import Table

    t = Table(title="goodput of trainings on this node")
    for col in ("config", "ran", "lost", "fetching", "runs", "interrupted", "goodput"):
        t.add_column(col)
    for config, g in sorted(goodput.items()):
        lost = fmt_age(g.get("lost_s")) + ("*" if g.get("lost_unsettled_s") else "")
        why = ", ".join(f"{k} {n}" for k, n in sorted((g.get("interrupted") or {}).items())) or "-"
        ratio = g.get("goodput")
        t.add_row(config, fmt_age(g.get("run_s")), lost, fmt_age(g.get("fetch_s")), str(g.get("runs", 0)), why,
                  "-" if ratio is None else f"{100 * ratio:.1f}%")
    return t


def _jobs_renderable(data: dict, footer: str = ""):
    """The ``p2pnode jobs`` screen for a ``/jobs`` document, as one rich renderable."""
    from rich.console import Group
    from rich.table import Table

    parts: list = [f"[bold]leader[/] {data.get('leader') or 'none'}  [bold]term[/] {data.get('term')}  "
                   f"[bold]this node's offer[/] {data.get('offer')}"
                   + (f"  [bold]CPU offer[/] {data['cpu_offer']}" if "cpu_offer" in data else "")]
    table = Table(title="running")
    for col in ("job", "template", "kind", "node", "GPUs", "gang", "term", "age"):
        table.add_column(col)
    now = time.time()
    for j in sorted(data.get("cluster_running", []), key=lambda j: (j["node_id"], j["job_id"])):
        gpus = ",".join(map(str, j.get("gpus") or [])) or "-"
        if j.get("gpu_fraction") and j["gpu_fraction"] < 1:
            gpus += f" ×{j['gpu_fraction']:g}"
        g = j.get("gang") or {}
        gang = (f"{g.get('id')} rank {g.get('rank')}/{g.get('size')} {g.get('engine', 'process')}"
                f"{' @' + str(g.get('master')) + ':' + str(g.get('master_port')) if g.get('rank') == 0 else ''}"
                if g else "-")
        table.add_row(j["job_id"], j["template"], j.get("kind", ""), j["node_id"], gpus, gang, str(j.get("term")),
                      fmt_age(now - j.get("started_at", now)))
    parts.append(table)
    if data.get("pending"):
        t2 = Table(title="pending")
        for col in ("template", "waiting", "reason"):
            t2.add_column(col)
        for p in data["pending"]:
            t2.add_row(p["template"], fmt_age(p.get("wait_s")), p["reason"])
        parts.append(t2)
    if data.get("waiting"):
        t6 = Table(title="assigned here, waiting to start")
        for col in ("job", "template", "reason"):
            t6.add_column(col)
        for w in data["waiting"]:
            t6.add_row(w["job_id"], w["template"], w["reason"])
        parts.append(t6)
    if data.get("goodput"):
        parts.append(goodput_table(data["goodput"]))
    if data.get("refusing"):
        t5 = Table(title="nodes refusing NORMAL work")
        for col in ("node", "level", "reason"):
            t5.add_column(col)
        for r in data["refusing"]:
            t5.add_row(r["node_id"], str(r["level"]), r["reason"])
        parts.append(t5)
    if data.get("refused"):
        t3 = Table(title="refused")
        for col in ("node", "job", "template", "reason"):
            t3.add_column(col)
        for r in data["refused"]:
            t3.add_row(r["node_id"], r["job_id"], r["template"], r["reason"])
        parts.append(t3)
    if data.get("history"):
        t4 = Table(title="recent runs on this node")
        for col in ("job", "template", "duration", "exit", "ended by", "reason"):
            t4.add_column(col)
        for h in data["history"][:10]:
            dur = (h["ended_at"] or now) - h["started_at"]
            t4.add_row(h["job_id"], h["template"], fmt_age(dur), str(h.get("exit_status")), ended_by(h),
                       h.get("reason") or "running")
        parts.append(t4)
    if footer:
        parts.append(f"[dim]{footer}[/]")
    return Group(*parts)


def _cmd_jobs_op(ns: argparse.Namespace) -> int:
    """``p2pnode jobs run|stop|logs``."""
    import httpx

    what = f"jobs {ns.jobs_command}"
    try:
        if ns.jobs_command == "run":
            params: dict[str, Any] = {}
            for kv in ns.param or ():
                k, sep, v = kv.partition("=")
                if not sep:
                    print(f"p2pnode {what}: --param {kv!r}: expected KEY=VALUE", file=sys.stderr)
                    return 2
                try:
                    params[k] = json.loads(v)  # numbers and booleans typed, the rest a string
                except ValueError:
                    params[k] = v
            url = url_of(ns, ns.node)
            body = {"template": ns.template, "params": params, "node": _full_id(ns, ns.node), "tag": ns.tag or ""}
            try:
                resp = post_json(f"{url}/jobs/run", body, ns.timeout)
            except KeyboardInterrupt:
                print(f"p2pnode {what}: interrupted before the agent answered; the request may be kept (p2pnode "
                      "jobs lists it)", file=sys.stderr)
                return DETACHED_STATUS
            if ns.wait is None and ns.wait_timeout is not None:  # --wait-timeout alone: a wait for the outcome
                ns.wait = True
            if ns.wait is True:
                if resp.status_code != 200:
                    report(resp, what)
                    return NOT_RUN_STATUS
                if not ns.json:
                    report(resp, what)
                return wait_outcome(url, resp.json(), ns.wait_timeout, ns.timeout, as_json=ns.json)
            rc = report(resp, what)
            follow_s = RUN_WAIT_S if ns.wait is None else float(ns.wait)
            if rc or follow_s <= 0:
                return rc
            return _follow_run(url, ns.template, resp.json(), follow_s, ns.timeout)
        if ns.jobs_command == "stop":
            last = placed = None
            for url in _owner_urls(ns, ns.job_id):
                last = post_json(f"{url}/jobs/stop", {"job_id": ns.job_id}, ns.timeout)
                if last.status_code == 409:  # a one-off placed on a node (not withdrawn): try the node running it
                    placed = last
                elif last.status_code != 404:
                    return report(last, what)
            if placed is not None:
                return report(placed, what)
            print(f"p2pnode {what}: job {ns.job_id} runs on no live member", file=sys.stderr)
            return 1
        return _follow_log(ns, what)
    except LookupError as exc:
        print(f"p2pnode {what}: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"p2pnode {what}: cannot reach the agent: {exc}", file=sys.stderr)
        return 2


def run_state(view: dict, template: str, request: dict) -> tuple[str, str]:
    """Where one-off request ``request`` (the answer of ``POST /jobs/run``: ``id``, ``job_id``) of ``template``
    stands in a ``GET /jobs`` view: ``("started", node)``, ``("refused", reason)``, ``("unsatisfiable", reason)``
    (the leader's plan says no node can ever take it), ``("pending", reason)``, or ``("unknown", "")`` (no plan
    names it yet)."""
    job_id = request["job_id"]
    for r in [*view.get("cluster_running", []), *view.get("history", [])]:
        if r.get("job_id") == job_id:
            return "started", str(r.get("node_id") or view.get("node_id") or "")
    for r in view.get("refused", []):
        if r.get("job_id") == job_id:
            return "refused", f"{r.get('node_id', '?')}: {r.get('reason', '')}"
    label = f"{template} (run {request['id']})"
    for x in view.get("pending", []):
        if x.get("template") == label:
            reason = str(x.get("reason", ""))
            return ("unsatisfiable" if reason.startswith("unsatisfiable") else "pending"), reason
    return "unknown", ""


def _follow_run(url: str, template: str, request: dict, wait_s: float, timeout: float) -> int:
    """Follow a one-off request (``p2pnode jobs run --wait``) on the agent at ``url`` until it starts (0), is
    refused or can never be placed (1, the reason on stderr), or ``wait_s`` pass (0: it waits, with the leader's
    reason when there is one)."""
    job_id = request["job_id"]
    deadline = time.monotonic() + wait_s
    state, why = "unknown", ""
    while True:
        view = get_json(f"{url}/jobs", timeout) or {}
        state, why = run_state(view, template, request)
        if state == "started":
            print(f"p2pnode jobs run: {job_id} started on {why}", file=sys.stderr)
            return 0
        if state in ("refused", "unsatisfiable"):
            print(f"p2pnode jobs run: {job_id} {'was refused on ' if state == 'refused' else 'cannot be placed: '}"
                  f"{why}" + ("" if state == "refused" else f" (it stays requested, for a node that fits and "
                                                             f"joins; withdraw it: p2pnode jobs stop {job_id})"),
                  file=sys.stderr)
            return 1
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    print(f"p2pnode jobs run: {job_id} waits: {why or 'no leader plan names it yet'} (after {wait_s:g} s; "
          "`p2pnode jobs` shows it)", file=sys.stderr)
    return 0


class _RunParser(argparse.ArgumentParser):
    """``jobs run``'s parser: the older ``--wait SECONDS`` takes neither ``--wait-timeout`` nor ``--json``, and
    ``--json`` needs a wait for the outcome (``--wait`` or ``--wait-timeout``): an error, not silently ignored."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        ns, rest = super().parse_known_args(args, namespace)
        seconds = getattr(ns, "wait", None) not in (None, True)
        if seconds and getattr(ns, "wait_timeout", None) is not None:
            self.error("--wait SECONDS (the older form) takes no --wait-timeout: write --wait --wait-timeout S")
        if getattr(ns, "json", False) and (seconds or (ns.wait is None and ns.wait_timeout is None)):
            self.error("--json prints the outcome record: it needs --wait (without SECONDS) or --wait-timeout")
        return ns, rest


def _seconds(text: str) -> float:
    """``--wait-timeout S``: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be finite and >= 0")
    return value


def _wait_value(text: str) -> float:
    """``--wait SECONDS`` (the older form): a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (write --wait after the template: "
                                         "`p2pnode jobs run TEMPLATE --wait`)") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be finite and >= 0")
    return value


def outcome_line(record: dict) -> str:
    """One line saying how run ``record`` (``GET /jobs/runs?id=<id>``) ended, for stderr."""
    job_id, state, node = record.get("job_id", "?"), record.get("state", "?"), record.get("node") or "?"
    if state == "exited":
        return f"{job_id} exited with status {record.get('exit_code')} on {node}"
    if state == "killed":
        return f"{job_id} was killed by signal {record.get('signal')} on {node}"
    rule = f" (rule {record['rule']})" if record.get("rule") else ""
    return f"{job_id} {state}: {record.get('reason') or 'no reason given'}{rule}"


def wait_outcome(url: str, request: dict, wait_timeout_s: float | None, timeout: float, *, as_json: bool = False,
                 clock=time.monotonic, sleep=time.sleep) -> int:
    """``p2pnode jobs run --wait``: poll ``GET /jobs/runs?id=<id>`` on the requesting agent at ``url`` until the run
    is final, and return its exit status (``exit_status`` of the record: the job's own, 128 + N for signal N,
    :data:`NOT_RUN_STATUS` for a refusal, a stop or a lost node, the reason on stderr). After ``wait_timeout_s``
    (None: never) it gives up without cancelling the run: :data:`NOT_RUN_STATUS` with the leader's reason while
    it is not placed, :data:`TIMEOUT_STATUS` while it runs. Ctrl-C detaches (:data:`DETACHED_STATUS`), printing
    the run's id. An agent it cannot reach is retried until the timeout."""
    job_id = request["job_id"]
    deadline = None if wait_timeout_s is None else clock() + max(0.0, wait_timeout_s)
    record: dict = {}
    try:
        while True:
            try:
                resp = http_get(f"{url}/jobs/runs?id={request['id']}", timeout)
                if resp.status_code == 404:
                    print(f"p2pnode jobs run: the agent at {url} keeps no outcome of {job_id}: {resp.text[:200]}",
                          file=sys.stderr)
                    return NOT_RUN_STATUS
                if resp.status_code == 200:
                    record = resp.json()
                elif 400 <= resp.status_code < 500:  # unauthenticated, a bad id: waiting will not change it
                    print(f"p2pnode jobs run: cannot read {job_id}'s outcome ({resp.status_code}): "
                          f"{resp.text[:200]}", file=sys.stderr)
                    return 2
            except Exception as exc:  # noqa: BLE001 - the agent may restart: retried until the timeout
                print(f"p2pnode jobs run: cannot read {job_id}'s outcome yet: {exc}", file=sys.stderr)
            if record.get("final"):
                if as_json:
                    print(json.dumps(record))
                status = record.get("exit_status")
                code = status if isinstance(status, int) else NOT_RUN_STATUS
                print(f"p2pnode jobs run: {outcome_line(record)}", file=sys.stderr)
                return code
            if deadline is not None and clock() >= deadline:
                return _waited_out(url, request, record, wait_timeout_s or 0.0, timeout, as_json)
            sleep(POLL_S)
    except KeyboardInterrupt:
        print(f"p2pnode jobs run: detached from {job_id}; it goes on (its outcome: GET {url}/jobs/runs?id="
              f"{request['id']}; p2pnode jobs stop {job_id} stops it)", file=sys.stderr)
        return DETACHED_STATUS


def _waited_out(url: str, request: dict, record: dict, waited_s: float, timeout: float, as_json: bool) -> int:
    """``--wait-timeout`` passed: say where the run stands (running on a node, or why the leader does not place
    it) and that it still goes on."""
    job_id = request["job_id"]
    if as_json:
        print(json.dumps(record))
    if record.get("state") == "running":
        print(f"p2pnode jobs run: {job_id} still runs on {record.get('node')} after {waited_s:g} s (the wait "
              f"timeout does not stop it: p2pnode jobs stop {job_id})", file=sys.stderr)
        return TIMEOUT_STATUS
    try:
        resp = http_get(f"{url}/jobs", timeout)
        view = resp.json() if resp.status_code == 200 else {}
    except Exception:  # noqa: BLE001 - the reason is a courtesy
        view = {}
    _, why = run_state(view, str(record.get("template") or ""), request)
    print(f"p2pnode jobs run: {job_id} could not be placed within {waited_s:g} s: "
          f"{why or 'no leader plan names it yet'}; it still waits (id {job_id}; withdraw it: p2pnode jobs stop "
          f"{job_id})", file=sys.stderr)
    return NOT_RUN_STATUS


def _full_id(ns: argparse.Namespace, prefix: str | None) -> str:
    if not prefix:
        return ""
    return next(m["id"] for m in list_members(ns) if m["id"].startswith(prefix))


def _owner_urls(ns: argparse.Namespace, job_id: str) -> list[str]:
    """URLs to try for the node running or having run ``job_id``: the owner the agent's ``/jobs`` names first,
    then every live member (alive ones before suspect ones; a durable member may hold a vanished node's log)."""
    base = ns.url.rstrip("/")
    urls: list[str] = []
    try:
        jobs = http_get(f"{base}/jobs", ns.timeout).json()
        members = {m["id"]: m for m in list_members(ns)}
        for r in jobs.get("cluster_running", []):
            if r.get("job_id") == job_id and r.get("node_id") in members:
                m = members[r["node_id"]]
                if m.get("self") or not m.get("addr_refused"):  # never an address the agent refuses to dial
                    urls.append(base if m.get("self") else f"http://{m['addr']}")
        for state in ("alive", "suspect"):  # a suspect member last: it may be gone
            urls += [base if m.get("self") else f"http://{m['addr']}" for m in members.values()
                     if m.get("addr") and not m.get("addr_refused") and m.get("state") == state]
    except (ValueError, KeyError, TypeError):
        urls.append(base)
    return list(dict.fromkeys(urls))


def _gang_member(ns: argparse.Namespace) -> str | None:
    """The job id of gang ``ns.job_id``'s member of rank ``ns.rank``, from the cluster's running jobs."""
    data = get_json(f"{ns.url.rstrip('/')}/jobs", ns.timeout) or {}
    for j in data.get("cluster_running", []):
        g = j.get("gang") or {}
        if g.get("id") == ns.job_id and g.get("rank") == ns.rank:
            return str(j["job_id"])
    return None


def _follow_log(ns: argparse.Namespace, what: str) -> int:
    """``p2pnode jobs logs JOB_ID [--follow]``: the log from the node that has it; ``--follow`` polls for more
    every second until interrupted."""
    import time as _time

    if getattr(ns, "rank", None) is not None:
        found = _gang_member(ns)
        if found is None:
            print(f"p2pnode {what}: no running member of rank {ns.rank} in gang {ns.job_id}", file=sys.stderr)
            return 1
        ns.job_id = found
    import httpx

    url = None
    for candidate in _owner_urls(ns, ns.job_id):
        try:
            r = http_get(f"{candidate}/jobs/logs?job_id={ns.job_id}&offset=0", ns.timeout)
        except httpx.HTTPError:  # a member gone (suspect still): the next one may hold its log (issue 41)
            continue
        if r.status_code == 200:
            url = candidate
            break
    if url is None:
        print(f"p2pnode {what}: no live member has a log of job {ns.job_id} (its own, or a replica of its node's "
              "job archive)", file=sys.stderr)
        return 1
    offset = 0
    try:
        while True:
            r = http_get(f"{url}/jobs/logs?job_id={ns.job_id}&offset={offset}", ns.timeout)
            if r.status_code != 200:
                return report(r, what)
            sys.stdout.buffer.write(r.content)
            sys.stdout.flush()
            offset += len(r.content)
            if offset < int(r.headers.get("x-log-size", offset)):
                continue
            if not ns.follow:
                return 0
            _time.sleep(1.0)
    except KeyboardInterrupt:
        return 0
