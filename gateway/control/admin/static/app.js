// The live page of canary-gateway's admin API: a client of the JSON API and nothing more.
// It reads what the report path computes (GET /admin/candidates, /admin/status, one
// candidate's /report) and the ramp (GET /admin/rollout), and draws them; promote, rollback
// and the ramp's start, pause, resume, advance and abort go through the API, which gates
// them and writes the audit log. The token lives in this tab's sessionStorage and leaves only
// as an Authorization header; an open admin API (insecure_admin) asks for none.
"use strict";

const API = new URL("..", location.href).pathname.replace(/\/$/, ""); // "/admin"
const TOKEN_KEY = "canary-admin-token";
// Written into the page by the server at start-up: "open" when the admin API takes no token.
const OPEN = document.querySelector('meta[name="canary-admin-auth"]')?.content === "open";
const RATE_FLOOR = 0.005; // per second: below it a rate shows as 0 (traffic stopped)
const LIST_MS = 5000; // the candidate list (cheap: the registry and the rate controller)
const LIST_REPORT_MS = 20000; // each candidate's report on the list, one at a time
const DETAIL_MS = 3000; // the open candidate's report
const REPORT_COST = 5; // wait at least this many times as long as the last report took
const MAX_BACKOFF_MS = 60000; // after errors, waits double up to this
const SVG_NS = "http://www.w3.org/2000/svg";
const GATING = new Set(["critical", "guardrail", "goal"]);
const ROLE = { critical: "critical", guardrail: "guardrail", goal: "goal", diagnostic: "diagnostic" };

const state = {
  view: null, // "list" | "detail"
  name: null, // the open candidate
  timer: null,
  failures: 0,
  generation: 0, // bumped on every navigation: answers for an older view are dropped
  reports: new Map(), // name -> {report, at} (the list's last look at each candidate)
  listTurn: 0,
  verdicts: new Map(), // name -> last verdict shown (the list and the detail agree)
  confirmAction: null,
  rollout: null, // the last GET /admin/rollout answer ({state: "none"} before the first ramp)
  reads: 0, // reads of the API begun (each tick is one); see markRead
};

// --- small helpers ----------------------------------------------------------------------------

function $(id) {
  return document.getElementById(id);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c ?? ""));
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function num(v) {
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}

function fmt(v, digits = 3) {
  const x = num(v);
  if (x === null) return "–";
  if (Number.isInteger(x) && Math.abs(x) < 1e6) return x.toLocaleString("en");
  return Number(x.toPrecision(digits)).toString();
}

// A rate per second: 3 significant digits, 0 below RATE_FLOOR (a decaying average that
// would otherwise print 0.00000619 after traffic stops).
function perSecond(v) {
  const x = num(v);
  if (x === null) return "–";
  if (Math.abs(x) < RATE_FLOOR) return "0";
  return x.toLocaleString("en", { maximumSignificantDigits: 3 });
}

function pct(v) {
  const x = num(v);
  return x === null ? "–" : `${(100 * x).toFixed(1)} %`;
}

function secs(v) {
  const x = num(v);
  if (x === null) return "–";
  return x < 1 ? `${(1000 * x).toFixed(1)} ms` : `${x.toFixed(2)} s`;
}

function duration(v) {
  const x = num(v);
  if (x === null) return "–";
  if (x < 90) return `≈${Math.round(x)} s`;
  if (x < 5400) return `≈${Math.round(x / 60)} min`;
  if (x < 172800) return `≈${(x / 3600).toFixed(1)} h`;
  return `≈${(x / 86400).toFixed(1)} d`;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function row(cells, attrs) {
  return el("tr", attrs, ...cells.map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c))));
}

// --- the API ----------------------------------------------------------------------------------

class Unauthorized extends Error {}

function authorized() {
  return OPEN || Boolean(sessionStorage.getItem(TOKEN_KEY));
}

async function api(method, path, body) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!OPEN && !token) throw new Unauthorized("no token");
  const init = {
    method,
    headers: OPEN
      ? { Accept: "application/json" }
      : { Authorization: `Bearer ${token}`, Accept: "application/json" },
    cache: "no-store",
    credentials: "omit",
    referrerPolicy: "no-referrer",
  };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(API + path, init);
  const data = resp.headers.get("Content-Type")?.includes("json") ? await resp.json() : null;
  if (resp.status === 401) throw new Unauthorized(data?.error?.message || "token refused");
  return { status: resp.status, data };
}

function apiError(res) {
  return res.data?.error?.message || `HTTP ${res.status}`;
}

// --- token ------------------------------------------------------------------------------------

function showLogin(message) {
  stopPolling();
  if (OPEN) {
    // The API was open when this page was served; a 401 now means the gateway changed.
    $("updated").textContent = "The admin API now asks for a token: reload the page.";
    return;
  }
  sessionStorage.removeItem(TOKEN_KEY);
  for (const id of ["list-view", "detail-view", "label-view"]) $(id).hidden = true;
  $("forget").hidden = true;
  $("live").textContent = "";
  $("updated").textContent = "";
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("token").focus();
}

