// kvplane Indexer page: publishers (endpoint, connection state, last sequence number, backlog,
// gaps, replays, blocks per tier, the services each feeds), ingest and index size over time
// from the server's history, and a query box that shows /query's per-tier, per-rank answer
// for pasted token ids. The query is the page's only POST: same origin, application/json
// (what the indexer's guard requires of a browser); it reads the index, changes nothing.

import { TimeChart } from "./chart.js";
import { fmtBytes, fmtCompact, fmtInt, fmtPct, fmtRate, h, prettyJson } from "./format.js";
import { GAP_S, Live, Series, setText, windowPicker } from "./live.js";

const $ = (id) => document.getElementById(id);
const kpi = (k) => document.querySelector(`[data-k="${k}"]`);
const MAX_TOKENS = 262144;
const QUERY_TIMEOUT_MS = 15000;

const rates = new Series("rate", ["events", "stored", "removed", "gaps", "replays"]);
const gauges = new Series("gauge", ["memberships", "gpu", "cpu", "disk", "connected"]);
const state = { feed: null, query: null };

const charts = {
  ingest: new TimeChart($("chart-ingest"), {
    title: "Ingest", unit: "/s", legend: $("legend-ingest"),
    series: [{ key: "stored", label: "stored", color: "--s1" }, { key: "removed", label: "removed", color: "--s2" }],
  }),
  blocks: new TimeChart($("chart-blocks"), {
    title: "Blocks held", unit: "", legend: $("legend-blocks"), fmt: fmtCompact,
    series: [{ key: "gpu", label: "GPU", color: "--s3" }, { key: "cpu", label: "CPU", color: "--s1" }, { key: "disk", label: "DISK", color: "--s2" }],
  }),
};
let windowS = windowPicker((w) => { windowS = w; renderCharts(); });

const live = new Live({ url: "/api/dashboard", what: "the indexer", onFeed, onTick: () => renderCharts() });

function valuesOf(feed) {
  const c = feed.counters;
  const tiers = { gpu: 0, cpu: 0, disk: 0 };
  for (const p of feed.publishers) {
    tiers.gpu += p.blocks.GPU;
    tiers.cpu += p.blocks.CPU;
    tiers.disk += p.blocks.DISK;
  }
  return {
    events: c.events_applied, stored: c.stored, removed: c.removed, gaps: c.gaps, replays: c.replays,
    memberships: feed.totals.memberships, connected: feed.totals.connected, ...tiers,
  };
}

function onFeed(feed, withHistory) {
  state.feed = feed;
  if (withHistory) {
    rates.load(feed.history);
    gauges.load(feed.history);
  }
  const v = valuesOf(feed);
  rates.add(feed.server_time, v);
  gauges.add(feed.server_time, v);
  renderKpis();
  renderPublishers();
  renderDatalists();
  renderCharts();
}

function renderCharts() {
  const now = live.serverNow();
  charts.ingest.setData(rates.points, windowS, now, GAP_S);
  charts.blocks.setData(gauges.points, windowS, now, GAP_S);
}

