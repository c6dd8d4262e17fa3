// A small time-series chart on <canvas> (stacked areas, or overlaid areas and dashed lines):
// crisp on any device pixel ratio, themed from CSS variables, with gaps where the dashboard
// was disconnected and a hover tooltip.

import { fmtClock, fmtCompact, fmtRate } from "./format.js";

const PAD = { top: 10, right: 12, bottom: 22, left: 44 };

let tip; // one tooltip element shared by every chart

function tooltip() {
  if (!tip) {
    tip = document.createElement("div");
    tip.className = "chart-tip";
    tip.hidden = true;
    document.body.append(tip);
  }
  return tip;
}

/** 1, 2, 2.5, 5 × 10^k at or above `v`. */
function niceCeil(v) {
  if (!(v > 0)) return 1;
  const exp = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * exp >= v) return m * exp;
  return 10 * exp;
}

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

export class TimeChart {
  /**
   * @param {HTMLCanvasElement} canvas
   * @param {{series: {key: string, label: string, color: string, dash?: boolean}[],
   *          legend?: HTMLElement, title: string, unit: string, stacked?: boolean,
   *          fmt?: (v: number) => string}} opts  series are stacked bottom-up unless
   *          `stacked` is false (then each is drawn from zero; `dash` ones as a dashed line, no
   *          fill); color is a CSS variable name; `fmt` formats values (default: a rate);
   *          `binary` rounds the axis in powers of 1024 (bytes).
   */
  constructor(canvas, opts) {
    this.canvas = canvas;
    this.opts = opts;
    this.stacked = opts.stacked !== false;
    this.fmt = opts.fmt || fmtRate;
    this.points = [];
    this.window = 300;
    this.now = 0;
    this.gap = 10;
    this.hover = null;
    this.legendCells = [];
    this.buildLegend();
    new ResizeObserver(() => this.draw()).observe(canvas);
    matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => this.draw());
    canvas.addEventListener("pointermove", (e) => this.onMove(e));
    canvas.addEventListener("pointerleave", () => { this.hover = null; tooltip().hidden = true; this.draw(); });
  }

  buildLegend() {
    this.legendCells = [];
    const legend = this.opts.legend;
    if (!legend) return;
    legend.replaceChildren();
    for (const s of this.opts.series) {
      const swatch = document.createElement("i");
      if (s.dash) swatch.className = "dash";
      const value = document.createElement("b");
      const item = document.createElement("span");
      item.append(swatch, s.label, value);
      legend.append(item);
      this.legendCells.push({ swatch, value, s });
    }
  }

  /** Replaces the series (same shape as the constructor's), rebuilding the legend. */
  setSeries(series) {
    const sig = JSON.stringify(series);
    if (sig === this.seriesSig) return;
    this.seriesSig = sig;
    this.opts.series = series;
    this.buildLegend();
    this.draw();
  }

  /**
   * @param {{t: number}[]} points  samples sorted by time (Unix seconds), one value per series key
   * @param {number} windowS  seconds shown
   * @param {number} now  right edge (Unix seconds)
   * @param {number} gapS  a longer silence between samples breaks the line
   */
  setData(points, windowS, now, gapS) {
    this.points = points;
    this.window = windowS;
    this.now = now;
    this.gap = gapS;
    this.draw();
  }

  visible() {
    const from = this.now - this.window;
    // keep one point left of the edge so the line enters from the border
    let i = this.points.findIndex((p) => p.t >= from);
    if (i < 0) return [];
    return this.points.slice(Math.max(0, i - 1));
  }

  draw() {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth;
    const hgt = c.clientHeight;
    if (!w || !hgt) return;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(hgt * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(hgt * dpr);
    }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, hgt);

    const series = this.opts.series;
    const colors = series.map((s) => cssVar(s.color));
    const muted = cssVar("--muted");
    const grid = cssVar("--grid");
    const font = `11px ${cssVar("--font")}`;
    const pts = this.visible();
    const inWindow = pts.filter((p) => p.t >= this.now - this.window);
    c.dataset.points = String(inWindow.length);

    const height = (p) => (this.stacked
      ? series.reduce((a, s) => a + (p[s.key] || 0), 0)
      : Math.max(0, ...series.map((s) => p[s.key] || 0)));
    const totals = pts.map(height);
    const yStep = (Math.max(0, ...totals) * 1.08) / 4;
    // Four round steps; for bytes, round in the binary unit the values are shown in.
    const unit = this.opts.binary && yStep >= 1024 ? 1024 ** Math.floor(Math.log(yStep) / Math.log(1024)) : 1;
    const maxV = 4 * unit * niceCeil(yStep / unit);
    const label = (v) => (this.opts.fmt ? this.fmt(v) : Number.isInteger(v) ? fmtCompact(v) : fmtRate(v));
    g.font = font;
    const labelW = Math.max(...[0, 1, 2, 3, 4].map((i) => g.measureText(label((maxV * i) / 4)).width));
    const x0 = Math.max(PAD.left, Math.ceil(labelW) + 14);
    const x1 = w - PAD.right;
    const y0 = hgt - PAD.bottom;
    const y1 = PAD.top;
    const X = (t) => x0 + ((t - (this.now - this.window)) / this.window) * (x1 - x0);
    const Y = (v) => y0 - (v / maxV) * (y0 - y1);

    // grid and y labels
    g.font = font;
    g.textBaseline = "middle";
    g.textAlign = "right";
    g.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const v = (maxV * i) / 4;
      const y = Math.round(Y(v)) + 0.5;
      g.strokeStyle = grid;
      g.beginPath();
      g.moveTo(x0, y);
      g.lineTo(x1, y);
      g.stroke();
      g.fillStyle = muted;
      g.fillText(label(v), x0 - 8, y);
    }
    // x labels at round clock times
    const step = this.window <= 60 ? 15 : this.window <= 300 ? 60 : 180;
    g.textAlign = "center";
    g.textBaseline = "top";
    for (let t = Math.ceil((this.now - this.window) / step) * step; t <= this.now; t += step) {
      const x = X(t);
      if (x < x0 + 16 || x > x1 - 16) continue;
      g.fillStyle = muted;
      g.fillText(fmtClock(t, step < 60), x, y0 + 6);
      g.strokeStyle = grid;
      g.beginPath();
      g.moveTo(Math.round(x) + 0.5, y0);
      g.lineTo(Math.round(x) + 0.5, y0 + 4);
      g.stroke();
    }

    if (pts.length < 2) {
      g.fillStyle = muted;
      g.textAlign = "center";
      g.textBaseline = "middle";
      g.font = `12px ${cssVar("--font")}`;
      g.fillText(pts.length ? "Collecting samples…" : "Waiting for data…", (x0 + x1) / 2, (y0 + y1) / 2);
      this.updateLegend(null);
      return;
    }

    // contiguous runs (a silence longer than `gap` splits them)
    const runs = [];
    let run = [];
    pts.forEach((p, i) => {
      if (i > 0 && p.t - pts[i - 1].t > this.gap) { runs.push(run); run = []; }
      run.push(p);
    });
    runs.push(run);

    g.save();
    g.beginPath();
    g.rect(x0, y1 - 2, x1 - x0, y0 - y1 + 2);
    g.clip();
    for (const r of runs) {
      if (r.length < 2) continue;
      let below = r.map(() => 0);
      series.forEach((s, si) => {
        const base = this.stacked ? below : below.map(() => 0);
        const above = r.map((p, i) => base[i] + (p[s.key] || 0));
        if (!s.dash) {
          const grad = g.createLinearGradient(0, y1, 0, y0);
          grad.addColorStop(0, withAlpha(colors[si], this.stacked ? 0.34 : 0.2));
          grad.addColorStop(1, withAlpha(colors[si], this.stacked ? 0.06 : 0.03));
          g.beginPath();
          r.forEach((p, i) => (i ? g.lineTo(X(p.t), Y(above[i])) : g.moveTo(X(p.t), Y(above[i]))));
          for (let i = r.length - 1; i >= 0; i--) g.lineTo(X(r[i].t), Y(base[i]));
          g.closePath();
          g.fillStyle = grad;
          g.fill();
        }
        g.beginPath();
        r.forEach((p, i) => (i ? g.lineTo(X(p.t), Y(above[i])) : g.moveTo(X(p.t), Y(above[i]))));
        g.strokeStyle = colors[si];
        g.lineWidth = s.dash ? 1.3 : 1.6;
        g.lineJoin = "round";
        g.setLineDash(s.dash ? [5, 4] : []);
        g.stroke();
        g.setLineDash([]);
        if (this.stacked) below = above;
      });
    }
    g.restore();

    // hover crosshair
    let shown = null;
    if (this.hover != null) {
      const t = this.now - this.window + ((this.hover - x0) / (x1 - x0)) * this.window;
      shown = inWindow.reduce((best, p) => (!best || Math.abs(p.t - t) < Math.abs(best.t - t) ? p : best), null);
      if (shown) {
        const x = Math.round(X(shown.t)) + 0.5;
        g.strokeStyle = muted;
        g.setLineDash([3, 3]);
        g.beginPath();
        g.moveTo(x, y1);
        g.lineTo(x, y0);
        g.stroke();
        g.setLineDash([]);
        let acc = 0;
        series.forEach((s, si) => {
          acc = (this.stacked ? acc : 0) + (shown[s.key] || 0);
          g.beginPath();
          g.arc(x, Y(acc), 3, 0, Math.PI * 2);
          g.fillStyle = colors[si];
          g.fill();
        });
        this.showTip(shown, x);
      }
    }
    this.updateLegend(shown || pts[pts.length - 1]);
    const last = pts[pts.length - 1];
    const now = series.map((s) => `${s.label} ${this.fmt(last[s.key])}`).join(", ");
    const peak = Math.max(...inWindow.map(height));
    c.setAttribute("aria-label", `${this.opts.title} (${this.opts.unit}): now ${now}; peak ${this.fmt(peak)} over the last ${Math.round(this.window / 60)} minutes`);
  }

  updateLegend(p) {
    this.legendCells.forEach(({ swatch, value, s }) => {
      if (s.dash) swatch.style.borderTopColor = cssVar(s.color);
      else swatch.style.background = cssVar(s.color);
      value.textContent = p && p[s.key] != null ? this.fmt(p[s.key]) : "–";
    });
  }

  onMove(e) {
    const r = this.canvas.getBoundingClientRect();
    this.hover = e.clientX - r.left;
    this.draw();
  }

  showTip(p, x) {
    const t = tooltip();
    t.replaceChildren();
    const head = document.createElement("div");
    head.className = "t";
    head.textContent = fmtClock(p.t);
    t.append(head);
    let total = 0;
    for (const s of this.opts.series) {
      const row = document.createElement("div");
      const sw = document.createElement("i");
      sw.style.background = cssVar(s.color);
      const b = document.createElement("b");
      b.textContent = `${p[s.key] == null ? "–" : this.fmt(p[s.key])} ${this.opts.unit}`.trim();
      row.append(sw, s.label, b);
      t.append(row);
      total += p[s.key] || 0;
    }
    if (this.stacked && this.opts.series.length > 1) {
      const row = document.createElement("div");
      const b = document.createElement("b");
      b.textContent = `${this.fmt(total)} ${this.opts.unit}`.trim();
      row.append("total", b);
      t.append(row);
    }
    t.hidden = false;
    const r = this.canvas.getBoundingClientRect();
    const tw = t.offsetWidth;
    const left = r.left + x + 14 + tw > innerWidth ? r.left + x - 14 - tw : r.left + x + 14;
    t.style.left = `${left}px`;
    t.style.top = `${r.top + 8}px`;
  }
}

/** rgb(…)/#rrggbb → rgba with alpha. */
function withAlpha(color, a) {
  const m = color.match(/^#([0-9a-f]{6})$/i);
  if (m) {
    const n = parseInt(m[1], 16);
    return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
  }
  const r = color.match(/^rgba?\(([^)]+)\)$/);
  if (r) {
    const [cr, cg, cb] = r[1].split(",").map((s) => s.trim());
    return `rgba(${cr}, ${cg}, ${cb}, ${a})`;
  }
  return color;
}
