// Chart cards of the ooze dashboard, over uPlot (served from node_modules by the dashboard server):
// line charts of step metrics against the step, and bar charts (staleness histogram, bytes per weight
// update). Each card carries data-chart (its id) and data-points (points drawn), and shows a line of
// text instead of an empty plot while it has no data.
"use strict";
window.OozeCharts = (() => {
  const colors = ["#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c"];
  const plots = new Set();

  function card(parent, id) {
    const div = document.createElement("div");
    div.className = "chart";
    div.dataset.chart = id;
    div.dataset.points = "0";
    parent.appendChild(div);
    return div;
  }

  const widthOf = (div) => Math.max(280, div.clientWidth - 10);

  /** Tick labels with as many decimals as the tick spacing needs (exponents for tiny or huge values). */
  function ticks(_u, splits) {
    const incr = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : 1;
    let d = 0; // the fewest decimals that write the spacing exactly
    while (d < 8 && Math.abs(Math.round(incr * 10 ** d) - incr * 10 ** d) > 1e-6 * 10 ** d) d++;
    return splits.map((v) => {
      if (v === 0) return "0";
      const a = Math.abs(v);
      if (a >= 1e6 || a < 1e-3) return v.toExponential(1);
      return v.toFixed(d);
    });
  }
  /** Tick spacings of integer axes (steps, versions, staleness). */
  const STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000];
  const fromZero = (_u, _min, max) => [0, max > 0 ? max * 1.1 : 1];

  /** Replaces the card's plot by a line of text (no data yet, or why there is none). */
  function empty(state, div, text) {
    if (state.plot) {
      plots.delete(state.plot);
      state.plot.destroy();
      state.plot = null;
    }
    div.dataset.points = "0";
    div.innerHTML = "";
    const p = document.createElement("div");
    p.className = "empty";
    p.textContent = text;
    div.appendChild(p);
  }

  function draw(state, div, opts, data, points) {
    div.dataset.points = String(points);
    if (!state.plot) {
      div.innerHTML = "";
      state.plot = new uPlot({ ...opts, width: widthOf(div), height: 190 }, data, div);
      plots.add(state.plot);
    } else state.plot.setData(data);
  }

  /** A line chart of `series` ({key, label}) of step-metric rows, against `step`; `yRange` fixes the y axis. */
  function lines(parent, id, title, series, yRange) {
    const div = card(parent, id);
    const state = { plot: null };
    empty(state, div, `${title}: no steps yet`);
    return {
      set(rows) {
        const pts = rows.filter((r) => series.some((s) => typeof r[s.key] === "number"));
        if (pts.length === 0) return empty(state, div, `${title}: no steps yet`);
        const data = [pts.map((r) => r.step), ...series.map((s) => pts.map((r) => (typeof r[s.key] === "number" ? r[s.key] : null)))];
        const opts = {
          title,
          scales: { x: { time: false }, ...(yRange ? { y: { range: () => yRange } } : {}) },
          legend: { live: false },
          axes: [{ incrs: STEPS }, { values: ticks, size: 60 }],
          // uPlot draws the points only while there is room for them
          series: [{ label: "step" }, ...series.map((s, i) => ({ label: s.label, stroke: colors[i % colors.length], width: 1.5 }))],
        };
        draw(state, div, opts, data, pts.length);
      },
    };
  }

  /** A bar chart of integer x values, one y array per series ({label}; nulls leave gaps), y from 0, labelled by `format`. */
  function bars(parent, id, title, xLabel, series, format) {
    const div = card(parent, id);
    const state = { plot: null };
    empty(state, div, `${title}: no data yet`);
    return {
      set(xs, ys) {
        if (xs.length === 0) return empty(state, div, `${title}: no data yet`);
        const opts = {
          title,
          scales: { x: { time: false, range: (_u, min, max) => [min - 0.6, max + 0.6] }, y: { range: fromZero } },
          legend: { live: false },
          axes: [
            { label: xLabel, incrs: STEPS, values: (_u, splits) => splits.map((v) => String(v)) },
            { values: format ? (_u, splits) => splits.map(format) : ticks, size: 80 },
          ],
          series: [{ label: xLabel }, ...series.map((s, i) => ({ label: s.label, fill: colors[i % colors.length] + "aa", stroke: colors[i % colors.length], paths: uPlot.paths.bars({ size: [0.7, 60] }), points: { show: false } }))],
        };
        draw(state, div, opts, [xs, ...ys], xs.length);
      },
    };
  }

  window.addEventListener("resize", () => {
    for (const p of plots) p.setSize({ width: widthOf(p.root.parentElement), height: 190 });
  });

  return { lines, bars };
})();
