// Sluice operator UI. Plain JavaScript, no dependencies, no build step.
// It reads JSON from /ui/api/ and draws the page whose name is <body
// data-page>. When the node has an admin token, the token is asked for
// once, kept in this tab's sessionStorage and sent as a bearer token:
// never in a URL. Data is put in the page with textContent only.
"use strict";

const TOKEN = "sluice-admin-token";
const SVGNS = "http://www.w3.org/2000/svg";
const page = document.body.dataset.page;
const refreshMs = { cluster: 2000, key: 1000, overrides: 5000 }[page];
let timer = null;

// ---- helpers ----------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmtDur(ms) {
  if (ms === undefined || ms === null) return "–";
  const neg = ms < 0 ? "−" : "";
  ms = Math.abs(ms);
  if (ms < 1) return neg + (ms * 1000).toFixed(0) + " µs";
  if (ms < 1000) return neg + (ms < 10 ? ms.toFixed(1) : ms.toFixed(0)) + " ms";
  const s = ms / 1000;
  if (s < 60) return neg + (s < 10 ? s.toFixed(2) : s.toFixed(1)) + " s";
  const parts = [[86400, "d"], [3600, "h"], [60, "m"], [1, "s"]];
  let rest = Math.round(s), out = [];
  for (const [n, u] of parts) {
    if (rest >= n && out.length < 2) { out.push(Math.floor(rest / n) + " " + u); rest %= n; }
  }
  return neg + out.join(" ");
}

function fmtRate(x) { return x >= 100 ? Math.round(x).toLocaleString("en") : x.toFixed(1); }
function fmtInt(x) { return Number(x).toLocaleString("en"); }
function fmtPct(x) { return (100 * x).toFixed(1) + "%"; }
function fmtTime(s) { return s ? s.replace("T", " ").replace(/\.\d+Z$/, "Z") : "–"; }
function keyLink(key) { return el("a", { href: "key.html?key=" + encodeURIComponent(key) }, key); }

function setStatus(text, error) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.classList.toggle("error", !!error);
}

function fill(tbody, rows, empty, cols) {
  tbody.replaceChildren(...rows);
  if (rows.length === 0) tbody.append(el("tr", { class: "empty" }, el("td", { colspan: cols }, empty)));
}

// ---- data and the token ----------------------------------------------

class NeedToken extends Error {}

async function getJSON(path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN);
  if (token) headers.Authorization = "Bearer " + token;
  const resp = await fetch("api/" + path, { headers, cache: "no-store" });
  let body = {};
  try { body = await resp.json(); } catch (e) { /* not JSON */ }
  if (resp.status === 401) throw new NeedToken(body.error || "admin token needed");
  if (!resp.ok) throw new Error(body.error || resp.status + " " + resp.statusText);
  return body;
}

function askToken(message) {
  const form = document.getElementById("token-form");
  form.hidden = false;
  form.querySelector("p").textContent = message;
  document.getElementById("token-input").focus();
}

document.getElementById("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = document.getElementById("token-input");
  sessionStorage.setItem(TOKEN, input.value);
  input.value = "";
  document.getElementById("token-form").hidden = true;
  tick();
});

document.getElementById("token-forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN);
  location.reload();
});

document.getElementById("auto").addEventListener("change", () => tick());

async function tick() {
  clearTimeout(timer);
  document.getElementById("token-forget").hidden = !sessionStorage.getItem(TOKEN);
  try {
    const when = await render();
    setStatus(when ? "updated " + fmtTime(when) : "");
    document.body.dataset.ready = "1";
  } catch (e) {
    if (e instanceof NeedToken) {
      const had = sessionStorage.getItem(TOKEN);
      sessionStorage.removeItem(TOKEN);
      askToken(had ? "That token was refused. Enter the node's admin token." : e.message + ".");
      setStatus("admin token needed", true);
      return; // no refresh until a token is entered
    }
    setStatus(e.message, true);
  }
  if (document.getElementById("auto").checked) timer = setTimeout(tick, refreshMs);
}

