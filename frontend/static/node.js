// kvplane node page: tier usage (L1 memory, L2 disk: bytes and objects against their budgets)
// over time, GET hits and misses, evictions, and the node's counters, from GET /api/dashboard
// on the node's --http-port. Read-only.

import { TimeChart } from "./chart.js";
import { fmtByteRate, fmtBytes, fmtCompact, fmtInt, fmtPct, fmtRate, h } from "./format.js";
import { GAP_S, Live, Series, setText, windowPicker } from "./live.js";

const $ = (id) => document.getElementById(id);
const kpi = (k) => document.querySelector(`[data-k="${k}"]`);

const gauges = new Series("gauge", ["l1_bytes", "l2_bytes", "l1_objects", "l2_objects"]);
const rates = new Series("rate", ["hit", "miss", "evict_l1", "evict_l2", "put_bytes", "get_bytes"]);

const charts = {
  bytes: new TimeChart($("chart-bytes"), {
    title: "Tier usage", unit: "", legend: $("legend-bytes"), stacked: false, fmt: fmtBytes, binary: true,
    series: [{ key: "l1_bytes", label: "L1", color: "--s1" }, { key: "l2_bytes", label: "L2", color: "--s2" }],
  }),
  objects: new TimeChart($("chart-objects"), {
    title: "Objects", unit: "", legend: $("legend-objects"), stacked: false, fmt: fmtCompact,
    series: [{ key: "l1_objects", label: "L1", color: "--s1" }, { key: "l2_objects", label: "L2", color: "--s2" }],
  }),
  gets: new TimeChart($("chart-gets"), {
    title: "GET", unit: "/s", legend: $("legend-gets"),
    series: [{ key: "hit", label: "hit", color: "--s3" }, { key: "miss", label: "miss", color: "--s4" }],
  }),
  evictions: new TimeChart($("chart-evictions"), {
    title: "Evictions", unit: "objects/s", legend: $("legend-evictions"),
    series: [{ key: "evict_l1", label: "L1", color: "--s1" }, { key: "evict_l2", label: "L2", color: "--s2" }],
  }),
};
let windowS = windowPicker((w) => { windowS = w; renderCharts(); });

const live = new Live({ url: "/api/dashboard", what: "the node", onFeed, onTick: () => renderCharts() });

function onFeed(feed, withHistory) {
  if (withHistory) {
    gauges.load(feed.history);
    rates.load(feed.history);
  }
  const c = feed.counters;
  const values = {
    l1_bytes: feed.l1.bytes, l2_bytes: feed.l2 ? feed.l2.bytes : 0,
    l1_objects: feed.l1.objects, l2_objects: feed.l2 ? feed.l2.objects : 0,
    hit: c.get_hit, miss: c.get_miss, evict_l1: feed.l1.evictions, evict_l2: feed.l2 ? feed.l2.evictions : 0,
    put_bytes: c.put_bytes, get_bytes: c.get_bytes,
  };
  gauges.add(feed.server_time, values);
  rates.add(feed.server_time, values);
  renderKpis(feed);
  renderTiers(feed);
  renderCharts();
}

function renderCharts() {
  const now = live.serverNow();
  charts.bytes.setData(gauges.points, windowS, now, GAP_S);
  charts.objects.setData(gauges.points, windowS, now, GAP_S);
  charts.gets.setData(rates.points, windowS, now, GAP_S);
  charts.evictions.setData(rates.points, windowS, now, GAP_S);
}

function tierKpi(name, t) {
  const bar = kpi(`${name}-bar`);
  if (!t) {
    setText(kpi(name), "off");
    setText(kpi(`${name}-sub`), "no --l2-path");
    bar.hidden = true;
    return;
  }
  bar.hidden = false;
  setText(kpi(name), fmtBytes(t.bytes));
  const used = t.capacity_bytes ? t.bytes / t.capacity_bytes : 0;
  bar.querySelector(".bar-fill").style.width = `${Math.min(1, used) * 100}%`;
  setText(kpi(`${name}-sub`), `${fmtPct(used)} of ${fmtBytes(t.capacity_bytes)} · ${fmtInt(t.objects)} objects`);
}

