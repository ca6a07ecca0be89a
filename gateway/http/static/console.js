// The specroute console: polls /v1/console/state and draws it. Plain DOM, no library;
// every value goes in as text (textContent, SVG attributes), never as markup.
"use strict";
(() => {
  const STATE_URL = "/v1/console/state";
  const REFRESH_MS = 2000;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                  "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  const colorOf = new Map();

  function color(pool) {
    if (!colorOf.has(pool)) colorOf.set(pool, COLORS[colorOf.size % COLORS.length]);
    return colorOf.get(pool);
  }

  function num(value, digits = 1) {
    return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
  }

  function cell(content, className) {
    const td = document.createElement("td");
    if (content instanceof Node) td.appendChild(content); else td.textContent = content;
    if (className) td.className = className;
    return td;
  }

  function fill(tableId, rows) {
    const body = document.querySelector(`#${tableId} tbody`);
    body.replaceChildren(...rows.map((cells) => {
      const tr = document.createElement("tr");
      cells.forEach((c) => tr.appendChild(c instanceof Node ? c : cell(c)));
      return tr;
    }));
    body.parentElement.dataset.rows = String(rows.length);
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
    return node;
  }

  function swatch(pool) {
    const box = svg("svg", {width: 12, height: 12, class: "swatch"});
    box.appendChild(svg("rect", {width: 12, height: 12, fill: color(pool)}));
    return box;
  }

  function niceMax(value) {
    if (!(value > 0)) return 1;
    const step = Math.pow(10, Math.floor(Math.log10(value)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= value) return m * step;
    return 10 * step;
  }

  function ago(seconds, range) {
    return range < 300 ? `-${Math.round(seconds)} s` : `-${Math.round(seconds / 60)} min`;
  }

  // series: [{pool, points: [[unix s, value or null]], prior: number or null}]
  function plot(id, series, now, spanS, digits) {
    const root = document.getElementById(id);
    const W = 640, H = 240, L = 48, R = 12, T = 10, B = 26;
    const times = series.flatMap((s) => s.points.map((p) => p[0]));
    const start = Math.max(now - spanS, Math.min(now - 60, ...times));
    const values = series.flatMap((s) => [...s.points.map((p) => p[1]), s.prior])
      .filter((v) => v !== null && v !== undefined && Number.isFinite(v));
    const top = niceMax(Math.max(0, ...values) * 1.1);
    const x = (t) => L + (W - L - R) * (t - start) / Math.max(now - start, 1);
    const y = (v) => H - B - (H - T - B) * v / top;
    const nodes = [];
    for (let i = 0; i <= 4; i++) {
      const v = top * i / 4;
      nodes.push(svg("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid"}));
      const label = svg("text", {x: L - 6, y: y(v) + 4, "text-anchor": "end", class: "tick"});
      label.textContent = num(v, v >= 10 ? 0 : digits);
      nodes.push(label);
    }
    for (let i = 0; i <= 4; i++) {
      const t = start + (now - start) * i / 4;
      const label = svg("text", {x: x(t), y: H - 8, "text-anchor": "middle", class: "tick"});
      label.textContent = i === 4 ? "now" : ago(now - t, now - start);
      nodes.push(label);
    }
    let drawn = 0;
    for (const s of series) {
      const c = color(s.pool);
      if (s.prior !== null && s.prior !== undefined) {
        nodes.push(svg("line", {x1: L, x2: W - R, y1: y(s.prior), y2: y(s.prior), stroke: c,
                                class: "prior", "data-pool": s.pool}));
      }
      let run = [];
      const flush = () => {
        if (run.length > 1) {
          nodes.push(svg("polyline", {points: run.join(" "), stroke: c, class: "line"}));
        }
        run = [];
      };
      for (const [t, v] of s.points) {
        if (v === null || v === undefined || !Number.isFinite(v)) { flush(); continue; }
        run.push(`${x(t).toFixed(1)},${y(v).toFixed(1)}`);
        const dot = svg("circle", {cx: x(t), cy: y(v), r: 3, fill: c, class: "point",
                                   "data-pool": s.pool});
        const tip = svg("title", {});
        tip.textContent = `${s.pool}: ${num(v, digits)}`;
        dot.appendChild(tip);
        nodes.push(dot);
        drawn += 1;
      }
      flush();
    }
    root.replaceChildren(...nodes);
    root.dataset.points = String(drawn);
  }

  function renderRouting(state) {
    fill("routing", state.routing.map((r) => [
      r.model, `${r.task} / ${r.temperature_bucket}`, r.pool ?? "–", r.method ?? "–",
      r.k ?? "–", num(r.predicted_accept_length, 2), num(r.observed_accept_length, 2),
      num(r.predicted_tokens_per_s), num(r.observed_tokens_per_s), r.observed_requests ?? 0,
      cell(r.reason ?? "", "reason")]));
  }

  // a hybrid pool's last hour per branch: "ngram 14 steps, 37 accepted · eagle 6, 5 · none 2"
  function branches(drafts) {
    if (!drafts) return "–";
    return Object.entries(drafts).map(([b, d]) => b === "none" ? `none ${d.steps}`
      : `${b} ${d.steps} steps, ${d.accepted} accepted`).join(" · ");
  }

  function renderPools(state) {
    const now = state.gateway.now, span = state.gateway.span_s;
    const last = (samples, key) => {
      for (let i = samples.length - 1; i >= 0; i--) if (samples[i][key] !== null) return samples[i][key];
      return null;
    };
    fill("pools", state.pools.map((p) => [
      cell(swatch(p.pool)), p.pool, p.engine, p.method, p.k, num(p.prior.accept_length, 2),
      cell(p.prior.source, "reason"), num(p.learned_accept_length, 2),
      num(last(p.samples, "accept_length"), 2), num(last(p.samples, "tokens_per_s")),
      p.samples.reduce((n, s) => n + s.requests, 0), cell(branches(p.drafts), "drafts")]));
    plot("plot-accept", state.pools.map((p) => ({
      pool: p.pool, prior: p.prior.accept_length,
      points: p.samples.map((s) => [s.at, s.accept_length])})), now, span, 2);
    plot("plot-tps", state.pools.map((p) => ({
      pool: p.pool, prior: null,
      points: p.samples.map((s) => [s.at, s.tokens_per_s])})), now, span, 1);
  }

  function renderTenants(state) {
    fill("tenants", state.tenants.map((t) => [
      t.tenant, t.priority, `${num(t.slo_ttft_ms, 0)} / ${num(t.slo_tpot_ms, 0)}`,
      t.attainment === null ? "–" : `${(100 * t.attainment).toFixed(1)}% of ${t.requests}`,
      `${num(t.ttft_p50_ms)} / ${num(t.ttft_p99_ms)}`,
      `${num(t.tpot_p50_ms)} / ${num(t.tpot_p99_ms)}`,
      `${t.met_total} / ${t.missed_total} / ${t.failed_total}`, t.shed, t.rate_limited]));
  }

  function renderFleet(state) {
    const plans = document.getElementById("fleet-plans");
    plans.replaceChildren(...state.fleet.map((m) => {
      const p = document.createElement("p");
      const gain = m.predicted_gain === null ? "" : `, predicted gain ${(100 * m.predicted_gain).toFixed(1)}%`;
      const moving = m.moving ? `; moving ${m.moving.url}: ${m.moving.src} -> ${m.moving.dst}` : "";
      p.textContent = `${m.model}: planner ${m.planner}${gain}${m.reason ? ": " + m.reason : ""}${moving}`;
      return p;
    }));
    const list = (items) => (items.length ? items.join(", ") : "–");
    fill("fleet", state.fleet.flatMap((m) => m.pools.map((p) => [
      m.model, p.pool, p.method,
      Object.keys(p.running_k).length ? [...new Set(Object.values(p.running_k))].join(",") : p.k,
      p.desired_k ?? "–", p.workers, p.available, p.planned ?? "–", p.relaunch ?? "–",
      list(p.unhealthy), list(p.draining), list(p.open_breakers.map((b) => `${b.url} (${b.state})`)),
      `${p.outstanding} / ${p.queued}`])));
  }

  function renderDecisions(state) {
    fill("decisions", state.decisions.map((d) => [
      new Date(d.at * 1000).toLocaleTimeString(), d.tenant, `${d.task} / ${d.temperature_bucket}`,
      d.pool, d.method + (d.pinned ? " (pinned)" : d.explored ? " (exploring)" : ""), d.k,
      d.output_tokens, num(d.accept_length, 2) + (d.anomaly ? " ⚠" : ""), num(d.ttft_ms), num(d.e2e_ms),
      d.ok ? (d.slo_met ? "met" : "missed") : "failed"]));
  }

  function setStatus(kind, text) {
    const status = document.getElementById("status");
    status.dataset.state = kind;
    status.textContent = text;
  }

  let polls = 0;
  async function poll() {
    try {
      const response = await fetch(STATE_URL, {cache: "no-store", credentials: "same-origin"});
      if (!response.ok) throw new Error(`${STATE_URL} answered ${response.status}`);
      const state = await response.json();
      renderRouting(state);
      renderPools(state);
      renderTenants(state);
      renderFleet(state);
      renderDecisions(state);
      polls += 1;
      document.getElementById("summary").textContent =
        `policy ${state.gateway.policy} · models ${state.gateway.models.join(", ")} · ` +
        `up ${Math.round(state.gateway.uptime_s)} s · a sample every ` +
        `${state.gateway.sample_interval_s} s` +
        (state.gateway.registry_error ? ` · registry: ${state.gateway.registry_error}` : "");
      const status = document.getElementById("status");
      status.dataset.polls = String(polls);
      setStatus("ok", `updated ${new Date(state.gateway.now * 1000).toLocaleTimeString()}`);
    } catch (error) {
      setStatus("error", `not updated: ${error.message}`);
    } finally {
      setTimeout(poll, REFRESH_MS);
    }
  }

  document.addEventListener("DOMContentLoaded", poll);
})();
