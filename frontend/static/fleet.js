// kvplane Fleet page (the coordinator): MP servers with their heartbeat age, every tenant
// (cache_salt) with its L2 usage against its quota, over time from the server's history, and
// the evictions dispatched, from GET /api/dashboard on the coordinator's port; with --cluster,
// its role, lease holder and last failover in the counters. Read-only.

import { TimeChart } from "./chart.js";
import { fmtAge, fmtBytes, fmtCompact, fmtDateTime, fmtInt, fmtPct, fmtRate, h } from "./format.js";
import { GAP_S, Live, Series, setText, windowPicker } from "./live.js";

const $ = (id) => document.getElementById(id);
const kpi = (k) => document.querySelector(`[data-k="${k}"]`);
const COLORS = ["--s1", "--s2", "--s3", "--s5", "--s6", "--s7", "--s8", "--s4"];
const CHART_TENANTS = 6;
/** Tenants sent in the server's history, as the server samples them (largest first). */
const HISTORY_TENANTS = 16;

const gauges = new Series("gauge", "*");
const rates = new Series("rate", ["events", "dispatch_ok", "dispatch_failed", "keys_planned"]);
const state = { feed: null, selected: null };
const salt = (s) => (s === "" ? "(default)" : s);

const charts = {
  tenants: new TimeChart($("chart-tenants"), {
    title: "Usage by tenant", unit: "", legend: $("legend-tenants"), fmt: fmtBytes, binary: true, series: [],
  }),
  quota: new TimeChart($("chart-quota"), {
    title: "Usage against quota", unit: "", legend: $("legend-quota"), fmt: fmtBytes, binary: true, stacked: false, series: [],
  }),
  evictions: new TimeChart($("chart-evictions"), {
    title: "Eviction dispatches", unit: "/s", legend: $("legend-evictions"),
    series: [{ key: "dispatch_ok", label: "ok", color: "--s3" }, { key: "dispatch_failed", label: "failed", color: "--bad-dot" }],
  }),
};
let windowS = windowPicker((w) => { windowS = w; renderCharts(); });

const live = new Live({ url: "/api/dashboard", what: "the coordinator", onFeed, onTick: () => { renderCharts(); renderServers(); } });

/** The same values the server samples, from one feed. */
function valuesOf(feed) {
  const c = feed.counters;
  const v = {
    servers: feed.totals.servers, tracked_keys: feed.totals.tracked_keys, events: c.events_applied,
    keys_planned: c.eviction_keys_planned, dispatch_ok: c.dispatches_ok, dispatch_failed: c.dispatches_failed,
  };
  for (const t of feed.tenants.slice(0, HISTORY_TENANTS)) {
    v[`usage:${t.cache_salt}`] = t.usage_bytes;
    if (t.quota_bytes != null) v[`quota:${t.cache_salt}`] = t.quota_bytes;
  }
  return v;
}

function onFeed(feed, withHistory) {
  state.feed = feed;
  if (withHistory) {
    gauges.load(feed.history);
    rates.load(feed.history);
  }
  const values = valuesOf(feed);
  gauges.add(feed.server_time, values);
  rates.add(feed.server_time, values);
  if (state.selected == null || !feed.tenants.some((t) => t.cache_salt === state.selected)) {
    const first = feed.tenants.find((t) => t.quota_bytes != null) || feed.tenants[0];
    state.selected = first ? first.cache_salt : null;
  }
  renderKpis();
  renderServers();
  renderTenants();
  renderCounters();
  renderCharts();
}

function renderCharts() {
  const f = state.feed;
  if (!f) return;
  const top = f.tenants.slice(0, CHART_TENANTS);
  charts.tenants.setSeries(top.map((t, i) => ({ key: `usage:${t.cache_salt}`, label: salt(t.cache_salt), color: COLORS[i % COLORS.length] })));
  const s = state.selected;
  setText($("quota-tenant"), s == null ? "" : salt(s));
  charts.quota.setSeries(s == null ? [] : [
    { key: `usage:${s}`, label: "usage", color: "--s1" },
    { key: `quota:${s}`, label: "quota", color: "--quota", dash: true },
  ]);
  const now = live.serverNow();
  charts.tenants.setData(gauges.points, windowS, now, GAP_S);
  charts.quota.setData(gauges.points, windowS, now, GAP_S);
  charts.evictions.setData(rates.points, windowS, now, GAP_S);
}

