// Shared by every service's page (the controller's, indexer, fleet, node): polls the page's
// JSON feed (GET /api/dashboard every 2 s; ?interval=ms to change it), asks for the server's
// 15-minute history on the first poll and after a reconnect, drives the connection indicator,
// the banner and the server clock, and turns history samples and polls into chart points.
// Only GETs here: the pages' POSTs (the controller's actions, the indexer's query box) are in
// actions.js and indexer.js.

import { fmtAge, fmtClock } from "./format.js";

const params = new URLSearchParams(location.search);
export const INTERVAL_MS = Math.max(250, Number(params.get("interval")) || 2000);
const HIDDEN_INTERVAL_MS = Math.max(INTERVAL_MS, 10000);
const MAX_BACKOFF_MS = 30000;
const FETCH_TIMEOUT_MS = 8000;
export const HISTORY_S = 900;

const $ = (id) => document.getElementById(id);

/**
 * Chart points from samples: `rate` turns cumulative counters into per-second rates between
 * consecutive samples; `gauge` keeps the values as they are. `keys` may be "*" (a gauge of
 * every column the samples have, for series that come and go, such as tenants).
 */
export class Series {
  constructor(kind, keys) {
    this.kind = kind;
    this.keys = keys;
    this.points = [];
    this.prev = null;
  }

  reset() {
    this.points = [];
    this.prev = null;
  }

  /** Rebuilds the points from the server's samples ({columns, rows}). */
  load(hist) {
    this.reset();
    const cols = hist.columns;
    for (const r of hist.rows) {
      const v = {};
      cols.forEach((c, i) => { if (i > 0 && r[i] != null) v[c] = r[i]; });
      this.add(r[0], v);
    }
  }

  /** One sample at server time `t` (seconds). */
  add(t, values) {
    const p = this.prev;
    if (p && t - p.t < 0.2) return; // a poll right after a server sample: wait for the next
    this.prev = { t, values };
    if (p && t <= p.t) return;
    const keys = this.keys === "*" ? Object.keys(values) : this.keys;
    const point = { t };
    if (this.kind === "rate") {
      if (!p) return;
      if (keys.some((k) => values[k] < p.values[k])) { // the server restarted
        this.points = [];
        return;
      }
      const dt = t - p.t;
      for (const k of keys) point[k] = values[k] == null || p.values[k] == null ? null : (values[k] - p.values[k]) / dt;
    } else {
      for (const k of keys) point[k] = values[k] == null ? null : values[k];
    }
    this.points.push(point);
    const cutoff = t - HISTORY_S;
    while (this.points.length && this.points[0].t < cutoff) this.points.shift();
  }
}

/** Polls `url`; `onFeed(feed, firstWithHistory)` renders each answer. */
export class Live {
  constructor({ url, what, onFeed, onTick }) {
    this.url = url;
    this.what = what;
    this.onFeed = onFeed;
    this.onTick = onTick || (() => {});
    this.feed = null;
    this.receivedAt = 0;
    this.needHistory = true;
    this.polls = 0;
    this.failures = 0;
    this.lastError = "";
    this.lastOk = 0;
    this.timer = 0;
    this.nextAt = 0;
    $("retry-now")?.addEventListener("click", () => this.poll());
    document.addEventListener("visibilitychange", () => { if (!document.hidden && this.failures === 0) this.poll(); });
    setInterval(() => {
      this.renderConnText();
      if (!this.feed) return;
      const clock = $("server-time");
      if (clock) clock.textContent = fmtClock(this.serverNow());
      this.onTick(this.serverNow());
    }, 1000);
  }

  /** Server clock now, extrapolated from the last feed. */
  serverNow() {
    if (!this.feed) return Date.now() / 1000;
    return this.feed.server_time + (performance.now() - this.receivedAt) / 1000;
  }

  async poll() {
    clearTimeout(this.timer);
    const ctl = new AbortController();
    const t = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    try {
      const withHistory = this.needHistory;
      const url = withHistory ? `${this.url}?history=1` : this.url;
      const resp = await fetch(url, { cache: "no-store", signal: ctl.signal, headers: { Accept: "application/json" } });
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      const feed = await resp.json();
      this.feed = feed;
      this.receivedAt = performance.now();
      if (withHistory && feed.history) this.needHistory = false;
      const v = $("version");
      if (v) v.textContent = `v${feed.version}`;
      const clock = $("server-time");
      if (clock) clock.textContent = fmtClock(this.serverNow());
      this.onFeed(feed, withHistory && !!feed.history);
      this.failures = 0;
      this.polls++;
      this.lastOk = performance.now();
      this.setConn("live");
      this.schedule(document.hidden ? HIDDEN_INTERVAL_MS : INTERVAL_MS);
    } catch (e) {
      this.failures++;
      this.needHistory = true; // our own samples have a hole: start again from the server's
      this.lastError = e.name === "AbortError" ? "no answer" : e.message || "network error";
      const delay = Math.min(MAX_BACKOFF_MS, INTERVAL_MS * 2 ** Math.min(this.failures, 6));
      this.setConn(this.failures >= 3 ? "down" : "retrying");
      this.schedule(delay);
      if (!(e instanceof TypeError) && e.name !== "AbortError" && !/^HTTP /.test(e.message)) throw e;
    } finally {
      clearTimeout(t);
    }
  }

  schedule(ms) {
    clearTimeout(this.timer);
    this.nextAt = performance.now() + ms;
    this.timer = setTimeout(() => this.poll(), ms);
  }

  setConn(kind) {
    const conn = $("conn");
    conn.dataset.state = kind;
    document.body.classList.toggle("stale", kind === "down");
    const banner = $("banner");
    if (kind === "live") banner.hidden = true;
    else if (kind === "down") banner.hidden = false;
    this.renderConnText();
  }

  renderConnText() {
    const kind = $("conn").dataset.state;
    const inS = Math.max(0, Math.ceil((this.nextAt - performance.now()) / 1000));
    let text;
    if (kind === "live") {
      const ago = Math.floor((performance.now() - this.lastOk) / 1000);
      text = ago < 2 ? "Live" : `Live · updated ${fmtAge(ago)} ago`;
    } else if (kind === "retrying") text = `Reconnecting… (${this.lastError})`;
    else if (kind === "down") text = "Disconnected";
    else text = "Connecting…";
    $("conn-text").textContent = text;
    if (kind === "down") {
      const seen = this.lastOk ? `; last update ${fmtAge((performance.now() - this.lastOk) / 1000)} ago` : "";
      $("banner-text").textContent = `Cannot reach ${this.what} (${this.lastError})${seen}. Retrying in ${inS} s.`;
    }
  }
}

/** Wires the [data-window] buttons; `onChange(seconds)` redraws. Returns the initial window. */
export function windowPicker(onChange) {
  const buttons = [...document.querySelectorAll("[data-window]")];
  for (const b of buttons) {
    b.addEventListener("click", () => {
      for (const o of buttons) o.setAttribute("aria-pressed", String(o === b));
      onChange(Number(b.dataset.window));
    });
  }
  const pressed = buttons.find((b) => b.getAttribute("aria-pressed") === "true");
  return pressed ? Number(pressed.dataset.window) : 300;
}

/** The gap (seconds) after which a chart breaks its line: a few missed polls. */
export const GAP_S = (Math.max(INTERVAL_MS, 2000) * 3.5) / 1000;

/** Sets an element's text only when it changed (no layout work for equal text). */
export function setText(el, text) {
  if (el && el.textContent !== text) el.textContent = text;
}
