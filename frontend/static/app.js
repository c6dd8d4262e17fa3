// kvplane dashboard: polls GET /api/dashboard through live.js (every 2 s; ?interval=ms to change
// it), as every service's page does; starts its charts from the server's 15-minute history
// (asked for on the first poll and after a reconnect), keeps them going from its own polls, and
// renders the totals, charts, workers grid, full-sync progress and worker details. Actions
// (health/clear/pin/move) live in actions.js.

import { Actions } from "./actions.js";
import { TimeChart } from "./chart.js";
import { bar, fmtAge, fmtClock, fmtCompact, fmtDateTime, fmtInt, fmtPct, fmtRate, h } from "./format.js";
import { GAP_S, Live, Series, setText, windowPicker } from "./live.js";
import { FALLBACK_RULE, FULL_SYNC_WIRE, WIRE_NOTES, WorkerGrid, shortLoc, statusOf } from "./table.js";

const $ = (id) => document.getElementById(id);
const kpi = (k) => document.querySelector(`[data-k="${k}"]`);

/** Rates of the cumulative counters the charts draw (ops/s admitted and evicted, lookups/s, drops/s). */
const rates = new Series("rate", ["admit", "evict", "hit", "miss", "dropped"]);

const state = {
  feed: null,
  workers: [],
  byKey: new Map(),
  window: 300,
  /** Feeds received (the poller's count). */
  get polls() { return live.polls; },
};

/** The server's status rule (`config.status`), or LMCache's when the server sends none. */
const statusRule = () => (state.feed && state.feed.config.status) || FALLBACK_RULE;

/** Recomputes a worker's ages and status at server time `now`. */
function refreshAges(w, now) {
  const rule = statusRule();
  w.age = now - w.last_heartbeat_time; // shown in the heartbeat column
  w.contact = now - w[rule.basis]; // the status comes from the last contact of any kind
  w.status = statusOf(w.contact, rule);
}

// ---- components ---------------------------------------------------------------------------
const charts = {
  ingest: new TimeChart($("chart-ingest"), {
    title: "Ingest", unit: "ops/s", legend: $("legend-ingest"),
    series: [{ key: "admit", label: "admit", color: "--s1" }, { key: "evict", label: "evict", color: "--s2" }],
  }),
  lookups: new TimeChart($("chart-lookups"), {
    title: "P2P lookups", unit: "/s", legend: $("legend-lookups"),
    series: [{ key: "hit", label: "hit", color: "--s3" }, { key: "miss", label: "miss", color: "--s4" }],
  }),
};

const grid = new WorkerGrid($("grid"), $("grid-body"), {
  onSelect: (key) => renderDetails(key),
  onView: () => renderGridMeta(),
});

const actions = new Actions({
  workersOf: (inst) => state.workers.filter((w) => w.instance_id === inst).length,
});

// ---- polling ------------------------------------------------------------------------------
const live = new Live({ url: "/api/dashboard", what: "the controller", onFeed: ingest, onTick: tick });

/** Server clock now, extrapolated from the last feed. */
const serverNow = () => live.serverNow();

// ---- feed → state -------------------------------------------------------------------------
function ingest(feed, withHistory) {
  state.feed = feed;
  const cols = feed.workers.columns;
  const at = Object.fromEntries(cols.map((c, i) => [c, i]));
  const prevByKey = state.byKey;
  const byKey = new Map();
  const now = serverNow();
  const workers = feed.workers.rows.map((r) => {
    const key = `${r[at.instance_id]}\u0000${r[at.worker_id]}`;
    const locations = r[at.locations].map(([name, key_count, last_seq]) => ({ name, key_count, last_seq }));
    const locNames = locations.map((l) => l.name).join(" ");
    const old = prevByKey.get(key);
    const w = old && old.raw === JSON.stringify(r) ? old : {
      key,
      raw: JSON.stringify(r),
      instance_id: r[at.instance_id],
      worker_id: r[at.worker_id],
      ip: r[at.ip],
      port: r[at.port],
      endpoint: hostPort(r[at.ip], r[at.port]),
      peer_init_url: r[at.peer_init_url],
      registration_time: r[at.registration_time],
      last_heartbeat_time: r[at.last_heartbeat_time],
      last_seen: r[at.last_seen],
      key_count: r[at.key_count],
      locations,
      locNames,
      locSig: locations.map((l) => `${l.name}:${l.key_count}`).join("|"),
      sync: r[at.sync],
      heartbeated: r[at.heartbeated],
      protocol: r[at.protocol],
      haystack: `${r[at.instance_id]} ${r[at.worker_id]} ${hostPort(r[at.ip], r[at.port])} ${r[at.peer_init_url] || ""} ${locNames} ${r[at.protocol]}`.toLowerCase(),
    };
    refreshAges(w, now);
    byKey.set(key, w);
    return w;
  });
  state.workers = workers;
  state.byKey = byKey;
  if (withHistory) rates.load(feed.history);
  const c = feed.counters;
  rates.add(feed.server_time, { admit: c.ops_admit, evict: c.ops_evict, hit: c.p2p_lookup_hit, miss: c.p2p_lookup_miss, dropped: c.frames_dropped });
  renderStatusRule();
  grid.setWorkers(workers, now);
  renderAll();
}