function renderKpis() {
  const f = state.feed;
  const t = f.totals;
  const c = f.counters;
  setText(kpi("servers"), fmtInt(t.servers));
  const ages = f.servers.map((s) => s.heartbeat_age_s);
  setText(kpi("servers-sub"), ages.length ? `oldest heartbeat ${fmtAge(Math.max(...ages))} ago` : "no MP server registered");
  setText(kpi("tenants"), fmtInt(t.tenants));
  setText(kpi("tenants-sub"), `${fmtInt(t.quotas)} with a quota`);
  setText(kpi("usage"), fmtBytes(t.usage_bytes));
  setText(kpi("usage-sub"), `${fmtCompact(t.tracked_keys)} keys · ${fmtBytes(t.tracked_key_bytes)} to track them`);
  const last = rates.points[rates.points.length - 1];
  setText(kpi("events"), last ? fmtRate(last.events) : "–");
  setText(kpi("events-sub"), `${fmtCompact(c.events_applied)} applied · ${fmtCompact(c.batches_duplicate + c.batches_stale)} batches dropped`);
  setText(kpi("dispatched"), fmtCompact(c.dispatches_ok + c.dispatches_failed));
  setText(kpi("dispatched-sub"), `${fmtCompact(c.eviction_keys_planned)} keys · ${fmtCompact(c.dispatches_failed)} failed`);
  const over = f.tenants.filter((x) => level(x) === "over");
  setText(kpi("over"), fmtInt(over.length));
  setText(kpi("over-sub"), over.length ? over.slice(0, 3).map((x) => salt(x.cache_salt)).join(", ") : `watermark ${fmtPct(f.eviction.trigger_watermark)} of quota`);
}

/** `over` past the eviction watermark, `near` past 80 % of it, else "". */
function level(t) {
  const wm = state.feed.eviction.trigger_watermark;
  const limit = t.quota_bytes ?? 0;
  if (t.usage_bytes > 0 && t.usage_bytes > wm * limit) return "over";
  if (limit && t.usage_bytes > 0.8 * wm * limit) return "near";
  return "";
}

function renderServers() {
  const f = state.feed;
  if (!f) return;
  setText($("servers-count"), fmtInt(f.totals.servers));
  const body = $("servers").tBodies[0];
  const now = live.serverNow();
  const drift = now - f.server_time; // the ages were taken at server_time
  if (!f.servers.length) {
    if (body.dataset.sig !== "empty") {
      body.dataset.sig = "empty";
      body.replaceChildren(h("tr", { class: "empty" }, h("td", { colspan: "5", text: "No MP server registered yet. Servers appear here when they register (lmcache server --coordinator-url …)." })));
    }
    return;
  }
  const sig = `${f.server_time}|${Math.floor(now)}`;
  if (body.dataset.sig === sig) return;
  body.dataset.sig = sig;
  body.replaceChildren(...f.servers.map((s) => h("tr", null,
    h("td", null, h("code", { text: s.instance_id })),
    h("td", null, h("code", { text: `${s.ip.includes(":") ? `[${s.ip}]` : s.ip}:${s.http_port}` })),
    h("td", { class: "num", text: `${fmtAge(s.heartbeat_age_s + drift)} ago` }),
    h("td", { class: "num", title: fmtDateTime(s.registration_time), text: `${fmtAge(now - s.registration_time)} ago` }),
    h("td", null, h("span", { class: "tiers-cell" }, Object.entries(s.metadata).slice(0, 6).map(([k, v]) => h("span", { class: "tag", text: `${k}=${v}` })))))));
}