async function login() {
  const token = $("token").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token").value = "";
  try {
    // A labeller's token may reach the labelling view only (label.js): its first call checks it.
    const res = labelRoute(location.hash) ? { status: 200 } : await api("GET", "/status");
    if (res.status !== 200) {
      showLogin(apiError(res));
      return;
    }
  } catch (err) {
    showLogin(err instanceof Unauthorized ? "The admin API refused this token." : String(err));
    return;
  }
  $("login").hidden = true;
  $("forget").hidden = false;
  route();
}

// --- polling ----------------------------------------------------------------------------------

function stopPolling() {
  clearTimeout(state.timer);
  state.timer = null;
}

function schedule(ms) {
  stopPolling();
  if (document.hidden || state.view === "label") return; // resumed by visibilitychange
  state.timer = setTimeout(tick, ms);
}

// The page says which of its reads of the API has ended and how, on #updated: data-begun is
// the number of the newest read begun, data-read that of the newest read ended for the view
// shown (an answer for a view left meanwhile is not one), data-outcome how it ended ("ok",
// "failed", "refused"). A client of the page (a browser test, a monitor) waits for this
// instead of guessing how long a poll takes; the tab shown again reads at once.
function markRead(read, outcome) {
  const status = $("updated");
  if (read <= Number(status.dataset.read || 0)) return; // a newer read ended first
  status.dataset.read = String(read);
  status.dataset.outcome = outcome;
}

async function tick() {
  const generation = state.generation;
  const read = ++state.reads;
  $("updated").dataset.begun = String(read);
  const started = performance.now();
  let next;
  let outcome = "ok";
  try {
    next = state.view === "detail" ? await pollDetail(generation) : await pollList(generation);
    state.failures = 0;
    $("updated").textContent = `updated ${new Date().toLocaleTimeString("en-GB")}`;
  } catch (err) {
    if (err instanceof Unauthorized) {
      showLogin("The admin API refused the token (401). Type it again.");
      markRead(read, "refused");
      return;
    }
    state.failures += 1;
    outcome = "failed";
    $("updated").textContent = `update failed: ${err.message || err}; retrying`;
    next = Math.min(MAX_BACKOFF_MS, DETAIL_MS * 2 ** state.failures);
  }
  if (generation !== state.generation) return; // navigated meanwhile: route() rescheduled
  markRead(read, outcome);
  const took = performance.now() - started;
  schedule(Math.max(next, REPORT_COST * took));
}

document.addEventListener("visibilitychange", () => {
  if (document.hidden) stopPolling();
  else if (authorized() && state.view) schedule(0);
});

// --- the list ---------------------------------------------------------------------------------

async function pollList(generation) {
  const [list, status, rollout] = await Promise.all([
    api("GET", "/candidates"),
    api("GET", "/status"),
    api("GET", "/rollout"),
  ]);
  if (list.status !== 200) throw new Error(apiError(list));
  if (generation !== state.generation) return LIST_MS;
  if (status.status === 200) showStatus(status.data);
  showRollout(rollout);
  const candidates = list.data.candidates.filter((c) => c.role !== "retired");
  renderList(candidates, list.data.rates || {});
  // One report per tick, the one looked at longest ago, none fresher than LIST_REPORT_MS.
  const now = Date.now();
  const stale = candidates
    .filter((c) => c.state === "active" || !state.reports.has(c.name))
    .filter((c) => now - (state.reports.get(c.name)?.at || 0) >= LIST_REPORT_MS)
    .sort((a, b) => (state.reports.get(a.name)?.at || 0) - (state.reports.get(b.name)?.at || 0));
  if (stale.length) {
    const name = stale[0].name;
    const res = await api("GET", `/candidates/${encodeURIComponent(name)}/report`);
    if (res.status === 200 && generation === state.generation) {
      state.reports.set(name, { report: res.data, at: Date.now() });
      renderList(candidates, list.data.rates || {});
    }
  }
  return LIST_MS;
}

function showStatus(status) {
  $("live").textContent = `live: ${status.live.name}`;
  const last = status.last_promotion;
  $("last-promotion").textContent = last
    ? `last change: ${last.action} ${last.from_endpoint ?? "–"} → ${last.to_endpoint} by ${last.actor}` +
      ` at ${new Date(last.at * 1000).toLocaleString("en-GB")}${last.forced ? " (forced)" : ""}`
    : "no promotion yet";
}

function verdictBadge(verdict, id) {
  const attrs = { class: `verdict ${verdict || ""}`, "data-verdict": verdict || "" };
  if (id) attrs.id = id;
  return el("span", attrs, verdict || "…");
}