function hostPort(ip, port) {
  return ip.includes(":") ? `[${ip}]:${port}` : `${ip}:${port}`;
}

// ---- rendering ----------------------------------------------------------------------------
function renderStatusRule() {
  const r = statusRule();
  const basis = r.basis === "last_seen" ? "the last contact (any message: heartbeat, ops, probe answer)" : "the last heartbeat";
  setText($("status-rule"), `Status from ${basis}: active < ${fmtAge(r.active_s)}, warning < ${fmtAge(r.warning_s)}.`);
}

function renderAll() {
  renderCluster(state.feed.cluster);
  renderKpis();
  renderCharts();
  renderSync();
  renderDatalists();
  if (grid.selected) renderDetails(grid.selected);
}

/** The role in the --cluster: leader (epoch, last takeover) or replica (lag); hidden alone. */
function renderCluster(c) {
  const el = $("cluster");
  if (!c) return setText(el, "");
  let text = `${c.role} · ${c.cluster}`;
  if (c.role === "leader") {
    text += ` · epoch ${c.epoch}`;
    if (c.last_failover) {
      const at = new Date(c.last_failover.at * 1000).toLocaleTimeString();
      text += ` · took over ${at} in ${c.last_failover.takeover_ms} ms`;
    }
  } else if (c.following) {
    text += ` · ${c.following.reason} · lag ${fmtInt(c.following.lag_ms)} ms`;
  }
  el.dataset.role = c.role;
  el.title = `lease holder ${c.lease_holder || "—"}; this process ${c.me}`;
  setText(el, text);
}

