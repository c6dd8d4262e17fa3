// The workers grid: filtered and sorted client-side, virtualised (only the rows in view exist
// in the DOM, recycled from a small pool), and patched cell by cell: a poll or a one-second
// tick rewrites only the cells whose content changed.

import { bar, fmtAge, fmtCompact, fmtInt, fmtPct, h } from "./format.js";

export const ROW_H = 32;
const OVERSCAN = 6;

/** The rule a server without `config.status` used: LMCache's heartbeat-age thresholds. */
/** The LMCache controller-wire generations (`protocol` of a worker row), and what each means. */
export const WIRE_NOTES = {
  "0.3.3-0.3.9": "registers and heartbeats by push (distributed_url), one message per admit, no full sync",
  "0.3.10-0.3.11": "registers and heartbeats by push, batched admits, no full sync",
  "0.3.12-0.5.6": "registers by request, heartbeat commands, full sync",
};
/** The one generation that can be asked for a full sync. */
export const FULL_SYNC_WIRE = "0.3.12-0.5.6";

export const FALLBACK_RULE = { basis: "last_heartbeat_time", active_s: 60, warning_s: 300 };

/**
 * A worker's status from the age of its last contact, with the thresholds the server serves
 * (`config.status`: active below `active_s`, warning below `warning_s`, else inactive).
 */
export function statusOf(contactAge, rule = FALLBACK_RULE) {
  return contactAge < rule.active_s ? "active" : contactAge < rule.warning_s ? "warning" : "inactive";
}

const STATUS_RANK = { active: 0, warning: 1, inactive: 2 };

const SORTS = {
  status: (a, b) => STATUS_RANK[a.status] - STATUS_RANK[b.status] || b.contact - a.contact,
  instance: (a, b) => cmpStr(a.instance_id, b.instance_id) || a.worker_id - b.worker_id,
  worker: (a, b) => a.worker_id - b.worker_id || cmpStr(a.instance_id, b.instance_id),
  endpoint: (a, b) => cmpStr(a.ip, b.ip) || a.port - b.port,
  keys: (a, b) => a.key_count - b.key_count,
  locations: (a, b) => a.locations.length - b.locations.length || cmpStr(a.locNames, b.locNames),
  heartbeat: (a, b) => a.age - b.age,
  sync: (a, b) => syncRank(a) - syncRank(b),
};

const collator = new Intl.Collator("en", { numeric: true, sensitivity: "base" });
function cmpStr(a, b) { return collator.compare(a, b); }
function syncRank(w) {
  if (!w.sync) return 2;
  if (w.sync.state === "failed") return -1;
  if (w.sync.state === "syncing") return w.sync.progress;
  return 1.5; // completed
}

export class WorkerGrid {
  /**
   * @param {HTMLElement} viewport  scroll container (role=grid) holding the sticky head
   * @param {HTMLElement} body  positioned container for the rows
   * @param {{onSelect: (key: string|null, viaKeyboard: boolean) => void, onView: () => void}} opts
   */
  constructor(viewport, body, opts) {
    this.viewport = viewport;
    this.body = body;
    this.opts = opts;
    this.all = [];
    this.view = [];
    this.filterText = "";
    this.filterStatus = "";
    this.sortKey = "instance";
    this.sortDir = 1;
    this.selected = null;
    this.pool = [];
    this.frame = 0;
    this.now = 0;
    this.headH = viewport.querySelector(".grid-head").offsetHeight || 34;
    viewport.addEventListener("scroll", () => this.schedule(), { passive: true });
    new ResizeObserver(() => this.schedule()).observe(viewport);
    viewport.addEventListener("keydown", (e) => this.onKey(e));
    body.addEventListener("click", (e) => {
      const row = e.target.closest(".grid-row");
      if (row && row.dataset.key) this.select(row.dataset.key, false);
    });
    for (const btn of viewport.querySelectorAll(".grid-head button[data-sort]")) {
      btn.addEventListener("click", () => {
        const k = btn.dataset.sort;
        if (this.sortKey === k) this.sortDir = -this.sortDir;
        else { this.sortKey = k; this.sortDir = k === "keys" || k === "heartbeat" || k === "status" ? -1 : 1; }
        this.refilter();
      });
    }
  }