function renderList(candidates, rates) {
  $("list-empty").hidden = candidates.length > 0;
  const rows = candidates.map((c) => {
    const r = state.reports.get(c.name)?.report;
    const acc = r?.accounting || {};
    const rate = rates[c.name] || {};
    const dropped = (acc.dropped_overflow || 0) + (acc.dropped_oversize || 0);
    const link = el("a", { href: `#/c/${encodeURIComponent(c.name)}` }, c.name);
    return row(
      [
        link,
        c.kind || "–",
        c.state,
        el("td", {}, verdictBadge(r?.verdict)),
        r ? fmt(r.pairs.n) : "…",
        r ? pct(r.pairs.coverage) : "…",
        r ? `${fmt(acc.sampled)} / ${fmt((acc.observed_ok || 0) + (acc.observed_error || 0))} / ${fmt(dropped)} / ${fmt((acc.shed_overload || 0) + (acc.shed_capacity || 0))}` : "…",
        rate.effective_sample_rate != null
          ? `${pct(rate.effective_sample_rate)} (max ${pct(c.sample_rate)})`
          : pct(c.sample_rate),
        `${perSecond(c.target_rps)} / ${perSecond(rate.realized_copies_per_second)}`,
      ],
      { "data-candidate": c.name },
    );
  });
  fill($("candidates").tBodies[0], rows);
}

// --- one candidate ----------------------------------------------------------------------------

async function pollDetail(generation) {
  const name = state.name;
  const [res, rollout] = await Promise.all([
    api("GET", `/candidates/${encodeURIComponent(name)}/report`),
    api("GET", "/rollout"),
  ]);
  if (generation !== state.generation) return DETAIL_MS;
  showRollout(rollout);
  if (res.status === 404) {
    $("d-summary").textContent = `${name}: ${apiError(res)}`;
    return LIST_MS;
  }
  if (res.status !== 200) throw new Error(apiError(res));
  state.reports.set(name, { report: res.data, at: Date.now() });
  renderDetail(res.data);
  return DETAIL_MS;
}

function renderDetail(r) {
  $("d-name").textContent = r.candidate;
  $("d-verdict").replaceWith(verdictBadge(r.verdict, "d-verdict"));
  const p = r.pairs;
  const head = r.reasons.find((x) => x.metric === "verdict");
  $("d-summary").textContent =
    `${head ? head.reason : r.verdict} · kind ${r.kind || "–"} · ${fmt(p.n)} pairs ` +
    `(${fmt(p.used_latency)} usable, ${fmt(p.sessions)} sessions) against ${p.reference}` +
    ` · coverage ${pct(p.coverage)} · report built ${new Date(r.generated_at * 1000).toLocaleTimeString("en-GB")}`;
  fill(
    $("d-gates").tBodies[0],
    r.reasons
      .filter((x) => x.metric !== "verdict")
      .map((x) => row([x.metric, el("td", { class: `status-${x.status}` }, x.status), x.reason])),
  );
  const metrics = Object.values(r.metrics);
  const gating = metrics.filter((m) => GATING.has(m.role));
  $("d-plots").replaceChildren(...gating.map(plotCard));
  const undecided = gating.filter((m) => m.status === "undecided" && m.more_pairs);
  $("d-todecide-none").hidden = undecided.length > 0;
  fill(
    $("d-todecide").tBodies[0],
    undecided.map((m) => row([m.label, fmt(m.more_pairs), duration(m.eta_s)])),
  );
  fill(
    $("d-metrics").tBodies[0],
    metrics.map((m) =>
      row([
        m.label,
        ROLE[m.role] || m.role,
        m.status === "insufficient" ? "–" : fmt(m.estimate),
        num(m.ci_low) === null ? "–" : `[${fmt(m.ci_low)}, ${fmt(m.ci_high)}]`,
        m.margin == null ? "–" : fmt(m.margin),
        fmt(m.n),
        el("td", { class: `status-${m.status}` }, m.status),
      ]),
    ),
  );
  renderGrader(r.metrics);
  fill(
    $("d-turns").tBodies[0],
    r.ttft_by_turn.map((t) =>
      row([
        t.turn,
        fmt(t.n),
        secs(t.median_candidate_s),
        secs(t.median_reference_s),
        fmt(t.ratio),
        num(t.ci_low) === null ? "–" : `[${fmt(t.ci_low)}, ${fmt(t.ci_high)}]`,
        pct(t.cached_fraction_candidate),
      ]),
    ),
  );
  fill(
    $("d-accounting").tBodies[0],
    Object.entries(r.accounting).map(([k, v]) =>
      row([k, k.endsWith("_at") ? new Date(v * 1000).toISOString() : fmt(v)]),
    ),
  );
  $("d-caveats").replaceChildren(...r.caveats.map((c) => el("li", {}, c)));
}

