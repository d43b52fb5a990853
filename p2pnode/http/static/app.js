// p2pnode dashboard: polls ui/state every 1.5 s and redraws; asks members with its ETag (304: the table stays).
// No framework, no build step, no other origin.
// Every value from the cluster reaches the page through textContent or an SVG attribute, never as markup.
"use strict";

(function () {
  const POLL_MS = 1500;
  const TOKEN_KEY = "p2pnode.read_token";
  const SVG = "http://www.w3.org/2000/svg";
  const LEVELS = ["normal", "light", "moderate", "heavy", "critical"];

  let series = [];          // rows of the series, oldest first (columns: fields)
  let fields = [];
  let windowS = 900;
  let lastOk = 0;
  let timer = null;
  let members = [];         // rows of GET /members, leader first, then by state and id
  let membersTag = null;    // their ETag (sent as If-None-Match)
  let membersDrawn = null;  // the ETag of the rows the table shows
  const STATE_ORDER = { alive: 0, suspect: 1, dead: 2 };

  // -- small helpers -------------------------------------------------------------------------------------------
  function $(id) { return document.getElementById(id); }

  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (v === undefined || v === null || v === false) continue;
        if (k === "class") e.className = v;
        else if (k === "text") e.textContent = v;
        else e.setAttribute(k, v === true ? "" : String(v));
      }
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fill(tbody, rows, cols, empty) {
    const body = typeof tbody === "string" ? $(tbody).tBodies[0] : tbody;
    if (!rows.length) {
      body.replaceChildren(el("tr", null, el("td", { class: "none", colspan: cols }, empty)));
    } else {
      body.replaceChildren(...rows);
    }
  }

  function short(id) { return id ? (id.length > 12 ? id.slice(0, 12) : id) : "–"; }

  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0;
    let v = Number(n);
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
  }

  function pair(used, total) {
    // "used / total unit", both in the unit of the total: "0.9 / 23.5 GiB"
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0;
    let scale = 1;
    while (Number(total) / scale >= 1024 && i < units.length - 1) { scale *= 1024; i++; }
    const f = (v) => { v = Number(v || 0) / scale; return v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1); };
    return f(used) + " / " + f(total) + " " + units[i];
  }

  function gib(n) { return (Number(n || 0) / 1073741824).toFixed(0); }

  function mmss(s) {
    const r = Math.round(s);
    return Math.floor(r / 60) + ":" + String(r % 60).padStart(2, "0");
  }

  function pct(part, whole) { return whole ? Math.max(0, Math.min(100, 100 * part / whole)) : 0; }

  function dur(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    s = Math.max(0, s);
    if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
    if (s < 3600) return Math.floor(s / 60) + " m " + Math.floor(s % 60) + " s";
    if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " m";
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }

  function bar(value, label, cls, title) {
    const b = el("div", { class: "bar" + (cls ? " " + cls : ""), title: title });
    const s = el("span");
    s.style.width = Math.max(0, Math.min(100, value)).toFixed(1) + "%";
    b.append(s, el("em", null, label));
    return b;
  }

  // -- token (agent.read_token) ---------------------------------------------------------------------------------
  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
  }

  function setToken(t) {
    try {
      if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
    } catch (e) { /* storage disabled: the token lives until the page reloads */ }
  }

  function tokenFromHash() {
    // A link may carry it as #token=...: the fragment never reaches the server; drop it from the address bar.
    const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
    if (m) {
      setToken(decodeURIComponent(m[1]));
      history.replaceState(null, "", location.pathname + location.search);
    }
  }

  // -- connection state -----------------------------------------------------------------------------------------
  function conn(state, text) {
    const c = $("conn");
    c.dataset.state = state;
    c.textContent = text;
    $("auth").hidden = state !== "unauthorized";
  }

  // -- header and totals ----------------------------------------------------------------------------------------
  function renderHeader(s) {
    const c = s.cluster;
    const leader = c.leader;
    const lm = s.members.find((m) => m.id === leader);
    $("leader").textContent = leader ? short(leader) + (lm && lm.addr ? " (" + lm.addr + ")" : "") : "none";
    $("leader").title = leader || "no leader";
    $("leader").dataset.nodeId = leader || "";
    $("term").textContent = c.term;
    $("quorum").textContent = c.quorum + " of " + c.voters + " voters" + (leader ? " · leader has " + (c.votes_for_leader || 0) : "");
    $("quorum").title = "a leader needs the votes of " + c.quorum + " of the " + c.voters + " voters";
    $("trust").textContent = s.node.trust + (s.node.read_protected ? " · read token" : "");
    $("self").textContent = short(s.node.id) + (s.node.addr ? " (" + s.node.addr + ")" : "");
    $("self").title = s.node.id;
    document.title = "p2pnode · " + (s.members.length) + " members · leader " + short(leader);
    $("foot").textContent = "p2pnode " + s.node.agent_version + " · agent up " + dur(s.node.uptime_s) +
      " · updated " + new Date(s.now * 1000).toLocaleTimeString();
  }

  function card(label, value, sub, barValue) {
    return el("div", { class: "card" },
      el("div", { class: "label" }, label),
      el("div", { class: "value" }, value),
      sub ? el("div", { class: "sub" }, sub) : null,
      barValue !== undefined ? bar(barValue, "", barValue >= 90 ? "hot" : "") : null);
  }

  function renderTotals(s) {
    const t = s.totals;
    const by = s.cluster.members_by_state || {};
    const pend = s.jobs ? s.jobs.pending.length : 0;
    const states = ["alive", "suspect", "dead", "left"].filter((k) => by[k]).map((k) => by[k] + " " + k).join(" · ");
    $("totals").replaceChildren(
      card("Members", String(t.members), states),
      card("GPUs busy", t.gpus_busy + " / " + t.gpus_total, "mean util " + t.gpu_util_percent.toFixed(0) + " %",
        pct(t.gpus_busy, t.gpus_total)),
      card("VRAM", gib(t.vram_used_bytes) + " / " + gib(t.vram_total_bytes) + " GiB",
        pct(t.vram_used_bytes, t.vram_total_bytes).toFixed(0) + " % used", pct(t.vram_used_bytes, t.vram_total_bytes)),
      card("CPUs", String(t.cpus), t.cpu_percent.toFixed(0) + " % busy", t.cpu_percent),
      card("Memory", pair(t.mem_used_bytes, t.mem_total_bytes),
        pct(t.mem_used_bytes, t.mem_total_bytes).toFixed(0) + " % used", pct(t.mem_used_bytes, t.mem_total_bytes)),
      card("Jobs", t.jobs_running + " running", s.jobs ? pend + " pending · " + s.jobs.refused.length + " refused"
        : "no catalog"));
  }

  // -- members --------------------------------------------------------------------------------------------------
  function gpuCell(res, full, gone) {
    const gpus = (res && res.gpus) || [];
    if (!gpus.length) return el("td", { class: "none" }, (res && res.gpu_absent_reason) || "no GPU");
    if (gone) {  // a dead or departed member's last readings are not its GPUs' state: names only, no bars
      const names = {};
      for (const g of gpus) names[g.name || "GPU"] = (names[g.name || "GPU"] || 0) + 1;
      return el("td", { class: "none", title: "last reported before it " + gone },
        Object.entries(names).map(([n, k]) => k + " × " + n).join(", "));
    }
    const td = el("td");
    for (const g of gpus) {
      const util = g.util_percent || 0;
      const mem = pct(g.mem_used_bytes || 0, g.mem_total_bytes || 0);
      const power = g.power_w !== undefined && g.power_w !== null ? " · " + g.power_w.toFixed(0) + " W" : "";
      const isFull = full && full.indexOf(g.index || 0) >= 0;
      td.append(el("div", { class: "gpu" },
        el("span", { class: "name", title: (g.name || "") + power }, (g.index || 0) + " " + (g.name || "GPU")),
        bar(util, util.toFixed(0) + " %", util >= 90 ? "hot" : "", "utilization"),
        bar(mem, gib(g.mem_used_bytes) + "/" + gib(g.mem_total_bytes) + " GiB", "mem" + (isFull ? " hot" : ""),
          "memory" + (isFull ? " (over the GPU limit: nothing new is placed here)" : ""))));
    }
    return td;
  }

  function syncCell(sync) {
    const parts = [];
    if (sync.files !== undefined) parts.push(sync.files + (sync.files === 1 ? " file" : " files") + (sync.under_replicated ? ", " + sync.under_replicated + " below R" : ""));
    if (sync.receipts) parts.push(sync.receipts + (sync.receipts === 1 ? " replica held" : " replicas held"));
    return el("td", parts.length ? null : { class: "none" }, parts.join(" · ") || "–");
  }

  function renderAges(s) {
    for (const td of document.querySelectorAll("#members td.age[data-received-at]")) {
      td.textContent = dur(Math.max(0, s.now - Number(td.dataset.receivedAt)));
    }
  }

  const MAX_ROWS = 200;  // member rows drawn at most: a larger fleet shows its summary and the filtered rows

  function tier(m) {  // the member's role, from its (effective) tags
    const tags = m.tags || [];
    for (const t of ["voter", "durable", "ephemeral"]) if (tags.indexOf(t) >= 0) return t;
    return "other";
  }

  function matches(m, q) {  // the filter: a substring of its name, id, provider, instance, tier or state
    if (!q) return true;
    return [m.name, m.id, m.provider, m.instance, tier(m), m.state].some((v) => v && String(v).toLowerCase().includes(q));
  }

  function memberRow(m, s) {
    const r = m.resources || {};
    const gone = m.state === "dead" || m.state === "left";
    const where = [m.provider, m.instance].filter(Boolean).join(" ");
    // The name is the member's own claim: set as text (el() uses textContent and setAttribute), never as markup.
    const node = el("td", { class: "node", title: m.id },
      m.name ? el("span", { class: "name", title: m.name }, m.name) : null,
      el("span", { class: "mono" }, short(m.id)),
      m.leader ? el("span", { class: "mark leader", title: "leader" }, "LEADER") : null,
      m.self ? el("span", { class: "mark self", title: "this page's agent" }, "this") : null,
      m.cordoned ? el("span", { class: "mark held", title: "cordoned: no new work is placed here" }, "cordoned") : null,
      m.draining ? el("span", { class: "mark held", title: "draining: its jobs are being stopped" }, "draining") : null,
      el("span", { class: "addr" }, (m.addr || "") + (where ? " · " + where : "")));
    const lvl = m.level || 0;
    const cpu = r.cpu_count && !gone ? r.cpu_count + " × " + (r.cpu_percent || 0).toFixed(0) + " %" : "–";
    return el("tr", { "data-node-id": m.id, "data-state": m.state, class: gone ? "gone" : "" },
      node,
      el("td", null, el("span", { class: "state " + m.state }, m.state + (m.leaving ? " (leaving)" : ""))),
      el("td", { class: "mono" }, m.incarnation),
      gpuCell(r, m.gpus_full, gone ? (m.state === "dead" ? "died" : "left") : ""),
      el("td", null, Math.round(m.power_score || 0)),
      el("td", null, cpu),
      el("td", null, r.mem_total_bytes && !gone ? pair(r.mem_used_bytes, r.mem_total_bytes) : "–"),
      gone ? el("td", { class: "none" }, "–") : el("td", { title: (m.reasons || []).join("; ") || LEVELS[lvl] },
        el("span", { class: "lvl lvl-" + lvl }, lvl + " " + (m.level_name || LEVELS[lvl]))),
      el("td", null, gone ? "–" : m.running_count || 0),
      el("td", null, ...(m.tags || []).map((t) => el("span", { class: "tag" }, t))),
      syncCell(m.sync || {}),
      el("td", { class: "age", "data-received-at": m.self ? null : m.received_at }, m.self ? "–" : dur(s.now - m.received_at)));
  }

  function renderSummary(all) {  // members by tier and state: one row per tier
    const states = ["alive", "suspect", "dead", "left"];
    const by = {};
    for (const m of all) {
      const t = tier(m);
      by[t] = by[t] || {};
      by[t][m.state] = (by[t][m.state] || 0) + 1;
    }
    const rows = Object.keys(by).sort().map((t) => el("tr", { "data-tier": t }, el("td", null, t),
      ...states.map((st) => el("td", { "data-state": st }, by[t][st] || 0))));
    fill("members-summary", rows, 5, "no member yet");
  }

  let lastState = null;

  function renderMembers(s) {
    lastState = s;
    if (membersDrawn === membersTag && membersTag !== null) {  // unchanged rows (304): only their ages move
      renderAges(s);
      return;
    }
    membersDrawn = membersTag;
    const q = $("members-filter").value.trim().toLowerCase();
    const shown = s.members.filter((m) => matches(m, q));
    const rows = shown.slice(0, MAX_ROWS).map((m) => memberRow(m, s));
    fill("members", rows, 12, q ? "no member matches" : "no member yet");
    renderSummary(s.members);
    $("members-shown").textContent = shown.length > MAX_ROWS ? "first " + MAX_ROWS + " of " + shown.length + " shown"
      : q ? shown.length + " of " + s.members.length + " match" : "";
    const by = s.cluster.members_by_state || {};
    $("members-count").textContent = s.members.length + " (" + Object.entries(by).map(([k, v]) => v + " " + k).join(", ") + ")";
  }

  // -- jobs -----------------------------------------------------------------------------------------------------
  function renderJobs(s) {
    const j = s.jobs;
    if (!j) {
      fill("running", [], 6, "this agent has no catalog (start it with --catalog)");
      fill("pending", [], 3, "–");
      fill("refused", [], 4, "–");
      $("running-count").textContent = $("pending-count").textContent = $("refused-count").textContent = "";
      return;
    }
    const states = {};
    for (const m of s.members) states[m.id] = m.state;
    const running = j.running.slice().sort((a, b) => (a.node_id + a.job_id).localeCompare(b.node_id + b.job_id));
    fill("running", running.map((r) => {
      const st = states[r.node_id] || "alive";
      const gone = st === "dead" || st === "left";
      return el("tr", { "data-job-id": r.job_id, "data-node-id": r.node_id, class: gone ? "gone" : "",
        title: gone ? "last reported by a member now " + st : null },
      el("td", { class: "mono", title: r.node_id }, short(r.node_id) + (gone ? " (" + st + ")" : "")),
      el("td", { class: "mono", title: r.config || "" }, r.job_id),
      el("td", { title: r.gang ? "gang " + r.gang.id + ", " + (r.gang.engine || "process") + ", rendezvous " +
        r.gang.master + ":" + r.gang.master_port : null },
        r.template + (r.gang ? " · gang " + r.gang.id + " rank " + r.gang.rank + "/" + r.gang.size : "")),
      el("td", null, r.kind || ""),
      el("td", null, (r.gpus || []).length ? (r.gpus || []).join(",") + (r.gpu_fraction && r.gpu_fraction < 1 ? " × " + r.gpu_fraction : "") : "–"),
      el("td", null, r.started_at ? dur(s.now - r.started_at) : "–"));
    }), 6, "nothing running");
    const perNode = Object.entries(j.running_counts || {}).filter(([, n]) => n > 0)
      .map(([id, n]) => short(id).slice(0, 6) + ": " + n).join(", ");
    $("running-count").textContent = j.running_total + (perNode ? " — " + perNode : "") +
      (j.running_total > j.running.length ? " (first " + j.running.length + " listed)" : "");
    fill("pending", j.pending.map((p) => el("tr", null,
      el("td", null, p.template), el("td", { class: "reason" }, p.reason || ""), el("td", null, dur(p.wait_s || 0)))),
      3, j.plan ? "nothing pending" : "no plan yet (no leader, or its plan is not fetched)");
    $("pending-count").textContent = j.pending.length + (j.plan ? " · plan " + j.plan.term + "." + j.plan.seq +
      " (" + j.plan.jobs + " placed" + (j.plan.current ? "" : "; newer one on its way") + ")" : "");
    const refused = j.refused.map((r) => el("tr", null,
      el("td", { class: "mono", title: r.node_id }, short(r.node_id)), el("td", null, r.template || r.job_id),
      el("td", { class: "reason" }, r.reason || ""), el("td", null, r.at ? dur(s.now - r.at) + " ago" : "–")));
    for (const m of j.refusing) {
      refused.unshift(el("tr", null, el("td", { class: "mono", title: m.node_id }, short(m.node_id)),
        el("td", null, "(all new work)"), el("td", { class: "reason" }, m.reason), el("td", null, "now")));
    }
    fill("refused", refused, 4, "nothing refused");
    $("refused-count").textContent = String(refused.length);
  }

  // -- sync and events ------------------------------------------------------------------------------------------
  function renderSync(s) {
    const y = s.sync;
    const below = s.members.reduce((n, m) => n + ((m.sync && m.sync.under_replicated) || 0), 0);
    $("sync-summary").textContent = "R = " + y.replication_factor + " (effective " + y.r_effective + "), " +
      y.durable_members + " durable members · cluster: " + below + " files below R";
    fill("sync", y.below_r.map((f) => el("tr", null,
      el("td", { class: "mono" }, f.path), el("td", null, f["class"]), el("td", null, bytes(f.size)),
      el("td", null, f.replicas + " / " + f.r), el("td", null, dur(f.lag_s)), el("td", null, bytes(f.bytes_pending)))),
      6, y.files ? "all " + y.files + " files of this node have R replicas" : "this node pushes no files");
  }

  function renderScaling(s) {
    const sc = s.scaling || {};
    const last = (sc.ledger || []).slice(-1)[0];
    $("scaling-summary").textContent = "provider " + (sc.provider || "none (decisions only)") +
      (sc.cooldown_left_s ? " · cooldown " + Math.round(sc.cooldown_left_s) + " s left" : "") +
      (last ? " · last action " + last.op + " " + (last.op === "up" ? last.count + " × " + last.node_class + ((last.for_templates || []).length ? " for " + last.for_templates.join(", ") : "") : (last.nodes || []).join(", ")) + ": " + last.state : "") +
      ((sc.draining || []).length ? " · draining " + sc.draining.join(", ") : "") +
      ((sc.mismatch || []).length ? " · [scaling] differs on " + sc.mismatch.join(", ") : "");
    fill("scaling", (sc.verdicts || []).map((v) => el("tr", null,
      el("td", { class: "mono" }, v.node_class), el("td", null, String(v.nodes_now)),
      el("td", null, v.utilization === null || v.utilization === undefined ? "–" : Math.round(v.utilization * 100) + " %"),
      el("td", null, String(v.queued)),
      el("td", null, v.verdict === "up" ? "up " + v.count : v.verdict === "down" ? "down " + (v.nodes || []).join(", ") : "hold"),
      el("td", null, v.reason || ""))), 6, (sc.classes || []).length ? "no decision yet" : "no [scaling.classes] configured");
  }

  function renderEvents(s) {
    fill("events", s.events.map((e) => {
      const p = e.payload || {};
      const detail = Object.entries(p).slice(0, 6).map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join(" ");
      return el("tr", null, el("td", null, dur(s.now - e.at) + " ago"),
        el("td", { class: "mono", title: e.node_id }, short(e.node_id)), el("td", null, e.name),
        el("td", { class: "reason" }, detail));
    }), 4, "no recent events");
  }

  // -- time series (hand-written SVG) ---------------------------------------------------------------------------
  function mergeSeries(s) {
    const v = s.series;
    if (!v) return;
    fields = v.fields;
    windowS = v.window_s || windowS;
    const last = series.length ? series[series.length - 1][0] : -Infinity;
    for (const p of v.points) if (p[0] > last) series.push(p);
    const cutoff = s.now - windowS;
    let drop = 0;
    while (drop < series.length && series[drop][0] < cutoff) drop++;
    if (drop) series.splice(0, drop);
  }

  function col(name) { return fields.indexOf(name); }

  function plot(svgEl, lines, yMax, unit, now) {
    const W = 640, H = 170, L = 40, R = 8, T = 8, B = 20;
    const span = Math.min(windowS, Math.max(60, series.length ? now - series[0][0] : 60));
    const x = (t) => L + (W - L - R) * (1 - (now - t) / span);
    const y = (v) => T + (H - T - B) * (1 - Math.min(v, yMax) / yMax);
    const kids = [];
    for (let k = 0; k <= 4; k++) {
      const v = yMax * k / 4;
      kids.push(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
      kids.push(svg("text", { class: "axis", x: L - 4, y: y(v) + 4, "text-anchor": "end" },
        (Number.isInteger(v) ? v : v.toFixed(1)) + unit));
    }
    for (let k = 0; k <= 4; k++) {
      const ago = span * (1 - k / 4);
      kids.push(svg("text", { class: "axis", x: L + (W - L - R) * k / 4, y: H - 4, "text-anchor": k === 0 ? "start" : k === 4 ? "end" : "middle" },
        ago < 1 ? "now" : "−" + (ago >= 60 ? mmss(ago) : Math.round(ago) + " s")));
    }
    if (series.length < 2) {
      kids.push(svg("text", { class: "empty", x: W / 2, y: H / 2, "text-anchor": "middle" }, "collecting samples…"));
    } else {
      for (const line of lines) {
        const pts = series.map((p) => x(p[0]).toFixed(1) + "," + y(line.value(p)).toFixed(1)).join(" ");
        kids.push(svg("polyline", { class: "line " + line.cls, points: pts }));
      }
    }
    svgEl.replaceChildren(...kids);
  }

  function renderPlots(s) {
    const iu = col("gpu_util_percent"), ib = col("gpus_busy"), it = col("gpus_total"), iv = col("vram_used_percent");
    const ir = col("jobs_running"), ip = col("jobs_pending");
    plot($("plot-gpu"), [
      { cls: "vram", value: (p) => p[iv] },
      { cls: "busy", value: (p) => pct(p[ib], p[it]) },
      { cls: "util", value: (p) => p[iu] },
    ], 100, "%", s.now);
    let top = 1;
    for (const p of series) top = Math.max(top, p[ir], p[ip]);
    const nice = top <= 4 ? 4 : top <= 8 ? 8 : Math.ceil(top / 10) * 10;
    plot($("plot-jobs"), [
      { cls: "pend", value: (p) => p[ip] },
      { cls: "run", value: (p) => p[ir] },
    ], nice, "", s.now);
  }

  // -- the loop -------------------------------------------------------------------------------------------------
  function render(s) {
    renderHeader(s);
    renderTotals(s);
    mergeSeries(s);
    renderPlots(s);
    renderMembers(s);
    renderJobs(s);
    renderSync(s);
    renderEvents(s);
    renderScaling(s);
  }

  async function fetchMembers(headers) {
    const h = Object.assign({}, headers);
    if (membersTag !== null) h["if-none-match"] = membersTag;
    const r = await fetch("members", { headers: h, cache: "no-store" });
    if (r.status === 304 || r.status === 401) return r.status;
    if (!r.ok) throw new Error("HTTP " + r.status);
    const body = await r.json();
    members = body.members.sort((a, b) => (b.leader - a.leader) ||
      ((STATE_ORDER[a.state] ?? 3) - (STATE_ORDER[b.state] ?? 3)) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    membersTag = r.headers.get("etag");
    return r.status;
  }

  async function poll() {
    timer = null;
    const since = series.length ? series[series.length - 1][0] : null;
    const headers = { accept: "application/json" };
    const t = token();
    if (t) headers.authorization = "Bearer " + t;
    try {
      const [r, rm] = await Promise.all([
        fetch("ui/state" + (since !== null ? "?since=" + since : ""), { headers, cache: "no-store" }),
        fetchMembers(headers)]);
      if (r.status === 401 || rm === 401) {
        conn("unauthorized", t ? "unauthorized: the read token was refused" : "unauthorized: this agent needs its read token");
        return;  // wait for the token form
      }
      if (!r.ok) throw new Error("HTTP " + r.status);
      const s = await r.json();
      s.members = members;
      render(s);
      lastOk = Date.now();
      conn("live", "live · every " + (POLL_MS / 1000) + " s");
    } catch (e) {
      const ago = lastOk ? " (last update " + Math.round((Date.now() - lastOk) / 1000) + " s ago)" : "";
      conn(lastOk ? "stale" : "error", "agent unreachable, retrying" + ago);
    }
    timer = setTimeout(poll, POLL_MS);
  }

  function start() {
    tokenFromHash();
    $("members-filter").addEventListener("input", () => {  // redraw now from the rows held, not at the next poll
      membersDrawn = null;
      if (lastState !== null) renderMembers(lastState);
    });
    $("auth").addEventListener("submit", (ev) => {
      ev.preventDefault();
      setToken($("auth-token").value.trim());
      $("auth-token").value = "";
      conn("loading", "loading…");
      if (timer !== null) clearTimeout(timer);
      poll();
    });
    poll();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
