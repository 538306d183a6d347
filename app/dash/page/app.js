// The ooze dashboard's script: opens the server-sent-event stream (/events), keeps the state it
// describes (a snapshot, then updates), and renders the topology, the engines (with attach and detach
// buttons), the learning curves (the live job's step metrics, or a run directory opened in the form)
// and the weight versions. Plain DOM; charts through charts.js (uPlot).
"use strict";
(() => {
  const token = decodeURIComponent(document.querySelector('meta[name="ooze-token"]').content);
  const $ = (sel) => document.querySelector(sel);
  let S = null; // the server's DashSnapshot
  let showRun = false;

  /** Builds an element: h("td", {class: "x"}, "text", child…). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k.startsWith("data-")) el.setAttribute(k, v);
      else if (k === "onclick") el.onclick = v;
      else el.setAttribute(k, v);
    }
    for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(c === null || c === undefined ? "" : String(c)));
    return el;
  }
  const time = (ms) => new Date(ms).toLocaleTimeString();
  const fmtBytes = (n) => (n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(2)} MiB` : n >= 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${Math.round(n)} B`);
  function showMsg(el, text, info) {
    el.hidden = !text;
    el.textContent = text || "";
    el.classList.toggle("info", !!info);
  }

  async function post(path, body) {
    const r = await fetch(path, { method: "POST", headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: JSON.stringify(body) });
    const j = await r.json().catch(() => ({ ok: false, error: { message: `HTTP ${r.status}` } }));
    if (!j.ok) throw new Error(j.error ? `${j.error.code ? j.error.code + ": " : ""}${j.error.message}` : `HTTP ${r.status}`);
    return j.result;
  }

  // ---- topology ----
  function renderJob() {
    $("#job").textContent = S.job ? `job ${S.job.id} · nats ${S.job.nats}` : S.run ? "run directory" : "no job";
    showMsg($("#job-error"), S.jobError);
  }
  function renderHosts() {
    const root = $("#hosts");
    const hosts = Object.values(S.hosts);
    if (hosts.length === 0) return;
    root.innerHTML = "";
    for (const host of hosts) {
      const rows = host.actors.map((a) =>
        h("tr", { "data-actor": a.path },
          h("td", {}, a.path),
          h("td", {}, a.definition),
          h("td", { class: a.status === "running" ? "ok" : a.status === "crashed" || a.status === "escalated" ? "bad" : "warn" }, a.status),
          h("td", {}, a.restarts),
          h("td", {}, a.mailboxDepth),
          h("td", {}, a.processed),
          h("td", { class: "err" }, a.lastError ? `${a.lastError.code}: ${a.lastError.message}` : ""),
        ),
      );
      root.append(
        h("div", { class: "host", "data-host": host.host },
          h("h3", {}, `host ${host.host}`, h("span", { class: "muted" }, host.pid ? ` · pid ${host.pid}` : ""), host.error ? h("span", { class: "bad" }, ` · ${host.error}`) : ""),
          h("table", {},
            h("thead", {}, h("tr", {}, ...["actor", "kind", "state", "restarts", "mailbox", "processed", "last error"].map((t) => h("th", {}, t)))),
            h("tbody", {}, ...rows),
          ),
        ),
      );
    }
  }
  function eventLine(e) {
    return h("li", { class: e.kind === "crashed" || e.kind === "escalated" ? "bad" : "" }, `${time(e.at)} ${e.actor} ${e.kind}${e.restarts ? ` (restart ${e.restarts})` : ""}${e.error ? ` — ${e.error.code}: ${e.error.message}` : ""}`);
  }
  function renderEvents() {
    const ol = $("#events");
    ol.innerHTML = "";
    for (const e of S.events.slice(-100).reverse()) ol.append(eventLine(e));
  }

  // ---- engines ----
  function renderEngines() {
    const tb = $("#engines tbody");
    tb.innerHTML = "";
    $("#fleet-version").textContent = S.fleetVersion !== null ? `· fleet weight version ${S.fleetVersion}` : "";
    showMsg($("#fleet-error"), S.fleetError);
    for (const e of S.engines) {
      const m = e.model || {};
      const model = [m.model_type, m.hidden_size ? `d${m.hidden_size}` : null, m.num_hidden_layers ? `${m.num_hidden_layers}L` : null, m.vocab_size ? `vocab ${m.vocab_size}` : null].filter(Boolean).join(" ") || "—";
      const hits = e.cacheHitRate === null ? "—" : `${(100 * e.cacheHitRate).toFixed(1)} %`;
      const load = e.load ? `${e.load.running} running${e.load.waiting ? `, ${e.load.waiting} waiting` : ""}` : `${e.inFlight} (fleet)`;
      tb.append(
        h("tr", { "data-engine": e.url },
          h("td", {}, e.url, h("span", { class: "muted" }, ` (${e.source})`)),
          h("td", { class: e.healthy ? "ok" : "bad" }, e.healthy ? "healthy" : "unhealthy"),
          h("td", {}, model),
          h("td", {}, e.weightVersion ?? "—"),
          h("td", {}, load),
          h("td", {}, hits),
          h("td", { class: "err" }, e.lastError || ""),
          h("td", {}, h("button", { type: "button", "data-detach": e.url, onclick: () => detach(e.url) }, "Detach")),
        ),
      );
    }
    if (S.engines.length === 0) tb.append(h("tr", {}, h("td", { colspan: "8", class: "muted" }, S.job ? "no engines" : "no job")));
  }
  function renderEngineEvents() {
    const ol = $("#engine-events");
    ol.innerHTML = "";
    for (const e of S.engineEvents.slice().reverse()) ol.append(h("li", {}, `${time(e.at)} ${e.kind} ${e.url}${e.source ? ` (${e.source})` : ""}`));
  }
  async function detach(url) {
    if (!window.confirm(`Detach ${url} from the job? Its in-flight requests move to other engines.`)) return;
    const msg = $("#engine-msg");
    showMsg(msg, `detaching ${url}…`, true);
    try {
      await post("/api/engines/detach", { url });
      showMsg(msg, `detached ${url}`, true);
    } catch (e) {
      showMsg(msg, `detach ${url}: ${e.message}`);
    }
  }
  $("#attach").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const url = ev.target.url.value.trim();
    const msg = $("#engine-msg");
    showMsg(msg, `attaching ${url}…`, true);
    try {
      const r = await post("/api/engines/attach", { url });
      showMsg(msg, `attached ${url}${r && r.engine ? ` (${r.engine.healthy ? "healthy" : "not healthy yet"})` : ""}`, true);
      ev.target.reset();
    } catch (e) {
      showMsg(msg, `attach ${url}: ${e.message}`);
    }
  });

  // ---- curves ----
  const C = window.OozeCharts;
  const charts = $("#charts");
  const curves = [
    C.lines(charts, "reward", "reward and success rate", [{ key: "reward_mean", label: "reward" }, { key: "success_rate", label: "success rate" }], [0, 1]),
    C.lines(charts, "kl", "KL (rollout vs training policy)", [{ key: "kl", label: "KL" }]),
    C.lines(charts, "entropy", "entropy", [{ key: "entropy", label: "entropy" }]),
    C.lines(charts, "grad_norm", "gradient norm", [{ key: "grad_norm", label: "grad norm" }]),
    C.lines(charts, "lr", "learning rate", [{ key: "lr", label: "lr" }]),
    C.lines(charts, "samples_per_s", "samples/s", [{ key: "samples_per_s", label: "samples/s" }]),
    C.lines(charts, "response_length", "response length (tokens)", [{ key: "response_length_mean", label: "mean" }]),
  ];
  const staleness = C.bars(charts, "staleness", "staleness of trained samples (all steps)", "versions behind", [{ label: "samples" }]);
  const bytesChart = C.bars($("#bytes-chart"), "sync_bytes", "bytes per weight update", "version", [{ label: "full" }, { label: "delta" }], fmtBytes);

  function metricsShown() {
    return showRun && S.run ? S.run.metrics : S.metrics;
  }
  function renderCurves() {
    const rows = metricsShown().slice().sort((a, b) => a.step - b.step);
    for (const c of curves) c.set(rows);
    const hist = [];
    for (const r of rows) if (Array.isArray(r.staleness_hist)) r.staleness_hist.forEach((n, k) => (hist[k] = (hist[k] || 0) + n));
    if (hist.length > 0) while (hist.length < 3) hist.push(0); // a few bins, so one bar is not the whole axis
    staleness.set(hist.map((_, k) => k), [Array.from(hist, (n) => n || 0)]);
    $("#metrics-source").textContent = showRun && S.run ? `· run ${S.run.dir} (${S.run.metrics.length} steps)` : S.job ? `· job ${S.job.id}, live (${S.metrics.length} steps)` : "";
    $("#live").hidden = !(showRun && S.job);
    showMsg($("#run-msg"), showRun && S.run ? S.run.error : !S.job && !S.run ? "no job and no run directory: open one above" : null);
  }
  $("#open-run").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const dir = ev.target.dir.value.trim();
    try {
      await post("/api/run", { dir });
      showRun = true;
      schedule("curves", "job");
      refreshExplorer();
    } catch (e) {
      showMsg($("#run-msg"), `open ${dir}: ${e.message}`);
    }
  });
  $("#live").addEventListener("click", () => {
    showRun = false;
    schedule();
    refreshExplorer();
  });

  // ---- weight sync ----
  function renderVersions() {
    const vs = S.versions.slice().sort((a, b) => a.version - b.version);
    const tb = $("#versions tbody");
    tb.innerHTML = "";
    for (const v of vs.slice().reverse())
      tb.append(
        h("tr", { "data-version": v.version },
          h("td", {}, v.version),
          h("td", {}, v.step),
          h("td", {}, v.sync ? v.sync.kind : "—"),
          h("td", {}, v.sync ? fmtBytes(v.sync.bytes) : "—"),
          h("td", {}, v.sync && v.sync.fullBytes ? `${((100 * v.sync.bytes) / v.sync.fullBytes).toFixed(1)} %` : "—"),
          h("td", {}, time(v.at)),
        ),
      );
    const sent = vs.filter((v) => v.sync);
    bytesChart.set(sent.map((v) => v.version), [sent.map((v) => (v.sync.kind === "full" ? v.sync.bytes : null)), sent.map((v) => (v.sync.kind === "delta" ? v.sync.bytes : null))]);
  }

  // ---- trajectories ----
  const X = window.OozeExplorer;
  X.init(token, () => (showRun && S && S.run ? "run" : S && S.job ? "live" : "run"));
  let exTimer = 0;
  let exLast = 0;
  /** Reloads the explorer's table (at most every 2 s: each step adds a file). */
  function refreshExplorer() {
    if (exTimer) return;
    exTimer = setTimeout(() => {
      exTimer = 0;
      exLast = Date.now();
      if (S && (S.job || S.run)) X.refresh();
    }, Math.max(300, 2000 - (Date.now() - exLast)));
  }

  // ---- updates ----
  const dirty = new Set();
  let frame = 0;
  function schedule(...parts) {
    for (const p of parts.length ? parts : ["job", "hosts", "events", "engines", "engineEvents", "curves", "versions"]) dirty.add(p);
    if (frame) return;
    frame = setTimeout(() => {
      frame = 0;
      if (!S) return;
      const render = { job: renderJob, hosts: renderHosts, events: renderEvents, engines: renderEngines, engineEvents: renderEngineEvents, curves: renderCurves, versions: renderVersions };
      for (const p of dirty) render[p]();
      dirty.clear();
    }, 150);
  }

  const es = new EventSource(`/events?token=${encodeURIComponent(token)}`);
  const conn = $("#conn");
  es.onopen = () => {
    conn.textContent = "live";
    conn.className = "pill live";
  };
  es.onerror = () => {
    conn.textContent = "disconnected, retrying…";
    conn.className = "pill down";
  };
  const on = (type, f) => es.addEventListener(type, (ev) => f(JSON.parse(ev.data)));
  on("snapshot", (d) => {
    S = d;
    if (S.run && !S.job) showRun = true;
    schedule();
    refreshExplorer();
  });
  on("job", (d) => {
    Object.assign(S, d);
    schedule("job", "curves");
  });
  on("host", (d) => {
    S.hosts[d.host] = d;
    schedule("hosts");
  });
  on("event", (d) => {
    S.events.push(d);
    if (S.events.length > 200) S.events.shift();
    schedule("events");
  });
  on("engines", (d) => {
    Object.assign(S, d);
    schedule("engines");
  });
  on("engine-event", (d) => {
    S.engineEvents.push(d);
    schedule("engineEvents");
  });
  on("metrics", (d) => {
    const i = S.metrics.findIndex((m) => m.step === d.step);
    if (i >= 0) S.metrics[i] = d;
    else S.metrics.push(d);
    schedule("curves");
    refreshExplorer();
  });
  on("version", (d) => {
    S.versions.push(d);
    schedule("versions");
  });
  on("run", (d) => {
    S.run = d;
    if (d && !S.job) showRun = true;
    schedule("curves", "job");
    refreshExplorer();
  });
})();