// A model upgrade's grader (docs/grading.md): what it said, its biases, what it cost. Hidden for
// a candidate without one.
function renderGrader(metrics) {
  const pref = metrics.preference;
  $("d-grader-panel").hidden = !pref;
  if (!pref) return;
  const d = pref.detail || {};
  const bias = metrics.grader_position_bias;
  const aa = metrics.grader_aa;
  const interval = (m) => (num(m.ci_low) === null ? "" : ` [${pct(m.ci_low)}, ${pct(m.ci_high)}]`);
  const rows = [
    ["pairs graded", fmt(d.pairs_graded)],
    ["win / tie / loss (candidate)", `${pct(d.win_share)} / ${pct(d.tie_share)} / ${pct(d.loss_share)}`],
    ["net preference", `${pct(pref.estimate)}${interval(pref)} (margin −${pct(pref.margin)})`],
    ["position bias (first shown wins − ½)", bias && num(bias.estimate) !== null ? `${pct(bias.estimate)}${interval(bias)} over ${fmt(bias.n)} decisive` : "–"],
    ["flip rate (pairs graded both ways)", `${pct(d.flip_rate)} of ${fmt(d.pairs_both_orders)}`],
    ["length-controlled net (not gating)", pct(d.length_controlled)],
    ["grader A/A (control vs production)", aa && num(aa.estimate) !== null ? `${pct(aa.estimate)}${interval(aa)}` : "–"],
    ["graded / unparseable / failed / over cap", [d.gradings_graded, d.gradings_unparseable, d.gradings_failed, d.gradings_over_cap].map(fmt).join(" / ")],
    ["grader tokens, cost", `${fmt(d.grader_tokens)} tokens, $${num(d.grader_cost_usd) === null ? "–" : d.grader_cost_usd.toFixed(2)}`],
    ...pairAccounting(d),
  ];
  fill($("d-grader").tBodies[0], rows.map(([k, v]) => row([k, v])));
  renderHuman(metrics); // human.js: what people prefer, when the candidate has labels
}

// Every complete pair: graded, or not graded by reason (the report's
// evaluators.pairs.gradings.PAIR_OUTCOME_LABELS, in its order); the rows add up to the total.
const PAIR_OUTCOME_LABELS = {
  graded: "graded",
  not_sampled: "not sampled by the grader's rate",
  queue_full: "queue full (grading_max_pending)",
  no_answer: "an answer failed or missing",
  over_cap: "over cap (max_per_minute or daily budget)",
  failed: "grader failed",
  unparseable: "grader's answer unparseable",
  stopped: "mirror stopped before grading",
  unrecorded: "no grading record",
};
function pairAccounting(d) {
  if (num(d.complete_pairs) === null) return [];
  const out = [["complete pairs (graded + not graded)", fmt(d.complete_pairs)]];
  for (const [key, label] of Object.entries(PAIR_OUTCOME_LABELS)) {
    const n = d[`complete_pairs_${key}`];
    if (key === "graded" || n) out.push([`  ${key === "graded" ? "" : "not graded: "}${label}`, fmt(n)]);
  }
  return out;
}

// The horizontal references of a metric's plot: its margins, its goal and no change (as the
// HTML report draws them).
function referenceLines(m) {
  const out = [["no change", m.scale === "ratio" ? 1 : 0]];
  if (num(m.goal) !== null) out.push(["goal", m.goal]);
  for (const [label, value] of [["margin", m.margin], ["critical", m.critical_margin]]) {
    if (num(value) === null) continue;
    if (m.harm === "higher" || m.harm === "both") out.push([label, value]);
    if (m.harm === "lower" || m.harm === "both")
      out.push([`${label} (low)`, m.scale === "ratio" ? 1 / value : -value]);
  }
  return out;
}

function plotCard(m) {
  const card = el("div", { class: "plot", "data-metric": m.name });
  card.append(trajectoryChart(`${m.label}: interval against pairs`, m.trajectory || [], referenceLines(m)));
  card.append(el("p", { class: `status-${m.status}` }, m.reason || m.status));
  return card;
}

const W = 560;
const H = 260;
const PAD = { l: 56, r: 16, t: 28, b: 40 };
const LINE_COLORS = ["#2b8a3e", "#862e9c", "#e67700", "#1c7ed6"];

function ticks(lo, hi) {
  const span = Math.max(hi - lo, 1e-12);
  const base = 10 ** Math.floor(Math.log10(span / 5));
  const step = [1, 2, 5, 10].map((m) => base * m).find((s) => span / s <= 6);
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-12; t += step) out.push(t);
  return out;
}