function renderKpis() {
  const f = state.feed;
  const t = f.totals;
  const c = f.counters;
  const counts = statusCounts();
  setText(kpi("workers"), fmtInt(t.workers));
  const sub = kpi("workers-sub");
  const sig = `${counts.active}|${counts.warning}|${counts.inactive}`;
  if (sub.dataset.sig !== sig) {
    sub.dataset.sig = sig;
    sub.replaceChildren(...["active", "warning", "inactive"].map((k) =>
      h("span", { class: "sd", title: `${counts[k]} ${k}` },
        h("i", { class: `dot dot-${k}`, "aria-hidden": "true" }),
        h("b", { class: k === "inactive" && counts[k] ? "bad" : "", text: fmtInt(counts[k]) }),
        h("span", { class: "sr-only", text: ` ${k}` }))));
  }
  const total = Math.max(1, t.workers);
  const spans = $("kpi-workers").querySelectorAll(".statusbar span");
  ["active", "warning", "inactive"].forEach((k, i) => { spans[i].style.width = `${(counts[k] / total) * 100}%`; });

  setText(kpi("instances"), fmtInt(t.instances));
  const sizes = new Map();
  for (const w of state.workers) sizes.set(w.instance_id, (sizes.get(w.instance_id) || 0) + 1);
  const vals = [...sizes.values()];
  setText(kpi("instances-sub"), vals.length ? `${Math.min(...vals) === Math.max(...vals) ? vals[0] : `${Math.min(...vals)}–${Math.max(...vals)}`} worker${Math.max(...vals) === 1 ? "" : "s"} each` : "no instance registered");

  setText(kpi("keys"), fmtCompact(t.keys));
  const perLoc = new Map();
  for (const w of state.workers) for (const l of w.locations) perLoc.set(l.name, (perLoc.get(l.name) || 0) + l.key_count);
  const top = [...perLoc].sort((a, b) => b[1] - a[1]);
  const keysSub = kpi("keys-sub");
  setText(keysSub, top.length
    ? top.slice(0, 2).map(([n, k]) => `${shortLoc(n)} ${fmtCompact(k)}`).join(" · ") + (top.length > 2 ? ` · +${top.length - 2}` : "")
    : "no location yet");
  keysSub.title = `${fmtInt(t.keys)} (chunk, holder) memberships: ${top.map(([n, k]) => `${n} ${fmtInt(k)}`).join(", ")}`;

  const last = rates.points[rates.points.length - 1];
  setText(kpi("ingest"), last ? fmtRate(last.admit + last.evict) : "–");
  setText(kpi("ingest-sub"), `${fmtCompact(c.ops_admit + c.ops_evict)} applied · ${fmtCompact(c.batches_discarded)} discarded`);
  setText(kpi("lookups"), last ? fmtRate(last.hit + last.miss) : "–");
  const lookups = c.p2p_lookup_hit + c.p2p_lookup_miss;
  setText(kpi("lookups-sub"), lookups ? `hit rate ${fmtPct(c.p2p_lookup_hit / lookups)} · ${fmtCompact(lookups)} total` : "no lookup yet");

  setText(kpi("dropped"), fmtCompact(c.frames_dropped));
  const reasons = Object.entries(c.frames_dropped_by_reason).sort((a, b) => b[1] - a[1]);
  const rate = last ? last.dropped : 0;
  setText(kpi("dropped-sub"), c.frames_dropped
    ? `${rate > 0 ? `${fmtRate(rate)}/s now · ` : ""}top: ${reasons[0][0]} (${fmtCompact(reasons[0][1])})`
    : `of ${fmtCompact(c.frames_received)} frames received`);
}

function statusCounts() {
  const counts = { active: 0, warning: 0, inactive: 0, sync: 0 };
  for (const w of state.workers) {
    counts[w.status]++;
    if (w.sync && w.sync.state !== "completed") counts.sync++;
  }
  return counts;
}

function renderCharts() {
  const now = serverNow();
  charts.ingest.setData(rates.points, state.window, now, GAP_S);
  charts.lookups.setData(rates.points, state.window, now, GAP_S);
}

state.window = windowPicker((w) => { state.window = w; renderCharts(); });

function renderSync() {
  const t = state.feed.totals;
  const threshold = state.feed.config.sync_completion_threshold;
  setText($("sync-global-pct"), fmtPct(t.global_sync_progress));
  const gbar = $("sync-global-bar");
  gbar.querySelector(".bar-fill").style.width = `${t.global_sync_progress * 100}%`;
  gbar.querySelector(".bar-mark").style.left = `${threshold * 100}%`;
  gbar.querySelector(".bar-mark").title = `Workers leave freeze mode at ${fmtPct(threshold)} global progress`;
  gbar.setAttribute("aria-valuenow", String(Math.round(t.global_sync_progress * 100)));
  const failed = state.workers.filter((w) => w.sync?.state === "failed").length;
  setText($("sync-summary"), `${t.syncing} syncing · ${t.sync_completed} completed${failed ? ` · ${failed} failed` : ""}`);

  const list = $("sync-list");
  const active = state.workers
    .filter((w) => w.sync && w.sync.state !== "completed")
    .sort((a, b) => syncOrder(a) - syncOrder(b));
  const sig = active.map((w) => `${w.key}|${w.sync.state}|${w.sync.received_batches}`).join(",");
  if (list.dataset.sig === sig) return;
  list.dataset.sig = sig;
  const shown = active.slice(0, 50);
  list.replaceChildren(...shown.map((w) => {
    const s = w.sync;
    const failedNow = s.state === "failed";
    const li = h("li", { tabindex: "0", title: `sync ${s.sync_id || ""}: ${fmtInt(s.received_batches)} of ${fmtInt(s.expected_batches)} batches` },
      h("span", { class: "w" }, w.instance_id, h("span", { class: "muted", text: ` · rank ${w.worker_id}` })),
      bar(s.progress, failedNow ? "failed" : ""),
      h("span", { class: `p ${failedNow ? "sync-failed" : ""}`, text: failedNow ? "failed" : fmtPct(s.progress) }));
    const open = () => { grid.select(w.key, false); };
    li.addEventListener("click", open);
    li.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } });
    return li;
  }));
  if (active.length > shown.length) list.append(h("li", { class: "empty", text: `and ${active.length - shown.length} more (filter the table by “Syncing”)` }));
  if (!active.length && state.workers.length) list.append(h("li", { class: "empty", text: "No full sync in progress." }));
}