function renderKpis() {
  const f = state.feed;
  const t = f.totals;
  const c = f.counters;
  const cl = f.cluster || {};
  if (cl.role === "replica") {
    // A read replica follows its cluster's ingester: no publishers of its own (docs/CLUSTER.md).
    setText(kpi("publishers"), "replica");
    setText(kpi("publishers-sub"), `${cl.reason} · ${fmtInt(cl.pending)} pending · lag ${fmtInt(cl.lag_ms)} ms · cluster ${cl.cluster}`);
  } else {
    setText(kpi("publishers"), fmtInt(t.publishers));
    const role = cl.role === "ingester" ? ` · ingester of cluster ${cl.cluster}, ${fmtCompact(cl.ops)} ops` : "";
    setText(kpi("publishers-sub"), (t.publishers
      ? `${fmtInt(t.connected)} connected${t.replaying ? ` · ${fmtInt(t.replaying)} replaying` : ""} · ${fmtInt(t.services)} services`
      : "none registered (POST /register)") + role);
  }
  setText(kpi("memberships"), fmtCompact(t.memberships));
  const used = t.max_memberships ? t.memberships / t.max_memberships : 0;
  kpi("memberships-bar").querySelector(".bar-fill").style.width = `${Math.min(1, used) * 100}%`;
  setText(kpi("memberships-sub"), `${fmtPct(used)} of ${fmtCompact(t.max_memberships)} · ${fmtBytes(t.heap_bytes)} heap`);
  const last = gauges.points[gauges.points.length - 1];
  setText(kpi("blocks"), fmtCompact(t.records));
  setText(kpi("blocks-sub"), last ? `GPU ${fmtCompact(last.gpu)} · CPU ${fmtCompact(last.cpu)} · DISK ${fmtCompact(last.disk)}` : " ");
  const r = rates.points[rates.points.length - 1];
  setText(kpi("events"), r ? fmtRate(r.events) : "–");
  setText(kpi("events-sub"), `${fmtCompact(c.events_applied)} applied · ${fmtCompact(c.stored)} stores · ${fmtCompact(c.removed)} removals`);
  setText(kpi("gaps"), `${fmtCompact(c.gaps)} · ${fmtCompact(c.replays)}`);
  setText(kpi("gaps-sub"), `${fmtCompact(c.replay_failures)} replays failed · ${fmtCompact(c.restarts)} restarts`);
  const dropped = c.orphans + c.unknown_hashes + c.shape_mismatch + c.capacity_refused + (c.evicted || 0);
  setText(kpi("dropped"), fmtCompact(dropped));
  setText(kpi("dropped-sub"), dropped
    ? `orphans ${fmtCompact(c.orphans)} · unknown ${fmtCompact(c.unknown_hashes)} · capacity ${fmtCompact(c.capacity_refused)} refused, ${fmtCompact(c.evicted || 0)} evicted`
    : "nothing dropped");
}

function stateOf(p) {
  if (p.replaying) return ["state-sync", "replaying"];
  if (p.connected) return ["state-ok", "connected"];
  if (p.connects) return ["state-bad", "disconnected"];
  return ["state-warn", "connecting"];
}

function renderPublishers() {
  const f = state.feed;
  setText($("publishers-count"), fmtInt(f.totals.publishers));
  const body = $("publishers").tBodies[0];
  const sig = JSON.stringify(f.publishers);
  if (body.dataset.sig === sig) return;
  body.dataset.sig = sig;
  if (!f.publishers.length) {
    const replica = (state.feed.cluster || {}).role === "replica";
    const text = replica
      ? "A read replica has no publishers: they register on its cluster's ingester, whose changes it follows (docs/CLUSTER.md)."
      : "No publisher yet. Register one with POST /register (an engine's KV-event PUB endpoint), or start the indexer with --publishers.";
    body.replaceChildren(h("tr", { class: "empty" }, h("td", { colspan: "11", text })));
    return;
  }
  body.replaceChildren(...f.publishers.map((p) => {
    const [cls, text] = stateOf(p);
    return h("tr", null,
      h("td", null, h("code", { text: p.endpoint }),
        h("span", { class: "sub", text: `${p.type}${p.replay_endpoint ? ` · replay ${p.replay_endpoint}` : " · no replay endpoint"}` })),
      h("td", null, h("span", { class: `state ${cls}` }, h("i", { class: "dot", "aria-hidden": "true" }), text),
        h("span", { class: "sub", text: `${fmtInt(p.connects)} connect${p.connects === 1 ? "" : "s"}` }),
        p.error ? h("span", { class: "err", text: p.error }) : null),
      h("td", { class: "num", text: p.last_seq == null ? "—" : fmtInt(p.last_seq) }),
      h("td", { class: "num", text: fmtBytes(p.queued_bytes), title: `${fmtInt(p.queue_full)} messages found the queue full and waited` }),
      h("td", { class: `num ${p.unrepaired_gaps ? "bad" : ""}`, text: fmtInt(p.gaps), title: `${fmtInt(p.unrepaired_gaps)} not repaired · ${fmtInt(p.duplicates)} duplicates` }),
      h("td", { class: `num ${p.replay_failures ? "warn" : ""}`, text: fmtInt(p.replays), title: `${fmtInt(p.replay_failures)} failed · ${fmtInt(p.partial_replays)} partial` }),
      h("td", { class: "num", text: fmtInt(p.restarts) }),
      h("td", { class: "num", text: fmtCompact(p.blocks.GPU) }),
      h("td", { class: "num", text: fmtCompact(p.blocks.CPU) }),
      h("td", { class: "num", text: fmtCompact(p.blocks.DISK) }),
      h("td", null, p.services.map((s) => h("span", { class: "sub" },
        h("b", { text: s.instance_id }), ` · rank ${s.dp_rank} · ${s.modelname} · bs ${s.block_size}${s.tenant_id !== "default" ? ` · ${s.tenant_id}` : ""}${s.lora_name ? ` · ${s.lora_name}` : ""}`))));
  }));
}