function trajectoryChart(title, points, lines) {
  const root = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  const pts = points
    .filter((p) => num(p[1]) !== null && num(p[2]) !== null)
    .map((p) => [num(p[0]) || 0, p[1], p[2]]);
  root.append(svg("text", { x: W / 2, y: 16, "text-anchor": "middle", class: "t" }, pts.length < 2 ? `${title} (too few looks)` : title));
  if (pts.length < 2) return root;
  const values = pts.flatMap((p) => [p[1], p[2]]).concat(lines.map((l) => l[1]));
  const last = pts[pts.length - 1];
  const ref = lines.map((l) => l[1]).concat([last[1], last[2]]);
  const spread = Math.max(...ref) - Math.min(...ref) || Math.abs(ref[0]) || 1;
  const yLo = Math.max(Math.min(...values), Math.min(...ref) - 3 * spread);
  const yHi = Math.min(Math.max(...values), Math.max(...ref) + 3 * spread);
  const [xLo, xHi] = [pts[0][0], last[0]];
  const sx = (v) => PAD.l + ((xHi > xLo ? (v - xLo) / (xHi - xLo) : 0.5) * (W - PAD.l - PAD.r));
  const sy = (v) => H - PAD.b - (yHi > yLo ? (Math.min(Math.max(v, yLo), yHi) - yLo) / (yHi - yLo) : 0.5) * (H - PAD.t - PAD.b);
  root.append(
    svg("line", { x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b, class: "a" }),
    svg("line", { x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: H - PAD.b, class: "a" }),
    svg("text", { x: (PAD.l + W - PAD.r) / 2, y: H - 6, "text-anchor": "middle" }, "pairs"),
    svg("text", { x: 12, y: (PAD.t + H - PAD.b) / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${(PAD.t + H - PAD.b) / 2})` }, "always-valid interval"),
  );
  for (const t of ticks(xLo, xHi)) {
    root.append(svg("text", { x: sx(t).toFixed(1), y: H - PAD.b + 14, "text-anchor": "middle" }, fmt(t)));
  }
  for (const t of ticks(yLo, yHi)) {
    root.append(svg("text", { x: PAD.l - 4, y: (sy(t) + 4).toFixed(1), "text-anchor": "end" }, fmt(t)));
  }
  const band = pts.map(([x, , hi]) => `${sx(x).toFixed(1)},${sy(hi).toFixed(1)}`)
    .concat(pts.slice().reverse().map(([x, lo]) => `${sx(x).toFixed(1)},${sy(lo).toFixed(1)}`));
  root.append(svg("polygon", { points: band.join(" "), class: "band" }));
  root.append(svg("line", { x1: sx(last[0]), y1: sy(last[1]), x2: sx(last[0]), y2: sy(last[2]), class: "now" }));
  lines.forEach(([label, value], i) => {
    if (value < yLo || value > yHi) return;
    const y = sy(value);
    const color = LINE_COLORS[i % LINE_COLORS.length];
    root.append(
      svg("line", { x1: PAD.l, y1: y.toFixed(1), x2: W - PAD.r, y2: y.toFixed(1), stroke: color, "stroke-dasharray": "5 3" }),
      svg("text", { x: W - PAD.r - 2, y: (y - 3).toFixed(1), "text-anchor": "end" }, label),
    );
  });
  return root;
}

// --- promote and rollback ---------------------------------------------------------------------

function openConfirm({ title, text, force, action, ramp = false, forceLabel = "force: promote against the verdict" }) {
  $("c-title").textContent = title;
  $("c-text").textContent = text;
  $("c-ramp-rows").hidden = !ramp;
  $("c-force-label").textContent = forceLabel;
  $("c-force-row").hidden = !force;
  $("c-force").checked = false;
  $("c-reason").value = "";
  $("c-error").textContent = "";
  state.confirmAction = action;
  $("confirm").showModal();
}

async function confirmed() {
  const reason = $("c-reason").value.trim();
  const force = !$("c-force-row").hidden && $("c-force").checked;
  const res = await state.confirmAction({
    reason,
    force,
    steps: $("c-steps").value,
    minStep: $("c-min-step").value,
  });
  if (res.ok) $("confirm").close();
  else $("c-error").textContent = res.message;
}

function promoteDialog() {
  const name = state.name;
  const r = state.reports.get(name)?.report;
  const verdict = r?.verdict || "unknown";
  const allowed = verdict === "promote";
  openConfirm({
    title: `Promote ${name}?`,
    text: allowed
      ? `The verdict is promote. ${name} becomes the live endpoint for all production traffic; the current live endpoint is kept for rollback.`
      : `The verdict is ${verdict}, not promote: the API refuses unless you force it, with a reason for the audit log.`,
    force: !allowed,
    action: async ({ reason, force }) => {
      if (force && !reason) return { ok: false, message: "A forced promote needs a reason." };
      const res = await api("POST", `/candidates/${encodeURIComponent(name)}/promote`, { reason, force });
      if (res.status !== 200) return { ok: false, message: apiError(res) };
      location.hash = "#/";
      $("list-message").textContent = `${name} is live (promotion #${res.data.promotion.id}, verdict ${res.data.promotion.verdict ?? "none"}).`;
      return { ok: true };
    },
  });
}

function rollbackDialog() {
  openConfirm({
    title: "Roll back?",
    text: "The previous live endpoint becomes live again for all production traffic.",
    force: false,
    action: async ({ reason }) => {
      const res = await api("POST", "/rollback", { reason });
      if (res.status !== 200) return { ok: false, message: apiError(res) };
      $("list-message").textContent = `Rolled back: ${res.data.live.name} is live (promotion #${res.data.promotion.id}).`;
      schedule(0);
      return { ok: true };
    },
  });
}

// --- the ramp -------------------------------------------------------------------------------

const OPEN_STATES = new Set(["running", "paused"]);

function rampOpen() {
  return OPEN_STATES.has(state.rollout?.state);
}

// What the API accepts in each state (it refuses the rest): the buttons follow it.
function rampAllowed(r) {
  const open = OPEN_STATES.has(r?.state);
  const steps = Array.isArray(r?.steps) ? r.steps : [];
  return {
    start: Boolean(r) && !open,
    pause: r?.state === "running",
    resume: r?.state === "paused",
    advance: r?.state === "running" && num(r.step) !== null && r.step < steps.length - 1,
    abort: open,
  };
}