function syncOrder(w) {
  return w.sync.state === "failed" ? -1 : w.sync.progress;
}

function renderDatalists() {
  const inst = [...new Set(state.workers.map((w) => w.instance_id))];
  const locs = [...new Set(state.workers.flatMap((w) => w.locations.map((l) => l.name)))];
  const sig = `${inst.join("\u0000")}\u0001${locs.join("\u0000")}`;
  const dl = $("dl-instances");
  if (dl.dataset.sig === sig) return;
  dl.dataset.sig = sig;
  dl.replaceChildren(...inst.slice(0, 500).map((v) => h("option", { value: v })));
  $("dl-locations").replaceChildren(...locs.map((v) => h("option", { value: v })));
}

function renderGridMeta() {
  const counts = statusCounts();
  for (const b of document.querySelectorAll("#status-filter button")) {
    const k = b.dataset.status;
    setText(b.querySelector(".n"), fmtInt(k ? counts[k] : state.workers.length));
  }
  const n = grid.view.length;
  const total = state.workers.length;
  setText($("workers-count"), fmtInt(total));
  const [first, last] = grid.range();
  const range = n ? `${fmtInt(first + 1)}–${fmtInt(Math.max(first + 1, last))} of ${fmtInt(n)}` : "0";
  setText($("grid-range"), n === total ? `Showing ${range}` : `Showing ${range} (filtered from ${fmtInt(total)})`);
  const empty = $("grid-empty");
  empty.hidden = n > 0;
  if (!n) empty.textContent = total ? "No worker matches the filter." : "No worker registered yet. Workers appear here when they register with the controller.";
}
$("grid").addEventListener("scroll", () => requestAnimationFrame(renderGridMeta), { passive: true });