// ---- cluster page -----------------------------------------------------

async function renderCluster() {
  const d = await getJSON("overview");
  const live = d.members.filter((m) => m.state === "alive" || m.state === "leaving").length;
  const s = document.getElementById("summary");
  s.replaceChildren(
    "Answered by ", el("b", {}, d.node), " · view epoch ", el("b", {}, d.epoch),
    " · map version ", el("b", {}, d.mapVersion), " · leader ", el("b", {}, d.leader || "none"),
    " · ", el("b", {}, live), " live of ", el("b", {}, d.members.length), " members · ",
    el("b", {}, fmtRate(d.totals.decisionsPerSec)), " decisions/s, ",
    el("b", {}, fmtRate(d.totals.denialsPerSec)), " denials/s, ",
    el("b", {}, fmtRate(d.totals.errorsPerSec)), " errors/s");

  const rows = d.members.map((m) => {
    const cells = [
      el("td", { class: "name" }, m.name),
      el("td", {}, el("span", { class: "state state-" + m.state }, m.state)),
      el("td", {}, m.grpcAddr || "–"),
      el("td", { class: "num" }, fmtPct(m.share)),
    ];
    if (m.error) {
      cells.push(el("td", { colspan: 8, class: "err" }, m.error));
    } else if (!m.startedAt) {
      cells.push(el("td", { colspan: 8 }, "–"));
    } else {
      cells.push(
        el("td", { class: "num uptime" }, fmtDur(m.uptimeMs)),
        el("td", { class: "num decisions" }, fmtRate(m.decisionsPerSec)),
        el("td", { class: "num denials" }, fmtRate(m.denialsPerSec)),
        el("td", { class: "num errors" }, fmtRate(m.errorsPerSec)),
        el("td", { class: "num" }, fmtDur(m.p50Ms)),
        el("td", { class: "num" }, fmtDur(m.p99Ms)),
        el("td", { class: "num" }, fmtDur(m.maxMs)),
        el("td", {}, sparkline(m.decisions || [])));
    }
    const tr = el("tr", { "data-node": m.name, class: m.error ? "error" : "" }, ...cells);
    return tr;
  });
  fill(document.querySelector("#members tbody"), rows, "no members", 12);

  drawRates(document.getElementById("rates"), d.series);
  drawTop("decisions", d.topDecisions, "decisions");
  drawTop("denials", d.topDenials, "denials");

  const changes = d.changes.map((c) => el("tr", {},
    el("td", { title: fmtTime(c.at) }, fmtDur(c.agoMs) + " ago"), el("td", { class: "num" }, c.epoch), el("td", {}, c.member),
    el("td", {}, c.kind), el("td", {}, el("span", { class: "state state-" + c.state }, c.state)),
    el("td", { class: "num" }, c.members)));
  fill(document.querySelector("#changes tbody"), changes, "none seen (a single node, or no change since this node started)", 6);
  return d.readAt;
}

function drawTop(which, t, noun) {
  const rows = t.keys.map((k, i) => el("tr", { "data-rank": i + 1 },
    el("td", { class: "key" }, keyLink(k.key)),
    el("td", { class: "num count" }, fmtInt(k.count)),
    el("td", { class: "num" }, k.error ? "±" + fmtInt(k.error) : "exact"),
    el("td", { class: "num" }, t.total ? fmtPct(k.count / t.total) : "–"),
    el("td", { class: "owner" }, k.owner)));
  fill(document.querySelector("#top-" + which + " tbody"), rows, "no " + noun + " in the last minute", 5);
  document.getElementById("bound-" + which).textContent =
    "Over the last " + fmtDur(t.windowMs) + ": " + fmtInt(t.total) + " " + noun + " in all. " +
    "Counts come from bounded sketches: each is at most its ± above the true count" +
    (t.floor ? ", and a key not listed had at most " + fmtInt(t.floor) + "." : "; every key that had any is listed.");
}