function renderKpis(feed) {
  const c = feed.counters;
  tierKpi("l1", feed.l1);
  tierKpi("l2", feed.l2);
  const gets = c.get_hit + c.get_miss;
  setText(kpi("hitrate"), gets ? fmtPct(c.get_hit / gets) : "–");
  const last = rates.points[rates.points.length - 1];
  setText(kpi("hitrate-sub"), gets
    ? `${fmtCompact(c.get_hit)} hits · ${fmtCompact(c.get_miss)} misses${last ? ` · ${fmtRate(last.hit + last.miss)}/s` : ""}`
    : "no GET yet");
  setText(kpi("traffic"), last ? fmtByteRate(last.put_bytes + last.get_bytes) : "–");
  setText(kpi("traffic-sub"), `in ${fmtBytes(c.put_bytes)} · out ${fmtBytes(c.get_bytes)}`);
  const ev = feed.l1.evictions + (feed.l2 ? feed.l2.evictions : 0);
  setText(kpi("evictions"), fmtCompact(ev));
  setText(kpi("evictions-sub"), `L1 ${fmtCompact(feed.l1.evictions)} · L2 ${feed.l2 ? fmtCompact(feed.l2.evictions) : "–"} · ${fmtBytes(feed.l1.evicted_bytes + (feed.l2 ? feed.l2.evicted_bytes : 0))}`);
  setText(kpi("conns"), fmtInt(c.connections_open));
  setText(kpi("conns-sub"), `${fmtCompact(c.connections_total)} accepted · ${fmtCompact(c.connections_refused)} refused`);
}

function renderTiers(feed) {
  const rows = [["L1 memory", feed.l1], ["L2 disk", feed.l2]];
  const body = $("tiers").tBodies[0];
  const sig = JSON.stringify(rows);
  if (body.dataset.sig !== sig) {
    body.dataset.sig = sig;
    body.replaceChildren(...rows.map(([name, t]) => {
      if (!t) return h("tr", null, h("td", { text: name }), h("td", { colspan: "8", class: "none", text: "not configured (no --l2-path)" }));
      const used = t.capacity_bytes ? t.bytes / t.capacity_bytes : 0;
      const fill = h("span", { class: "bar-fill" });
      fill.style.width = `${Math.min(1, used) * 100}%`;
      return h("tr", null,
        h("td", { text: name }),
        h("td", { class: "num", text: fmtBytes(t.bytes) }),
        h("td", { class: "num", text: fmtBytes(t.capacity_bytes) }),
        h("td", null, h("span", { class: "usage" }, h("span", { class: "bar" }, fill), h("span", { class: "pct", text: fmtPct(used) }))),
        h("td", { class: "num", text: fmtInt(t.objects) }),
        h("td", { class: "num", text: fmtInt(t.evictions) }),
        h("td", { class: "num", text: fmtBytes(t.evicted_bytes) }),
        h("td", { class: "num", text: fmtInt(t.stores_refused) }),
        h("td", { class: "num", text: fmtInt(t.pinned) }));
    }));
  }
  renderCommands(feed.commands || []);
  const c = feed.counters;
  const pairs = [
    ["GET hits", fmtInt(c.get_hit)], ["GET misses", fmtInt(c.get_miss)],
    ["EXIST hits", fmtInt(c.exist_hit)], ["EXIST misses", fmtInt(c.exist_miss)],
    ["PUTs", fmtInt(c.puts)], ["Bytes in", fmtBytes(c.put_bytes)],
    ["Bytes out", fmtBytes(c.get_bytes)], ["Bad requests", fmtInt(c.bad_requests)],
    ["L2 writes", `${fmtInt(c.l2_writes_ok)}${c.l2_write_errors ? ` · ${fmtInt(c.l2_write_errors)} failed` : ""}`],
    ["L2 reads", `${fmtInt(c.l2_reads_ok)}${c.l2_read_errors ? ` · ${fmtInt(c.l2_read_errors)} failed` : ""}`],
    ["L2 → L1", fmtInt(c.l2_promotions)], ["Refused conns", fmtInt(c.connections_refused)],
  ];
  const dl = $("counters");
  const csig = JSON.stringify(pairs);
  if (dl.dataset.sig === csig) return;
  dl.dataset.sig = csig;
  dl.replaceChildren(...pairs.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })]));
}

function renderCommands(commands) {
  const body = $("commands").tBodies[0];
  const sig = JSON.stringify(commands);
  if (body.dataset.sig === sig) return;
  body.dataset.sig = sig;
  if (!commands.length) {
    body.replaceChildren(h("tr", null, h("td", { colspan: "3", class: "none", text: "none yet (the controller's /pin, /move, /compress, /clear… show here)" })));
    return;
  }
  body.replaceChildren(...commands.map((c) => h("tr", null,
    h("td", { text: c.command }),
    h("td", { class: "num", text: fmtInt(c.ok) }),
    h("td", { class: "num", text: fmtInt(c.error) }))));
}

live.poll();
// For the browser test and debugging: read-only access to the page state.
window.kvplane = { live, gauges, rates, charts };