function renderDatalists() {
  const services = state.feed.publishers.flatMap((p) => p.services);
  const models = [...new Set(services.map((s) => s.modelname))];
  const tenants = [...new Set(services.map((s) => s.tenant_id))];
  const sig = `${models.join("\u0000")}\u0001${tenants.join("\u0000")}`;
  const dl = $("dl-models");
  if (dl.dataset.sig === sig) return;
  dl.dataset.sig = sig;
  dl.replaceChildren(...models.slice(0, 200).map((v) => h("option", { value: v })));
  $("dl-tenants").replaceChildren(...tenants.slice(0, 200).map((v) => h("option", { value: v })));
  // An empty form starts from the first registered service.
  const form = $("query-form");
  if (services.length && !form.model.value && !form.block_size.value) {
    form.model.value = services[0].modelname;
    form.block_size.value = String(services[0].block_size);
  }
}

// ---- the query box ------------------------------------------------------------------------

/** Token ids from "1, 2 3", "[1,2,3]" or one per line; throws with the first bad one. */
export function parseTokens(text) {
  const parts = text.replace(/[[\]]/g, " ").split(/[\s,]+/).filter(Boolean);
  if (parts.length > MAX_TOKENS) throw new Error(`${fmtInt(parts.length)} tokens: at most ${fmtInt(MAX_TOKENS)} per query`);
  return parts.map((s, i) => {
    if (!/^\d+$/.test(s) || Number(s) > 4294967295) throw new Error(`token ${i + 1} (“${s.slice(0, 20)}”) is not an integer in 0..4294967295`);
    return Number(s);
  });
}

const tokenBox = $("token-ids");
tokenBox.addEventListener("input", () => {
  const n = tokenBox.value.replace(/[[\]]/g, " ").split(/[\s,]+/).filter(Boolean).length;
  const bs = Number($("query-form").block_size.value) || 0;
  setText($("token-count"), n ? `${fmtInt(n)} tokens${bs ? ` · ${fmtInt(Math.floor(n / bs))} complete blocks` : ""}` : "");
});