  /** New poll: `workers` are enriched worker objects (key, age, status, …). */
  setWorkers(workers, now) {
    this.all = workers;
    this.now = now;
    this.refilter();
  }

  /** One-second tick: ages moved on; re-sort only when the order depends on them. */
  tick(now, refresh) {
    this.now = now;
    for (const w of this.all) refresh(w, now);
    if (this.sortKey === "heartbeat" || this.sortKey === "status" || this.filterStatus) this.refilter();
    else this.render();
  }

  setFilter(text, status) {
    if (text != null) this.filterText = text.trim().toLowerCase();
    if (status != null) this.filterStatus = status;
    this.refilter();
  }

  refilter() {
    const terms = this.filterText.split(/\s+/).filter(Boolean);
    const st = this.filterStatus;
    this.view = this.all.filter((w) => {
      if (st === "sync") { if (!w.sync || w.sync.state === "completed") return false; }
      else if (st && w.status !== st) return false;
      return terms.every((t) => w.haystack.includes(t));
    });
    const cmp = SORTS[this.sortKey] || SORTS.instance;
    const dir = this.sortDir;
    this.view.sort((a, b) => dir * cmp(a, b) || SORTS.instance(a, b));
    for (const th of this.viewport.querySelectorAll(".grid-head [role=columnheader]")) {
      const k = th.querySelector("button")?.dataset.sort;
      if (k === this.sortKey) th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
    this.viewport.setAttribute("aria-rowcount", String(this.view.length + 1));
    this.body.style.height = `${this.view.length * ROW_H}px`;
    this.render();
    this.opts.onView();
  }

  schedule() {
    if (!this.frame) this.frame = requestAnimationFrame(() => { this.frame = 0; this.render(); });
  }

  /** The visible range [first, last) of `view`. */
  range() {
    const top = Math.max(0, this.viewport.scrollTop);
    const height = Math.max(0, this.viewport.clientHeight - this.headH);
    const first = Math.floor(top / ROW_H);
    const last = Math.min(this.view.length, Math.ceil((top + height) / ROW_H));
    return [first, last];
  }

  render() {
    const [first, last] = this.range();
    const from = Math.max(0, first - OVERSCAN);
    const to = Math.min(this.view.length, last + OVERSCAN);
    const need = to - from;
    while (this.pool.length < need) this.pool.push(this.makeRow());
    for (let i = 0; i < this.pool.length; i++) {
      const row = this.pool[i];
      const idx = from + i;
      if (i >= need) {
        if (!row.hidden) { row.hidden = true; row.dataset.key = ""; }
        continue;
      }
      const w = this.view[idx];
      row.hidden = false;
      if (row._idx !== idx) {
        row.style.transform = `translateY(${idx * ROW_H}px)`;
        row.setAttribute("aria-rowindex", String(idx + 2));
        row._idx = idx;
      }
      row.dataset.key = w.key;
      const sel = w.key === this.selected;
      if (row._sel !== sel) { row.setAttribute("aria-selected", String(sel)); row.classList.toggle("cursor", sel); row._sel = sel; }
      this.fill(row, w);
    }
  }

  makeRow() {
    const cells = ["c-status", "c-inst", "c-wid num", "c-ep", "c-keys num", "c-locs", "c-hb", "c-sync"]
      .map((c) => h("div", { role: "gridcell", class: c }));
    const row = h("div", { class: "grid-row", role: "row", "aria-selected": "false" }, cells);
    row._cells = cells;
    row._sig = new Array(cells.length).fill(null);
    row._idx = -1;
    this.body.append(row);
    return row;
  }

  /** Writes cell `i` only when its signature changed. */
  put(row, i, sig, build) {
    if (row._sig[i] === sig) return;
    row._sig[i] = sig;
    const cell = row._cells[i];
    const v = build();
    if (typeof v === "string") cell.textContent = v;
    else cell.replaceChildren(v);
  }

  fill(row, w) {
    this.put(row, 0, w.status, () =>
      h("span", { class: `st st-${w.status}` }, h("i", { class: `dot dot-${w.status}`, "aria-hidden": "true" }), w.status));
    this.put(row, 1, w.instance_id, () => w.instance_id);
    this.put(row, 2, w.worker_id, () => String(w.worker_id));
    this.put(row, 3, w.endpoint, () => w.endpoint);
    this.put(row, 4, w.key_count, () => fmtInt(w.key_count));
    this.put(row, 5, w.locSig, () => {
      if (!w.locations.length) return h("span", { class: "none", text: "none" });
      return h("span", null, w.locations.map((l) => h("span", { class: "tag", title: `${l.name}: ${fmtInt(l.key_count)} keys`, text: `${shortLoc(l.name)} ${fmtCompact(l.key_count)}` })));
    });
    const age = fmtAge(w.age);
    this.put(row, 6, `${w.heartbeated}|${age}`, () => w.heartbeated
      ? `${age} ago`
      : h("span", { class: "reg", title: "No heartbeat yet: age since registration" }, `reg. ${age} ago`));
    const s = w.sync;
    const sig = s ? `${s.state}|${s.received_batches}|${s.expected_batches}` : "idle";
    this.put(row, 7, `${sig}|${w.protocol}`, () => syncCell(s, w.protocol));
  }

  select(key, viaKeyboard) {
    this.selected = key;
    this.render();
    this.opts.onSelect(key, viaKeyboard);
  }

  /** Scrolls so that view index `i` is visible. */
  reveal(i) {
    const top = i * ROW_H;
    const vh = this.viewport.clientHeight - this.headH;
    if (top < this.viewport.scrollTop) this.viewport.scrollTop = top;
    else if (top + ROW_H > this.viewport.scrollTop + vh) this.viewport.scrollTop = top + ROW_H - vh;
  }

  onKey(e) {
    if (!this.view.length) return;
    const cur = this.view.findIndex((w) => w.key === this.selected);
    const page = Math.max(1, Math.floor((this.viewport.clientHeight - this.headH) / ROW_H) - 1);
    const moves = { ArrowDown: 1, ArrowUp: -1, PageDown: page, PageUp: -page, Home: -Infinity, End: Infinity };
    if (!(e.key in moves)) {
      if (e.key === "Escape" && this.selected) { this.select(null, true); e.preventDefault(); }
      return;
    }
    e.preventDefault();
    const next = Math.max(0, Math.min(this.view.length - 1, (cur < 0 ? -1 : cur) + moves[e.key]));
    this.reveal(next);
    this.select(this.view[next].key, true);
  }
}

/** LocalCPUBackend → CPU, LocalDiskBackend → Disk, others unchanged. */
export function shortLoc(name) {
  const m = name.match(/^Local(\w+?)Backend$/);
  return m ? m[1] : name.replace(/Backend$/, "");
}

function syncCell(s, protocol) {
  if (!s && protocol !== FULL_SYNC_WIRE) return h("span", { class: "none", title: `LMCache ${protocol}: ${WIRE_NOTES[protocol] || "unknown generation"}`, text: `n/a (${protocol})` });
  if (!s) return h("span", { class: "none", text: "—" });
  if (s.state === "completed") return h("span", { class: "sync-done", text: "✓ completed" });
  if (s.state === "failed") return h("span", { class: "sync-failed", title: s.failure || "", text: `✕ failed${s.failure ? ` (${s.failure})` : ""}` });
  return h("span", { class: "mini", title: `${s.received_batches}/${s.expected_batches} batches` },
    bar(s.progress), h("span", { class: "pct", text: fmtPct(s.progress) }));
}
