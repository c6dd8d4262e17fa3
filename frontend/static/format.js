// Formatting and tiny DOM helpers shared by the dashboard modules.

const intFmt = new Intl.NumberFormat("en-US");

/** 12,345 */
export function fmtInt(n) {
  return n == null || !Number.isFinite(n) ? "–" : intFmt.format(Math.round(n));
}

/** 950 · 1.23k · 12.3k · 123k · 1.23M … (three significant digits). */
export function fmtCompact(n) {
  if (n == null || !Number.isFinite(n)) return "–";
  const a = Math.abs(n);
  if (a < 1000) return a < 10 && a % 1 !== 0 ? n.toFixed(1) : String(Math.round(n));
  const units = ["k", "M", "G", "T", "P"];
  let v = a;
  let i = -1;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  const s = v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  return (n < 0 ? "-" : "") + s.replace(/\.0+$|(\.\d*?)0+$/, "$1") + units[i];
}

/** A rate: one decimal under 10, compact above. */
export function fmtRate(r) {
  if (r == null || !Number.isFinite(r)) return "–";
  if (r === 0) return "0";
  if (r < 10) return r.toFixed(1);
  return fmtCompact(r);
}

/** 0s · 42s · 3m 05s · 2h 04m · 3d 2h */
export function fmtAge(s) {
  if (s == null || !Number.isFinite(s)) return "–";
  s = Math.max(0, Math.floor(s));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

const pad = (n) => String(n).padStart(2, "0");

/** HH:MM:SS in the viewer's time zone. */
export function fmtClock(unix, seconds = true) {
  const d = new Date(unix * 1000);
  const hm = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  return seconds ? `${hm}:${pad(d.getSeconds())}` : hm;
}

/** YYYY-MM-DD HH:MM:SS in the viewer's time zone. */
export function fmtDateTime(unix) {
  const d = new Date(unix * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${fmtClock(unix)}`;
}

/** 45% (one decimal under 10% and above 99%, so 99.6% never shows as 100%). */
export function fmtPct(f) {
  if (f == null || !Number.isFinite(f)) return "–";
  const p = f * 100;
  if (p > 0 && p < 10) return `${p.toFixed(1)}%`;
  if (p > 99 && p < 100) return `${Math.min(p, 99.9).toFixed(1)}%`;
  return `${Math.round(p)}%`;
}

/** JSON with two-space indent, but arrays of plain values on one line ([1, 2, 3]). */
export function prettyJson(v) {
  return JSON.stringify(v, null, 2).replace(/\[\s*\n([^[\]{}]*?)\n\s*\]/g, (_, inner) =>
    `[${inner.split(",\n").map((x) => x.trim()).join(", ")}]`);
}

/** A same-origin path ("/x", not "//host") or a fragment ("#x"). */
export function safeUrl(v) {
  const s = String(v);
  return (s.startsWith("/") && !s.startsWith("//") && !s.startsWith("/\\")) || s.startsWith("#");
}

/**
 * Builds an element: h("div", {class: "x", text: "hi"}, child, …). Children are nodes or
 * strings (always inserted as text, never as HTML). `href` and `src` must be same-origin
 * paths or fragments (start with "/" but not "//", or "#"): anything else (`javascript:`, a
 * remote URL) throws, so data from a worker can never become a link that runs or leaves.
 */
export function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === "text") e.textContent = v;
      else if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if ((k === "href" || k === "src") && !safeUrl(v)) throw new Error(`h(): refused ${k}=${String(v).slice(0, 40)}`);
      else e.setAttribute(k, v === true ? "" : v);
    }
  }
  for (const c of children.flat()) {
    if (c == null || c === false) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

/** A progress bar (fraction 0..1) built with CSSOM only (the page's CSP forbids inline styles). */
export function bar(fraction, extraClass = "") {
  const fill = h("span", { class: "bar-fill" });
  fill.style.width = `${Math.max(0, Math.min(1, fraction)) * 100}%`;
  return h("span", { class: `bar ${extraClass}`.trim() }, fill);
}

/** 512 B · 1.5 KiB · 12.3 MiB · 1.02 GiB (binary units, three significant digits). */
export function fmtBytes(n) {
  if (n == null || !Number.isFinite(n)) return "–";
  const a = Math.abs(n);
  if (a < 1024) return `${Math.round(n)} B`;
  const units = ["KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = a;
  let i = -1;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  const s = v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  return `${n < 0 ? "-" : ""}${s.replace(/\.0+$|(\.\d*?)0+$/, "$1")} ${units[i]}`;
}

/** A byte rate: 0 · 1.5 KiB/s … */
export function fmtByteRate(r) {
  if (r == null || !Number.isFinite(r)) return "–";
  return r === 0 ? "0" : `${fmtBytes(r)}/s`;
}