// ---- details ------------------------------------------------------------------------------
function renderDetails(key) {
  const body = $("details-body");
  const pill = $("details-status");
  const w = key && state.byKey.get(key);
  if (!w) {
    pill.hidden = true;
    setText($("details-title"), "Worker");
    body.replaceChildren(h("p", { class: "placeholder", text: key ? "This worker is no longer registered." : "Select a worker to see its endpoints, locations and sync state." }));
    body.dataset.sig = "";
    return;
  }
  pill.hidden = false;
  pill.className = `pill st-${w.status}`;
  setText(pill, w.status);
  const now = serverNow();
  const sig = `${w.raw}|${Math.floor(now)}`;
  if (body.dataset.sig === sig) return;
  body.dataset.sig = sig;

  const s = w.sync;
  const maxLoc = Math.max(1, ...w.locations.map((l) => l.key_count));
  const kv = (pairs) => h("dl", { class: "kv" }, pairs.filter(Boolean).flatMap(([k, v]) => [h("dt", { text: k }), h("dd", null, v)]));
  const hb = w.heartbeated
    ? h("span", { title: fmtDateTime(w.last_heartbeat_time) }, `${fmtAge(now - w.last_heartbeat_time)} ago · ${fmtClock(w.last_heartbeat_time)}`)
    : h("span", { class: "reg" }, `never (registered ${fmtAge(now - w.registration_time)} ago)`);
  const syncRows = s ? [
    ["Full sync", h("span", { class: "mini" }, bar(s.progress, s.state === "completed" ? "done" : s.state === "failed" ? "failed" : ""),
      h("span", { class: `pct ${s.state === "failed" ? "sync-failed" : s.state === "completed" ? "sync-done" : ""}`, text: s.state === "syncing" ? fmtPct(s.progress) : s.state }))],
    ["Sync batches", `${fmtInt(s.received_batches)} / ${fmtInt(s.expected_batches)}${s.missing_batches ? ` · ${fmtInt(s.missing_batches)} missing` : ""}${s.failure ? ` · ${s.failure}` : ""}`],
    ["Sync keys", `${fmtInt(s.received_keys)} / ${fmtInt(s.expected_keys)}${s.end_total_keys != null ? ` (end: ${fmtInt(s.end_total_keys)})` : ""}`],
    ["Sync id", h("span", null, h("code", { text: s.sync_id || "—" }), s.start_time ? ` · ${fmtAge(now - s.start_time)} ago` : "")],
  ] : [["Full sync", h("span", { class: "none", text: w.protocol === FULL_SYNC_WIRE ? "idle (none since registration)" : "not in this wire (pushed registration)" })]];
  const loc0 = w.locations[0]?.name || "";
  body.replaceChildren(
    h("p", { class: "d-title" }, w.instance_id, h("span", { class: "muted", text: `rank ${w.worker_id} · ${fmtInt(w.key_count)} keys` })),
    kv([
      ["Endpoint", h("code", { title: "The worker's command (REP) socket", text: w.endpoint })],
      ["P2P peer", w.peer_init_url ? h("code", { text: w.peer_init_url }) : h("span", { class: "none", text: "not serving peers" })],
      ["LMCache wire", h("span", { title: WIRE_NOTES[w.protocol] || "" }, h("code", { text: w.protocol }), ` · ${WIRE_NOTES[w.protocol] || "unknown generation"}`)],
      ["Heartbeat", hb],
      ["Last seen", h("span", { title: "Any message from the worker" }, `${fmtAge(now - w.last_seen)} ago · registered ${fmtAge(now - w.registration_time)} ago`)],
      ...syncRows,
    ]),
    w.locations.length
      ? h("table", { class: "locs" },
        h("thead", null, h("tr", null, h("th", { text: "Location" }), h("th", { class: "num", text: "Keys" }), h("th", { class: "num", text: "Last seq" }), h("th", { class: "share" }, h("span", { class: "sr-only", text: "Share" })))),
        h("tbody", null, w.locations.map((l) => h("tr", null,
          h("td", { title: l.name, text: l.name }),
          h("td", { class: "num", text: fmtInt(l.key_count) }),
          h("td", { class: "num", text: l.last_seq == null ? "—" : fmtInt(l.last_seq) }),
          h("td", { class: "share" }, bar(l.key_count / maxLoc))))))
      : h("p", { class: "placeholder", text: "No location yet (no admit received)." }),
    h("div", { class: "d-actions" },
      h("button", { class: "btn btn-small", type: "button", onclick: () => actions.prefill("health", { instance_id: w.instance_id }) }, "Check health"),
      h("button", { class: "btn btn-small", type: "button", onclick: () => actions.prefill("clear", { instance_id: w.instance_id, location: loc0 }) }, "Clear…"),
      h("button", { class: "btn btn-small", type: "button", onclick: () => actions.prefill("pin", { instance_id: w.instance_id, location: loc0 }) }, "Pin…"),
      h("button", { class: "btn btn-small", type: "button", onclick: () => actions.prefill("move", { old_instance: w.instance_id, old_location: loc0 }) }, "Move…")),
  );
}

// ---- filters ------------------------------------------------------------------------------
const filter = $("filter");
filter.addEventListener("input", () => grid.setFilter(filter.value, null));
for (const b of document.querySelectorAll("#status-filter button")) {
  b.addEventListener("click", () => {
    for (const o of document.querySelectorAll("#status-filter button")) o.setAttribute("aria-pressed", String(o === b));
    grid.setFilter(null, b.dataset.status);
  });
}
document.addEventListener("keydown", (e) => {
  if (e.key === "/" && !e.target.closest("input, textarea, dialog")) { e.preventDefault(); filter.focus(); }
});

// ---- one-second tick (live.js): ages, statuses, charts -------------------------------------
function tick(now) {
  grid.tick(now, refreshAges);
  renderKpis();
  renderGridMeta();
  if (grid.selected) renderDetails(grid.selected);
  renderCharts();
}

live.poll();
// For the browser test and debugging: read-only access to the page state.
window.kvplane = { state, live, rates, grid, charts, shortLoc };