function showRollout(res) {
  if (res.status !== 200) {
    $("ramp-summary").textContent = `ramp unavailable: ${apiError(res)}`;
    $("ramp-summary").dataset.state = "";
    state.rollout = null;
  } else {
    state.rollout = res.data;
    renderRollout(res.data);
  }
  const allowed = rampAllowed(state.rollout);
  for (const action of ["pause", "resume", "advance", "abort"]) $(`ramp-${action}`).disabled = !allowed[action];
  $("ramp-start").disabled = !allowed.start;
}

function percent(v) {
  const x = num(v);
  return x === null ? "–" : `${fmt(x)} %`;
}

function when(at) {
  const x = num(at);
  return x === null ? "–" : new Date(x * 1000).toLocaleString("en-GB");
}

function renderRollout(r) {
  $("ramp-summary").dataset.state = r.state;
  if (r.state === "none") {
    $("ramp-summary").replaceChildren(el("span", { class: "muted" }, "no ramp yet"));
    $("ramp-plot").replaceChildren();
    $("ramp-evidence").replaceChildren();
    fill($("ramp-events").tBodies[0], []);
    return;
  }
  const steps = Array.isArray(r.steps) ? r.steps : [];
  const step = num(r.step);
  $("ramp-summary").replaceChildren(
    el("span", { class: `ramp-state ${r.state}`, id: "ramp-state" }, r.state),
    ` ${r.candidate} · weight `,
    el("strong", { id: "ramp-weight" }, percent(r.weight)),
    " of new sessions · ",
    el("span", { id: "ramp-step" }, step === null ? "step –" : `step ${step + 1} of ${steps.length}`),
    ` (${steps.map((x) => `${fmt(x)} %`).join(" → ")}) · at least ${duration(r.min_step_s)} per step · started ${when(r.started_at)}`,
  );
  const events = (r.events || []).slice().sort((a, b) => (num(a.at) || 0) - (num(b.at) || 0));
  $("ramp-plot").replaceChildren(weightChart(r, events));
  $("ramp-evidence").replaceChildren(
    ...events
      .filter((e) => evidenceTests(e.evidence).length || evidenceFacts(e.evidence).length)
      .reverse()
      .map(evidenceCard),
  );
  fill(
    $("ramp-events").tBodies[0],
    events
      .slice()
      .reverse()
      .map((e) =>
        row(
          [
            when(e.at),
            e.kind,
            `${percent(e.from_weight)} → ${percent(e.to_weight)}`,
            num(e.step) === null ? "–" : e.step + 1,
            e.actor || "–",
            e.reason || "",
          ],
          { "data-kind": e.kind },
        ),
      ),
  );
}