function sparkline(values) {
  const w = 140, h = 24, n = values.length;
  const top = Math.max(1, ...values);
  const pts = values.map((v, i) => (n > 1 ? (i * w) / (n - 1) : 0).toFixed(1) + "," + (h - 1 - (v / top) * (h - 2)).toFixed(1));
  const s = svg("svg", { class: "spark", viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none" });
  s.append(svg("polyline", { points: pts.join(" ") }));
  return s;
}

// niceMax rounds a chart's top up to 1, 2 or 5 times a power of ten.
function niceMax(x) {
  if (x <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(x)));
  for (const m of [1, 2, 5, 10]) if (x <= m * p) return m * p;
  return 10 * p;
}

function drawRates(root, s) {
  const W = 960, H = 220, L = 56, R = 10, T = 10, B = 24;
  const n = s.decisions.length;
  const top = niceMax(Math.max(...s.decisions, ...s.denials, ...s.errors, 1));
  const x = (i) => L + (n > 1 ? (i * (W - L - R)) / (n - 1) : 0);
  const y = (v) => T + (H - T - B) * (1 - v / top);
  const parts = [];
  for (const f of [0, 0.5, 1]) {
    parts.push(svg("line", { class: "grid", x1: L, x2: W - R, y1: y(f * top), y2: y(f * top) }));
    parts.push(svg("text", { x: L - 6, y: y(f * top) + 4, "text-anchor": "end" }, fmtInt(f * top) + "/s"));
  }
  for (let i = n - 1; i >= 0; i -= 60) {
    const ago = n - 1 - i;
    parts.push(svg("text", { x: x(i), y: H - 6, "text-anchor": "middle" }, ago === 0 ? "now" : "−" + ago / 60 + " m"));
  }
  for (const k of ["decisions", "denials", "errors"]) {
    const pts = s[k].map((v, i) => x(i).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
    parts.push(svg("polyline", { class: "line " + k, points: pts }));
  }
  root.replaceChildren(...parts);
}

// ---- key page ---------------------------------------------------------

const params = new URLSearchParams(location.search);

if (page === "key") {
  const input = document.getElementById("key-input");
  input.value = params.get("key") || "";
  document.getElementById("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.search = "?key=" + encodeURIComponent(input.value);
  });
  document.getElementById("envoy-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams({ domain: document.getElementById("envoy-domain").value });
    for (const line of document.getElementById("envoy-entries").value.split("\n")) {
      if (line.trim() !== "") q.append("entry", line.trim());
    }
    const out = document.getElementById("envoy-result");
    try {
      const r = await getJSON("envoykey?" + q);
      out.replaceChildren("Key: ", keyLink(r.key));
      out.dataset.key = r.key;
    } catch (e) {
      if (e instanceof NeedToken) askToken(e.message + ".");
      out.textContent = e.message;
    }
  });
}