function renderTenants() {
  const f = state.feed;
  setText($("tenants-count"), fmtInt(f.totals.tenants));
  setText($("rule"), `Eviction past ${fmtPct(f.eviction.trigger_watermark)} of the quota (${fmtPct(f.eviction.eviction_ratio)} of the keys, oldest first); no quota = 0 bytes`);
  const body = $("tenants").tBodies[0];
  const sig = JSON.stringify([f.tenants, state.selected]);
  if (body.dataset.sig === sig) return;
  body.dataset.sig = sig;
  if (!f.tenants.length) {
    body.replaceChildren(h("tr", { class: "empty" }, h("td", { colspan: "4", text: "No tenant yet: set a quota (PUT /quota/{cache_salt}) or wait for usage events." })));
    return;
  }
  body.replaceChildren(...f.tenants.map((t) => {
    const lv = level(t);
    const used = t.quota_bytes ? t.usage_bytes / t.quota_bytes : t.usage_bytes > 0 ? 1 : 0;
    const fill = h("span", { class: "bar-fill" });
    fill.style.width = `${Math.min(1, used) * 100}%`;
    const mark = h("span", { class: "bar-mark", title: "eviction watermark" });
    mark.style.left = `${Math.min(1, f.eviction.trigger_watermark) * 100}%`;
    const tr = h("tr", { class: "clickable", "aria-selected": String(t.cache_salt === state.selected), tabindex: "0", title: "Show this tenant's usage against its quota over time" },
      h("td", null, h("code", { text: salt(t.cache_salt) })),
      h("td", { class: `num ${lv === "over" ? "bad" : lv === "near" ? "warn" : ""}`, text: fmtBytes(t.usage_bytes) }),
      h("td", { class: "num", text: t.quota_bytes == null ? "none" : fmtBytes(t.quota_bytes) }),
      h("td", null, h("span", { class: "usage" }, h("span", { class: `bar ${lv}` }, fill, mark), h("span", { class: "pct", text: t.quota_bytes ? fmtPct(used) : "–" }))));
    const pick = () => { state.selected = t.cache_salt; renderTenants(); renderCharts(); };
    tr.addEventListener("click", pick);
    tr.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(); } });
    return tr;
  }));
}

function renderCounters() {
  const c = state.feed.counters;
  const pairs = [
    ["Events applied", fmtInt(c.events_applied)], ["Batches applied", fmtInt(c.batches_applied)],
    ["Duplicate batches", fmtInt(c.batches_duplicate)], ["Stale batches", fmtInt(c.batches_stale)],
    ["Sequence gaps", fmtInt(c.seq_gaps)], ["Keys refused", fmtInt(c.keys_refused)],
    ["Eviction cycles", fmtInt(c.eviction_cycles)], ["Keys planned", fmtInt(c.eviction_keys_planned)],
    ["Dispatches ok", fmtInt(c.dispatches_ok)], ["Dispatches failed", fmtInt(c.dispatches_failed)],
    ["In flight", fmtInt(c.dispatches_in_flight)], ["Timed out servers", fmtInt(c.instances_timed_out)],
  ];
  const k = state.feed.cluster; // --cluster only: this coordinator's role and failovers
  if (k) {
    const f = k.last_failover;
    pairs.push(
      ["Cluster", `${k.cluster} · ${k.role}`], ["Lease holder", k.lease_holder ?? "–"],
      ["Epoch", fmtInt(k.epoch)],
      ["Last failover", f ? `${fmtDateTime(f.at)} (${fmtInt(f.takeover_ms)} ms)` : "never"],
      ["Followed state", k.followed.in_sync ? "in sync" : `not in sync (${fmtInt(k.followed.gaps)} gaps)`],
      ["Replication pending", fmtInt(k.published.pending)],
    );
  }
  const dl = $("counters");
  const sig = JSON.stringify(pairs);
  if (dl.dataset.sig === sig) return;
  dl.dataset.sig = sig;
  dl.replaceChildren(...pairs.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })]));
}

live.poll();
// For the browser test and debugging: read-only access to the page state.
window.kvplane = { live, gauges, rates, charts, state };