// The weight over time, a step function through the events, to now while the ramp is open.
function weightChart(r, events) {
  const title = "Candidate weight (percent of new sessions) over time";
  const root = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  root.append(svg("text", { x: W / 2, y: 16, "text-anchor": "middle", class: "t" }, title));
  const pts = [];
  for (const e of events) {
    const at = num(e.at);
    if (at === null) continue;
    if (pts.length) pts.push([at, pts[pts.length - 1][1]]);
    else if (num(e.from_weight) !== null && e.kind !== "start") pts.push([at, e.from_weight]);
    pts.push([at, num(e.to_weight) ?? 0]);
  }
  if (!pts.length) return root;
  const end = OPEN_STATES.has(r.state) ? Math.max(Date.now() / 1000, pts[pts.length - 1][0]) : pts[pts.length - 1][0];
  pts.push([end, pts[pts.length - 1][1]]);
  const [xLo, xHi] = [pts[0][0], Math.max(end, pts[0][0] + 1)];
  const sx = (v) => PAD.l + ((v - xLo) / (xHi - xLo)) * (W - PAD.l - PAD.r);
  const sy = (v) => H - PAD.b - (Math.min(Math.max(v, 0), 100) / 100) * (H - PAD.t - PAD.b);
  root.append(
    svg("line", { x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b, class: "a" }),
    svg("line", { x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: H - PAD.b, class: "a" }),
    svg("text", { x: (PAD.l + W - PAD.r) / 2, y: H - 6, "text-anchor": "middle" }, "time"),
    svg("text", { x: 12, y: (PAD.t + H - PAD.b) / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${(PAD.t + H - PAD.b) / 2})` }, "weight %"),
  );
  for (const t of [0, 25, 50, 75, 100]) {
    root.append(svg("text", { x: PAD.l - 4, y: (sy(t) + 4).toFixed(1), "text-anchor": "end" }, t));
  }
  for (const [t, anchor] of [[xLo, "start"], [xHi, "end"]]) {
    const label = new Date(t * 1000).toLocaleTimeString("en-GB");
    root.append(svg("text", { x: sx(t).toFixed(1), y: H - PAD.b + 14, "text-anchor": anchor }, label));
  }
  const path = pts.map(([x, y], i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
  root.append(svg("path", { d: path, class: "step" }));
  return root;
}

// An event's gating tests, whatever of them the evidence holds: a list or a mapping of
// {name, decision, estimate, interval [lo, hi] or lower/upper, margin, n per arm}.
function evidenceTests(evidence) {
  const tests = evidence?.tests;
  if (!tests || typeof tests !== "object") return [];
  const list = Array.isArray(tests) ? tests : Object.entries(tests).map(([name, t]) => ({ name, ...t }));
  return list
    .filter((t) => t && typeof t === "object")
    .map((t) => {
      const interval = Array.isArray(t.interval) ? t.interval : [t.lower, t.upper];
      const n = t.n && typeof t.n === "object" ? t.n : {};
      return {
        name: t.name ?? t.metric ?? "?",
        decision: t.decision ?? t.status ?? "",
        estimate: num(t.estimate),
        lo: num(interval[0]),
        hi: num(interval[1]),
        margin: num(t.margin),
        scale: t.scale ?? (/(^failing$|^failure$|_slo$)/.test(t.name ?? "") ? "share" : "log_ratio"),
        nCandidate: num(t.n_candidate ?? n.candidate),
        nProduction: num(t.n_production ?? n.production),
        n: num(t.n),
      };
    });
}

// The rest of an event's evidence (a tripped guard's reading): scalar facts, shown as they are.
function evidenceFacts(evidence) {
  if (!evidence || typeof evidence !== "object") return [];
  return Object.entries(evidence)
    .filter(([k, v]) => k !== "tests" && (typeof v !== "object" || v === null || (Array.isArray(v) && v.length)))
    .map(([k, v]) => [k, Array.isArray(v) ? v.join(", ") : v]);
}

// A test's number in its unit, as the pairs report writes it: a log ratio as the ratio
// candidate / production (×0.95), a share difference in percentage points (+0.4 pp).
function evidenceValue(t, v) {
  const x = num(v);
  if (x === null) return "–";
  if (t.scale === "share") return `${x > 0 ? "+" : x < 0 ? "−" : ""}${Math.abs(100 * x).toFixed(1)} pp`;
  return `×${Math.exp(x).toFixed(2)}`;
}

// One test's interval on the scale of its margin: no change in the middle, ±margin dashed,
// each reference labelled in the test's unit.
function intervalBar(t) {
  const w = 200;
  const h = 30;
  const root = svg("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, class: "bar" });
  root.append(svg("title", {}, `${t.name}: ${evidenceValue(t, t.estimate)}, interval [${evidenceValue(t, t.lo)}, ${evidenceValue(t, t.hi)}], margin ${evidenceValue(t, t.margin)}`));
  const scale = t.margin && t.margin > 0 ? t.margin : Math.max(Math.abs(t.lo ?? 0), Math.abs(t.hi ?? 0), 1e-9);
  const sx = (v) => w / 2 + (Math.max(-3, Math.min(3, v / scale)) * (w - 8)) / 6;
  root.append(svg("line", { x1: w / 2, y1: 2, x2: w / 2, y2: 16, class: "a" }));
  root.append(svg("text", { x: w / 2, y: h - 2, "text-anchor": "middle", "font-size": 9, class: "bar-label" }, evidenceValue(t, 0)));
  if (t.margin) {
    for (const m of [-t.margin, t.margin]) {
      root.append(svg("line", { x1: sx(m), y1: 2, x2: sx(m), y2: 16, stroke: "#e67700", "stroke-dasharray": "3 2" }));
    }
    root.append(svg("text", { x: sx(t.margin), y: h - 2, "text-anchor": "start", "font-size": 9, class: "bar-label margin-label" }, evidenceValue(t, t.margin)));
  }
  const cls = t.decision === "ok" ? "ok" : t.decision === "harm" ? "harm" : "other";
  if (t.lo !== null && t.hi !== null) {
    root.append(svg("rect", { x: sx(t.lo), y: 6, width: Math.max(1, sx(t.hi) - sx(t.lo)), height: 6, class: cls, "fill-opacity": 0.5 }));
  }
  if (t.estimate !== null) root.append(svg("circle", { cx: sx(t.estimate), cy: 9, r: 3, class: cls }));
  return root;
}

function evidenceCard(e) {
  const tests = evidenceTests(e.evidence);
  const facts = evidenceFacts(e.evidence);
  const card = el("div", { class: "evidence", "data-kind": e.kind });
  card.append(el("h3", {}, `Evidence: ${e.kind} ${percent(e.from_weight)} → ${percent(e.to_weight)}, ${when(e.at)}`));
  if (tests.length) {
    const table = el(
      "table",
      { class: "evidence-tests" },
      el("thead", {}, el("tr", {}, ...["test", "decision", "estimate", "interval", "margin", "n candidate", "n production", "interval / margin"].map((h) => el("th", {}, h)))),
    );
    table.append(
      el(
        "tbody",
        {},
        ...tests.map((t) =>
          row([
            t.name,
            el("td", { class: `status-${t.decision === "harm" ? "beyond" : t.decision === "ok" ? "inside" : "undecided"}` }, t.decision || "–"),
            el("td", { class: "estimate", "data-scale": t.scale }, evidenceValue(t, t.estimate)),
            t.lo === null && t.hi === null ? "–" : `[${evidenceValue(t, t.lo)}, ${evidenceValue(t, t.hi)}]`,
            el("td", { class: "margin", "data-scale": t.scale }, evidenceValue(t, t.margin)),
            fmt(t.nCandidate ?? t.n),
            fmt(t.nProduction),
            el("td", {}, intervalBar(t)),
          ]),
        ),
      ),
    );
    card.append(table);
  }
  if (facts.length) card.append(el("p", { class: "muted" }, facts.map(([k, v]) => `${k}: ${typeof v === "number" ? fmt(v) : v}`).join(" · ")));
  return card;
}

function rampStartDialog() {
  const name = state.name;
  const verdict = state.reports.get(name)?.report?.verdict || "unknown";
  const allowed = verdict === "promote";
  openConfirm({
    title: `Start a ramp of ${name}?`,
    text: allowed
      ? `The verdict is promote. ${name} serves a growing share of new sessions, step by step, judged on live traffic; harm rolls it back at once.`
      : `The verdict is ${verdict}, not promote: the API refuses unless you force it, with a reason for the audit log.`,
    force: !allowed,
    forceLabel: "force: ramp against the verdict",
    ramp: true,
    action: async ({ reason, force, steps, minStep }) => {
      if (force && !reason) return { ok: false, message: "A forced ramp needs a reason." };
      const body = { reason, force };
      if (steps.trim()) {
        const parsed = steps.split(/[\s,]+/).filter(Boolean).map(Number);
        if (parsed.some((x) => !Number.isFinite(x))) return { ok: false, message: `Steps must be percents, e.g. 1, 5, 25, 50, 100 (not ${steps}).` };
        body.steps = parsed;
      }
      if (String(minStep).trim()) {
        const x = Number(minStep);
        if (!Number.isFinite(x) || x < 0) return { ok: false, message: "The minimum dwell is a number of seconds." };
        body.min_step_s = x;
      }
      const res = await api("POST", `/candidates/${encodeURIComponent(name)}/rollout`, body);
      if (res.status !== 201 && res.status !== 200) return { ok: false, message: apiError(res) };
      location.hash = "#/";
      $("ramp-message").textContent = `Ramp of ${name} started at ${percent(res.data?.weight)}.`;
      return { ok: true };
    },
  });
}

const RAMP_ACTIONS = {
  pause: ["Pause the ramp?", "The weight stays where it is and no step advances until resumed."],
  resume: ["Resume the ramp?", "Steps advance again on their evidence."],
  advance: ["Advance the ramp by hand?", "The next step's weight applies to new sessions now, whatever the evidence says."],
  abort: ["Abort the ramp?", "Every session goes back to production at once; the candidate stays registered."],
};

function rampActionDialog(action) {
  const [title, text] = RAMP_ACTIONS[action];
  openConfirm({
    title,
    text,
    force: false,
    action: async ({ reason }) => {
      const res = await api("POST", `/rollout/${action}`, { reason });
      if (res.status !== 200) return { ok: false, message: apiError(res) };
      $("ramp-message").textContent = `Ramp ${res.data.state} at ${percent(res.data.weight)}.`;
      showRollout(res);
      schedule(0);
      return { ok: true };
    },
  });
}

// --- navigation -------------------------------------------------------------------------------

function route() {
  if (!authorized()) {
    showLogin("");
    return;
  }
  state.generation += 1;
  const labelName = labelRoute(location.hash); // label.js: the labelling view
  if (labelName !== null) {
    stopPolling();
    state.view = "label";
    $("list-view").hidden = true;
    $("detail-view").hidden = true;
    labelShow(labelName);
    return;
  }
  labelHide();
  const match = location.hash.match(/^#\/c\/(.+)$/);
  state.view = match ? "detail" : "list";
  state.name = match ? decodeURIComponent(match[1]) : null;
  $("list-view").hidden = state.view !== "list";
  $("detail-view").hidden = state.view !== "detail";
  if (state.view === "detail") {
    $("d-message").textContent = "";
    const cached = state.reports.get(state.name)?.report;
    if (cached) renderDetail(cached);
    else $("d-name").textContent = state.name;
  }
  schedule(0);
}

function guard(fn) {
  return (...args) =>
    fn(...args).catch((err) => {
      if (err instanceof Unauthorized) showLogin("The admin API refused the token (401). Type it again.");
      else $("c-error").textContent = String(err.message || err);
    });
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-go").addEventListener("click", guard(login));
  $("token").addEventListener("keydown", (e) => {
    if (e.key === "Enter") guard(login)();
  });
  $("forget").addEventListener("click", () => showLogin("Token forgotten."));
  $("promote").addEventListener("click", promoteDialog);
  $("rollback").addEventListener("click", rollbackDialog);
  $("ramp-start").addEventListener("click", rampStartDialog);
  for (const action of Object.keys(RAMP_ACTIONS)) {
    $(`ramp-${action}`).addEventListener("click", () => rampActionDialog(action));
  }
  $("c-cancel").addEventListener("click", () => $("confirm").close());
  $("c-ok").addEventListener("click", guard(confirmed));
  window.addEventListener("hashchange", route);
  if (authorized()) {
    $("login").hidden = true;
    $("forget").hidden = OPEN;
  }
  route();
});