async function renderKey() {
  const key = params.get("key");
  if (!key) return null;
  const k = await getJSON("key?key=" + encodeURIComponent(key));
  document.getElementById("key-state").hidden = false;
  document.getElementById("key-name").textContent = k.key;
  document.getElementById("key-missing").hidden = k.found;

  const o = document.getElementById("key-override");
  o.hidden = !k.override;
  if (k.override) {
    const v = k.override, what = [];
    if (v.limit) what.push("limit " + fmtInt(v.limit));
    if (v.windowMs) what.push("window " + fmtDur(v.windowMs));
    if (v.algorithm) what.push(v.algorithm);
    o.replaceChildren(el("b", {}, "Override in force: "), what.join(", "),
      " (" + (v.prefix ? "every key starting with " + v.key : "this key") + "), ",
      v.expiresAt ? "expires in " + fmtDur(v.expiresInMs) + " (" + fmtTime(v.expiresAt) + ")" : "never expires",
      v.note ? " — " + v.note : "");
  }

  const figs = [];
  const fig = (name, value, cls) => figs.push(el("div", { class: cls || "" }, el("dt", {}, name), el("dd", {}, value)));
  if (k.found) {
    fig("algorithm", k.algorithm, "algorithm");
    fig("limit", fmtInt(k.limit) + " per " + fmtDur(k.windowMs), "limit");
    fig("used", fmtInt(k.used), "used");
    fig("remaining", fmtInt(k.remaining), "remaining");
    fig("retry after", k.retryAfterMs ? fmtDur(k.retryAfterMs) : "0 (allowed now)", "retry");
    fig("reset after", fmtDur(k.resetAfterMs), "reset");
  }
  fig("owner", k.owner || "–", "owner");
  fig("standby", k.standby || "none", "standby");
  fig("answered by", k.node, "node");
  if (k.found) {
    fig("in memory", k.inMemory ? "yes" : "no (on disk)");
    if (k.expiresAt) fig("state expires", fmtTime(k.expiresAt));
    if (k.slidingWindow) fig("previous / current bucket", k.slidingWindow.previous + " / " + k.slidingWindow.current);
    if (k.tokenBucket) fig("tokens", k.tokenBucket.tokens.toFixed(2));
  }
  document.getElementById("key-figures").replaceChildren(...figs);

  const holders = document.getElementById("key-holders");
  holders.hidden = !(k.found && k.holders && k.holders.length);
  if (!holders.hidden) {
    document.getElementById("key-holders-rows").replaceChildren(...k.holders.map((h) => el("tr", {},
      el("td", {}, h.holder || "– (unnamed, or read from disk or a copy)"), el("td", { class: "num" }, fmtInt(h.reservations)),
      el("td", { class: "num" }, fmtInt(h.leases)), el("td", { class: "num" }, fmtInt(h.hits)), el("td", {}, h.expiresAt ? fmtTime(h.expiresAt) : "–"),
      el("td", { class: "num" }, h.demand ? fmtInt(h.demand) : "–"), el("td", { class: "num" }, h.share ? fmtInt(h.share) : (h.demand ? "all it wants" : "–")),
      el("td", { class: "num" }, fmtInt(h.leased)))));
    document.getElementById("key-lease-denials").textContent = fmtInt(k.leaseDenials) +
      " checks denied while a quota lease was open (since the key last held no reservation): what the room held by leases may have cost.";
  }

  const log = document.getElementById("key-log");
  log.hidden = !(k.found && k.runs);
  if (!log.hidden) drawTimeline(document.getElementById("timeline"), k);
  return k.readAt;
}