$("query-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const form = e.target;
  const err = $("query-error");
  err.textContent = "";
  let body;
  try {
    const model = form.model.value.trim();
    if (!model) throw new Error("the model is required");
    const bs = Number(form.block_size.value);
    if (!Number.isInteger(bs) || bs < 1) throw new Error("the block size must be a whole number ≥ 1");
    const tokens = parseTokens(form.token_ids.value);
    if (!tokens.length) throw new Error("paste at least one token id");
    body = { model, block_size: bs, token_ids: tokens };
    const tenant = form.tenant_id.value.trim();
    if (tenant) body.tenant_id = tenant;
    const lora = form.lora_name.value.trim();
    if (lora) body.lora_name = lora;
  } catch (x) {
    err.textContent = x.message;
    return;
  }
  const send = $("query-send");
  send.disabled = true;
  const started = performance.now();
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), QUERY_TIMEOUT_MS);
  let answer;
  try {
    // Same origin, JSON: the browser adds Origin and Sec-Fetch-Site, which the guard checks.
    const resp = await fetch("/query", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify(body),
      cache: "no-store",
      credentials: "same-origin",
      signal: ctl.signal,
    });
    const text = await resp.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* shown as text */ }
    answer = { status: resp.status, ok: resp.ok, json, text, body, ms: performance.now() - started };
  } catch (x) {
    answer = { status: 0, ok: false, json: null, text: x.name === "AbortError" ? "no answer in time" : x.message, body, ms: performance.now() - started };
  } finally {
    clearTimeout(timer);
    send.disabled = false;
  }
  state.query = answer;
  renderAnswer(answer);
});

function renderAnswer(a) {
  const box = $("query-answer");
  box.hidden = false;
  box.dataset.status = String(a.status);
  const bs = a.body.block_size;
  const blocks = Math.floor(a.body.token_ids.length / bs);
  const head = h("div", { class: "result-head" },
    h("span", { class: `code-status ${a.ok ? "code-ok" : "code-err"}`, text: a.status ? String(a.status) : "ERR" }),
    h("code", { text: "POST /query" }),
    h("span", { class: "result-summary", text: `${fmtInt(a.body.token_ids.length)} tokens → ${fmtInt(blocks)} complete block${blocks === 1 ? "" : "s"} of ${bs}` }),
    h("span", { class: "ms", text: `${Math.round(a.ms)} ms` }));
  const parts = [head];
  if (!a.ok) {
    const why = a.json && (a.json.error || a.json.detail) ? `${a.json.error || JSON.stringify(a.json.detail)}${a.json.field ? ` (field ${a.json.field})` : ""}` : a.text;
    parts.push(h("p", { class: "result-detail", text: why }));
  } else {
    const rows = [];
    for (const [tenant, instances] of Object.entries(a.json || {})) {
      for (const [inst, m] of Object.entries(instances)) rows.push({ tenant, inst, ...m });
    }
    rows.sort((x, y) => y.longest_matched - x.longest_matched || x.inst.localeCompare(y.inst));
    if (!rows.length) {
      parts.push(h("p", { class: "none", text: "No instance holds the first block of these tokens (in this model, block size, tenant and LoRA)." }));
    } else {
      parts.push(h("table", { class: "tbl", id: "answer-table" },
        h("thead", null, h("tr", null, ...["Tenant", "Instance", "Longest match (tokens)", "GPU", "CPU", "DISK", "DP ranks"].map((c, i) => h("th", { class: i >= 2 && i <= 5 ? "num" : "", text: c })))),
        h("tbody", null, rows.map((r) => h("tr", null,
          h("td", { text: r.tenant }),
          h("td", null, h("code", { text: r.inst })),
          h("td", { class: "num", text: `${fmtInt(r.longest_matched)} / ${fmtInt(blocks * bs)}` }),
          h("td", { class: "num", text: fmtInt(r.GPU) }),
          h("td", { class: "num", text: fmtInt(r.CPU) }),
          h("td", { class: "num", text: fmtInt(r.DISK) }),
          h("td", null, h("span", { class: "dp" }, Object.entries(r.DP || {}).map(([rank, n]) => h("span", { class: "tag", text: `rank ${rank}: ${fmtInt(n)}` })))))))));
    }
  }
  parts.push(h("details", null, h("summary", { text: "Request and answer JSON" }),
    h("pre", { class: "code", text: `${prettyJson({ ...a.body, token_ids: a.body.token_ids.length > 64 ? `[${a.body.token_ids.length} ids]` : a.body.token_ids })}\n\n${a.json ? prettyJson(a.json) : a.text}` })));
  box.replaceChildren(...parts);
}

live.poll();
// For the browser test and debugging: read-only access to the page state.
window.kvplane = { live, rates, gauges, charts, state };
