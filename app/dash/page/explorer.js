// The dashboard's trajectory explorer: the episode table of a run directory's explorer files
// (/api/explorer/episodes: recent steps' samples) with filters (reward range, failed, partial
// rollout, trajectory split, text search) and sorting, and one episode (/api/explorer/episode): its
// turns as chat, a token view of each trajectory segment — each token coloured by its loss mask
// (model-sampled vs environment/template vs prompt), model tokens shaded by their sampled
// probability, weight-version boundaries of partial rollouts and segment boundaries of trajectory
// splits marked — and the other episodes of its group side by side. Plain DOM, no framework.
"use strict";
window.OozeExplorer = (() => {
  const $ = (sel) => document.querySelector(sel);
  let token = "";
  let source = () => "run";
  let rows = [];
  let sortKey = "step";
  let sortDir = -1;
  let open = null; // {step, index}
  let loading = false;
  let again = false;

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "onclick") el.onclick = v;
      else if (k === "style") el.style.cssText = v;
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return el;
  }
  const fmt = (x, d = 3) => (x === null || x === undefined ? "—" : Number(x).toFixed(d));
  const showMsg = (text) => {
    const el = $("#ex-msg");
    el.hidden = !text;
    el.textContent = text || "";
  };

  async function get(path, params) {
    const q = new URLSearchParams({ source: source(), ...params });
    const r = await fetch(`${path}?${q}`, { headers: { authorization: `Bearer ${token}` } });
    const j = await r.json().catch(() => ({ ok: false, error: { message: `HTTP ${r.status}` } }));
    if (!j.ok) throw new Error(j.error ? j.error.message : `HTTP ${r.status}`);
    return j.result;
  }

  // ---- the table ----
  const columns = [
    ["step", "step"], ["index", "sample"], ["group", "group"], ["versions", "versions"], ["prompt", "prompt"], ["reward", "reward"],
    ["advantage", "advantage"], ["responseLength", "length"], ["turns", "turns"], ["segment", "segment"], ["status", "status"],
    ["agentExit", "agent exit"], ["seconds", "seconds"],
  ];
  function filters() {
    const f = $("#ex-filter");
    const n = (v) => (v.trim() === "" ? null : Number(v));
    return { min: n(f.rmin.value), max: n(f.rmax.value), failed: f.failed.checked, partial: f.partial.checked, split: f.split.checked, q: f.q.value.trim().toLowerCase() };
  }
  function shown() {
    const f = filters();
    const out = rows.filter((r) => {
      if (f.min !== null && !(r.reward !== null && r.reward >= f.min)) return false;
      if (f.max !== null && !(r.reward !== null && r.reward <= f.max)) return false;
      if (f.failed && r.status !== "failed") return false;
      if (f.partial && !r.partial) return false;
      if (f.split && r.segments < 2) return false;
      if (f.q && !`${r.prompt}\n${r.response}\n${r.error || ""}\n${r.episode}`.toLowerCase().includes(f.q)) return false;
      return true;
    });
    const key = (r) => (sortKey === "versions" ? Number(r.versions[0] ?? -1) : r[sortKey]);
    out.sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === y) return (a.step - b.step || a.index - b.index) * sortDir;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sortDir;
    });
    return out;
  }
  function renderTable() {
    const head = $("#ex-table thead");
    head.innerHTML = "";
    head.append(h("tr", {}, ...columns.map(([k, label]) => h("th", { "data-sort": k, class: "sortable", onclick: () => {
      sortDir = sortKey === k ? -sortDir : -1;
      sortKey = k;
      renderTable();
    } }, label, sortKey === k ? (sortDir < 0 ? " ▼" : " ▲") : ""))));
    const tb = $("#ex-table tbody");
    tb.innerHTML = "";
    const list = shown();
    for (const r of list.slice(0, 500)) {
      const sel = open && open.step === r.step && open.index === r.index;
      tb.append(
        h("tr", {
          "data-episode-row": `${r.step}:${r.index}`, "data-status": r.status, "data-partial": r.partial ? "1" : "0", "data-segments": r.segments,
          class: `${sel ? "sel " : ""}${r.status === "failed" ? "bad" : ""}`, onclick: () => openEpisode(r.step, r.index),
        },
          h("td", {}, r.step),
          h("td", {}, r.index),
          h("td", {}, r.group),
          h("td", { class: r.partial ? "warn" : "" }, r.versions.length ? `v${r.versions.join("→v")}` : "—"),
          h("td", { class: "clip", title: r.prompt }, r.prompt),
          h("td", {}, fmt(r.reward, 2)),
          h("td", {}, fmt(r.advantage)),
          h("td", {}, r.responseLength),
          h("td", {}, r.turns ?? "—"),
          h("td", {}, r.segments > 1 ? `${r.segment + 1}/${r.segments}` : "—"),
          h("td", { title: r.error || "" }, r.status, r.trained ? "" : h("span", { class: "muted" }, " (not trained)")),
          h("td", {}, r.agentExit ?? "—"),
          h("td", {}, r.seconds === null ? "—" : r.seconds.toFixed(1)),
        ),
      );
    }
    $("#ex-count").textContent = `${list.length} of ${rows.length} samples${list.length > 500 ? " (first 500 shown)" : ""}`;
  }

  async function refresh() {
    if (loading) return void (again = true);
    loading = true;
    try {
      const t = await get("/api/explorer/episodes", {});
      rows = t.rows;
      $("#ex-source").textContent = `· ${t.dir} · steps ${t.steps.length ? `${t.steps[0]}–${t.steps[t.steps.length - 1]}` : "none"} · tokenizer ${t.tokenizer}`;
      showMsg(t.error);
      renderTable();
    } catch (e) {
      rows = [];
      renderTable();
      showMsg(`explorer: ${e.message}`);
    } finally {
      loading = false;
      if (again) {
        again = false;
        refresh();
      }
    }
  }

  // ---- one episode ----
  /** Background of a model token from its sampled probability: green when likely, red when not. */
  const probColour = (lp) => `hsl(${Math.round(120 * Math.exp(Math.min(0, lp)))}, 70%, 82%)`;

  function tokenView(seg) {
    const box = h("div", { class: "tokens", "data-tokens": seg.index });
    const versionAt = new Map(); // response position → version
    for (const s of seg.spans) for (let i = s.start; i < s.end; i++) versionAt.set(i, s.version);
    let lastVersion = null;
    for (let i = 0; i < seg.ids.length; i++) {
      const r = i - seg.promptLength; // response position
      const piece = seg.pieces[i];
      if (r < 0) {
        box.append(h("span", { class: "tok prompt", "data-i": i, "data-kind": "prompt", title: `#${i} id ${seg.ids[i]} (prompt)` }, piece));
        continue;
      }
      const model = seg.lossMask[r] === 1;
      const v = versionAt.get(r) ?? null;
      if (model && v !== null && lastVersion !== null && v !== lastVersion)
        box.append(h("span", { class: "vb", "data-boundary": "version", "data-at": r, title: `weight update: positions from ${r} sampled by version ${v}` }, `v${lastVersion}→v${v}`));
      if (model && v !== null) lastVersion = v;
      const lp = seg.logprobs[r];
      box.append(
        h("span", {
          class: `tok ${model ? "model" : "env"}`, "data-i": i, "data-r": r, "data-kind": model ? "model" : "env", "data-mask": model ? "1" : "0",
          "data-version": model ? v : null, "data-logprob": model ? lp.toFixed(4) : null,
          style: model ? `background:${probColour(lp)}` : null,
          title: model ? `#${i} id ${seg.ids[i]} · logprob ${lp.toFixed(3)} (p ${Math.exp(lp).toFixed(3)}) · version ${v}` : `#${i} id ${seg.ids[i]} (environment / template, not trained)`,
        }, piece),
      );
    }
    return box;
  }

  function chat(seg) {
    const t = Array.isArray(seg.metadata.transcript) ? seg.metadata.transcript : null;
    const box = h("div", { class: "chat", "data-chat": seg.index });
    if (t) {
      for (const m of t) {
        const calls = Array.isArray(m.tool_calls) ? m.tool_calls : [];
        box.append(
          h("div", { class: `turn ${m.role}`, "data-role": m.role },
            h("b", {}, m.role, m.tool_call_id ? ` (result of ${m.tool_call_id})` : ""),
            m.reasoning_content ? h("div", { class: "reasoning" }, m.reasoning_content) : null,
            h("div", {}, typeof m.content === "string" ? m.content : JSON.stringify(m.content)),
            ...calls.map((c) => h("div", { class: "call", "data-tool-call": c.name }, `→ ${c.name}(${c.arguments}) [${c.id}]`)),
          ),
        );
      }
      return box;
    }
    // a plain task: the prompt, then runs of model and environment tokens as turns
    const runs = [{ role: "user", text: seg.pieces.slice(0, seg.promptLength).join("") }];
    for (let r = 0; r < seg.lossMask.length; r++) {
      const role = seg.lossMask[r] === 1 ? "assistant" : "environment";
      if (runs[runs.length - 1].role !== role) runs.push({ role, text: "" });
      runs[runs.length - 1].text += seg.pieces[seg.promptLength + r];
    }
    for (const x of runs) box.append(h("div", { class: `turn ${x.role}`, "data-role": x.role }, h("b", {}, x.role), h("div", {}, x.text)));
    return box;
  }

  function groupCard(r, ep) {
    const mine = r.episode === ep.episode;
    return h("div", { class: `card${mine ? " sel" : ""}${r.status === "failed" ? " failed" : ""}`, "data-group-member": `${r.step}:${r.index}`, onclick: () => openEpisode(r.step, r.index) },
      h("div", {}, h("b", {}, `sample ${r.index}`), r.segments > 1 ? ` (segment ${r.segment + 1}/${r.segments})` : "", mine ? " ← this episode" : ""),
      h("div", {}, `reward ${fmt(r.reward, 2)} · advantage ${fmt(r.advantage)} · ${r.status}`),
      h("div", { class: "muted" }, `${r.responseLength} tokens${r.versions.length ? ` · v${r.versions.join("→v")}` : ""}`),
      r.error ? h("div", { class: "bad" }, r.error) : null,
      h("pre", {}, r.response || "(no response)"),
    );
  }

  async function openEpisode(step, index) {
    open = { step, index };
    renderTable();
    const view = $("#ex-episode");
    view.hidden = false;
    view.innerHTML = "";
    view.append(h("p", { class: "muted" }, `loading step ${step} sample ${index}…`));
    let ep;
    try {
      ep = await get("/api/explorer/episode", { step, index });
    } catch (e) {
      view.innerHTML = "";
      view.append(h("div", { class: "msg" }, `episode: ${e.message}`));
      return;
    }
    view.innerHTML = "";
    view.setAttribute("data-episode", ep.episode);
    view.setAttribute("data-step", ep.step);
    const first = ep.segments[0];
    const main = h("div", { class: "ep-main" },
      h("h3", {}, `episode ${ep.episode} · step ${ep.step} · group ${first.group}`),
      h("div", { class: "ep-facts" },
        `reward ${fmt(first.reward, 3)} · advantage ${fmt(first.advantage)} · status ${first.status}${first.trained ? "" : " (not trained)"}`,
        first.agentExit !== null ? ` · agent exit ${first.agentExit}` : "", first.seconds !== null ? ` · ${first.seconds.toFixed(1)} s` : "",
        ep.segments.length > 1 ? ` · ${ep.segments.length} trajectory segments` : "",
      ),
      first.error ? h("div", { class: "msg", "data-error": "" }, first.error) : null,
      h("div", { class: "legend" },
        h("span", { class: "tok prompt" }, "prompt"), h("span", { class: "tok env" }, "environment / template (mask 0)"),
        h("span", { class: "tok model", style: `background:${probColour(0)}` }, "model, p≈1"), h("span", { class: "tok model", style: `background:${probColour(Math.log(0.05))}` }, "model, p≈0.05"),
        h("span", { class: "vb" }, "v1→v2"), " weight update inside a generation (partial rollout)",
      ),
    );
    ep.segments.forEach((seg, k) => {
      if (k > 0)
        main.append(h("div", { class: "seg-boundary", "data-boundary": "segment", "data-segment": seg.segment },
          `trajectory split: segment ${seg.segment + 1} of ${seg.segments} (sample ${seg.index}) — the agent's next request did not extend segment ${ep.segments[k - 1].segment + 1}'s tokens, so it starts a new trained sample`));
      main.append(
        h("div", { class: "segment", "data-segment-view": seg.index },
          h("h4", {}, `${ep.segments.length > 1 ? `segment ${seg.segment + 1} · ` : ""}sample ${seg.index} · ${seg.promptLength} prompt + ${seg.responseLength} response tokens (${seg.modelTokens} sampled) · versions ${seg.versions.length ? seg.versions.join(", ") : "—"}`),
          h("details", { open: true }, h("summary", {}, "chat"), chat(seg)),
          h("details", { open: true }, h("summary", {}, "tokens"), tokenView(seg)),
        ),
      );
    });
    view.append(main, h("div", { class: "ep-group" }, h("h3", {}, `group ${first.group} at step ${ep.step}: ${ep.group.length} samples`), ...ep.group.map((r) => groupCard(r, ep))));
  }

  return {
    /** Wires the filters; `src()` says which run the page shows ("run" or "live"). */
    init(tok, src) {
      token = tok;
      source = src;
      const f = $("#ex-filter");
      f.addEventListener("input", renderTable);
      f.addEventListener("submit", (e) => e.preventDefault());
      renderTable();
    },
    refresh,
    openEpisode,
  };
})();