// drawTimeline draws a sliding log over [−window, +window] around now:
// the hits left of now, and right of now when their capacity returns.
function drawTimeline(root, k) {
  const W = 960, H = 270, L = 50, R = 20, win = k.windowMs;
  const x = (t) => L + ((t + win) / (2 * win)) * (W - L - R);
  const hitsTop = 20, hitsBottom = 100, capTop = 170, capBottom = 240;
  // A label right of x, or left of it near the right edge.
  const label = (at, y, text) => {
    const right = x(at) > W - R - 160;
    return svg("text", { x: x(at) + (right ? -4 : 4), y, "text-anchor": right ? "end" : "start" }, text);
  };
  const maxRun = Math.max(1, ...k.runs.map((r) => r.count));
  const parts = [
    svg("text", { x: x(-win) + 4, y: 12 }, "hits in the window (" + fmtInt(k.used) + ")"),
    svg("line", { class: "grid", x1: L, x2: W - R, y1: hitsBottom, y2: hitsBottom }),
    svg("line", { class: "edge", x1: x(-win), x2: x(-win), y1: hitsTop, y2: capBottom }),
    svg("text", { x: x(-win) + 4, y: hitsBottom + 14 }, "window edge: hits before it have left"),
    svg("line", { class: "now", x1: x(0), x2: x(0), y1: hitsTop, y2: capBottom }),
    svg("text", { x: x(0) + 4, y: hitsTop + 10 }, "now"),
    svg("text", { x: x(-win), y: H - 8, "text-anchor": "start" }, "−" + fmtDur(win)),
    svg("text", { x: x(0), y: H - 8, "text-anchor": "middle" }, "now"),
    svg("text", { x: x(win), y: H - 8, "text-anchor": "end" }, "+" + fmtDur(win)),
  ];
  const bw = Math.max(2, (W - L - R) / 400);
  for (const r of k.runs) {
    const h = Math.max(2, ((hitsBottom - hitsTop - 14) * r.count) / maxRun);
    const bar = svg("rect", { class: "hit", x: x(r.atMs) - bw / 2, y: hitsBottom - h, width: bw, height: h });
    bar.append(svg("title", {}, r.count + " hit" + (r.count === 1 ? "" : "s") + " " + fmtDur(-r.atMs) + " ago; back in " + fmtDur(r.atMs + win)));
    parts.push(bar);
    parts.push(svg("line", { class: "return", x1: x(r.atMs + win), x2: x(r.atMs + win), y1: capBottom, y2: capBottom + 5 }));
  }
  // Remaining capacity from now on, if nothing else arrives: each run's
  // hits come back one window after they were counted.
  const yc = (v) => capBottom - ((capBottom - capTop) * Math.max(0, Math.min(v, k.limit))) / Math.max(1, k.limit);
  let rem = k.remaining, pts = [x(0) + "," + yc(rem)];
  for (const r of k.runs) {
    const t = r.atMs + win;
    if (t <= 0) continue;
    pts.push(x(t) + "," + yc(rem));
    rem += r.count;
    pts.push(x(t) + "," + yc(rem));
  }
  pts.push(x(win) + "," + yc(rem));
  parts.push(svg("line", { class: "grid", x1: x(0), x2: W - R, y1: capBottom, y2: capBottom }));
  parts.push(svg("text", { x: x(0) - 6, y: capTop + 4, "text-anchor": "end" }, fmtInt(k.limit)));
  parts.push(svg("text", { x: x(0) - 6, y: capBottom, "text-anchor": "end" }, "0"));
  parts.push(svg("text", { x: x(0) - 6, y: (capTop + capBottom) / 2 + 4, "text-anchor": "end" }, "remaining now: " + fmtInt(k.remaining)));
  parts.push(svg("text", { x: x(0) + 4, y: capTop - 38 }, "capacity returning as hits leave the window"));
  parts.push(svg("polyline", { class: "capacity", points: pts.join(" ") }));
  if (k.retryAfterMs > 0) {
    parts.push(svg("line", { class: "retry", x1: x(k.retryAfterMs), x2: x(k.retryAfterMs), y1: capTop - 4, y2: capBottom }));
    parts.push(label(k.retryAfterMs, capTop - 8, "retry after " + fmtDur(k.retryAfterMs)));
  }
  if (k.resetAfterMs > 0) {
    parts.push(svg("line", { class: "reset", x1: x(k.resetAfterMs), x2: x(k.resetAfterMs), y1: capTop - 4, y2: capBottom }));
    parts.push(label(k.resetAfterMs, capTop - 22, "reset after " + fmtDur(k.resetAfterMs)));
  }
  root.replaceChildren(...parts);
}

// ---- overrides page ---------------------------------------------------

async function renderOverrides() {
  const d = await getJSON("overrides");
  const rows = d.overrides.map((o) => el("tr", {},
    el("td", { class: "key" }, o.prefix ? o.key : keyLink(o.key)),
    el("td", {}, o.prefix ? "prefix" : "exact key"),
    el("td", { class: "num" }, o.limit ? fmtInt(o.limit) : "as checked"),
    el("td", { class: "num" }, o.windowMs ? fmtDur(o.windowMs) : "as checked"),
    el("td", {}, o.algorithm || "as checked"),
    el("td", {}, o.expiresAt ? "in " + fmtDur(o.expiresInMs) + " (" + fmtTime(o.expiresAt) + ")" : "never"),
    el("td", { class: "note-cell" }, o.note || ""),
    el("td", {}, fmtTime(o.setAt))));
  fill(document.querySelector("#overrides tbody"), rows, "no overrides", 8);
  return d.readAt;
}

const render = { cluster: renderCluster, key: renderKey, overrides: renderOverrides }[page];
tick();
