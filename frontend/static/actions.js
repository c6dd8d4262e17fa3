// Orchestration actions: the Health / Clear / Pin / Move forms, the confirmation modal that
// shows exactly what will be sent, the API token (sessionStorage, sent as a Bearer token) and
// the answer (JSON, or the error `detail`).

import { h, prettyJson } from "./format.js";

const TOKEN_KEY = "kvplane.apiToken";
const REQUEST_TIMEOUT_MS = 60000;
const REASONS = {
  200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
  405: "Method Not Allowed", 409: "Conflict", 422: "Unprocessable Entity", 500: "Internal Server Error",
  502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
};
const HINTS = {
  401: "The server requires an API token: set it with the API token button at the top right.",
  403: "The API token was refused.",
  404: "Unknown instance, worker or location.",
  422: "The request body was refused; the detail names the field.",
  504: "A worker did not answer in time.",
};

const $ = (id) => document.getElementById(id);

export function token() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch { return ""; }
}

function setToken(v) {
  try {
    if (v) sessionStorage.setItem(TOKEN_KEY, v);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch { /* storage disabled: the token lives for this page only */ }
  showTokenState();
}

function showTokenState() {
  const set = Boolean(token());
  $("token-btn").dataset.set = String(set);
  $("token-label").textContent = set ? "Token set" : "API token";
}

/** Token ids from "1, 2 3" or "[1,2,3]"; throws with a message naming the bad entry. */
export function parseTokens(text) {
  const parts = text.replace(/[[\]]/g, " ").split(/[\s,]+/).filter(Boolean);
  return parts.map((p) => {
    if (!/^-?\d+$/.test(p)) throw new Error(`“${p.length > 20 ? `${p.slice(0, 20)}…` : p}” is not an integer token id`);
    const n = Number(p);
    if (!Number.isSafeInteger(n)) throw new Error(`${p} is out of range`);
    return n;
  });
}

/** The JSON body each form sends (LMCache's request shapes). */
const BUILD = {
  "/health": (f) => ({ instance_id: f.instance_id }),
  "/clear": (f) => ({ instance_id: f.instance_id, location: f.location }),
  "/pin": (f) => ({ instance_id: f.instance_id, location: f.location, tokens: parseTokens(f.tokens) }),
  "/move": (f) => ({
    old_position: [f.old_instance, f.old_location],
    new_position: [f.new_instance, f.new_location],
    tokens: parseTokens(f.tokens || ""),
    should_copy: f.should_copy,
  }),
};

export class Actions {
  /** @param {{workersOf: (instance: string) => number}} ctx */
  constructor(ctx) {
    this.ctx = ctx;
    this.tabs = [...document.querySelectorAll(".actions [role=tab]")];
    this.tabs.forEach((t, i) => {
      t.addEventListener("click", () => this.showTab(t.id.slice(4)));
      t.addEventListener("keydown", (e) => {
        const d = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
        if (!d) return;
        const next = this.tabs[(i + d + this.tabs.length) % this.tabs.length];
        this.showTab(next.id.slice(4));
        next.focus();
      });
    });
    for (const form of document.querySelectorAll(".action-form")) {
      form.addEventListener("submit", (e) => { e.preventDefault(); this.review(form); });
      form.addEventListener("input", (e) => {
        e.target.removeAttribute("aria-invalid");
        e.target.closest(".field")?.querySelector(".err")?.remove();
        if (e.target.tagName === "TEXTAREA") this.countTokens(e.target);
      });
    }
    $("token-btn").addEventListener("click", () => {
      $("token-input").value = token();
      $("token-dialog").showModal();
      $("token-input").focus();
    });
    $("token-dialog").addEventListener("close", () => {
      const v = $("token-dialog").returnValue;
      if (v === "save") setToken($("token-input").value.trim());
      if (v === "clear") setToken("");
      $("token-input").value = "";
    });
    showTokenState();
  }

  showTab(name) {
    for (const t of this.tabs) {
      const on = t.id === `tab-${name}`;
      t.setAttribute("aria-selected", String(on));
      t.tabIndex = on ? 0 : -1;
      $(t.getAttribute("aria-controls")).hidden = !on;
    }
  }

  /** Prefills a form from the details panel and shows it. */
  prefill(name, values) {
    this.showTab(name);
    const form = $(`form-${name}`);
    for (const [k, v] of Object.entries(values)) {
      const input = form.elements.namedItem(k);
      if (input) input.value = v;
    }
    const first = [...form.querySelectorAll("input, textarea")].find((i) => !i.value) || form.querySelector("button[type=submit]");
    first.focus();
  }

  countTokens(area) {
    const label = document.querySelector(`[data-count-for="${area.id}"]`);
    if (!label) return;
    try {
      const n = parseTokens(area.value).length;
      label.textContent = n ? `${n} token${n === 1 ? "" : "s"}` : "";
    } catch { label.textContent = ""; }
  }

  fieldError(input, message) {
    input.setAttribute("aria-invalid", "true");
    const field = input.closest(".field");
    field?.querySelector(".err")?.remove();
    const id = `${input.name}-${input.form.id}-err`;
    field?.append(h("span", { class: "err", id, text: message }));
    input.setAttribute("aria-describedby", id);
  }

  /** Validates, shows the confirmation modal, and sends on confirmation. */
  review(form) {
    const route = form.dataset.route;
    const values = {};
    let bad = null;
    for (const el of form.elements) {
      if (!el.name) continue;
      if (el.type === "checkbox") { values[el.name] = el.checked; continue; }
      values[el.name] = el.value.trim();
      if (el.required && !values[el.name]) { this.fieldError(el, "Required"); bad ||= el; }
    }
    let body;
    if (!bad) {
      try { body = BUILD[route](values); } catch (e) {
        const area = form.querySelector("textarea");
        this.fieldError(area, e.message);
        bad = area;
      }
    }
    if (bad) { bad.focus(); return; }

    this.confirm(form, route, body);
  }

  /** The confirmation modal: exactly what will be sent; on Send, the answer in place. */
  confirm(form, route, body) {
    const dlg = $("confirm");
    const danger = form.dataset.danger === "true";
    $("confirm-title").textContent = "Send this request?";
    $("confirm-route").textContent = route;
    $("confirm-body").textContent = prettyJson(body);
    const inst = body.instance_id ?? body.old_position?.[0];
    const n = this.ctx.workersOf(inst);
    const sub = $("confirm-sub");
    const who = n ? `${n} worker${n === 1 ? "" : "s"} of ${inst}` : `instance ${inst} (no registered worker: expect a 404)`;
    const what = { "/health": "Probes", "/clear": "Clears the location on", "/pin": "Pins the tokens on", "/move": body.should_copy ? "Copies the tokens from" : "Moves the tokens from" }[route];
    const where = route === "/move" ? ` to ${body.new_position[0]} (${body.new_position[1]})` : "";
    sub.textContent = `${what} ${who}${where}.`;
    sub.classList.toggle("warn", danger);
    $("confirm-auth").textContent = token() ? "Authorization: Bearer •••••• (the token saved in this tab)" : "No API token set: sent without Authorization.";
    const answer = $("confirm-answer");
    answer.hidden = true;
    answer.replaceChildren();
    const send = $("confirm-send");
    const cancel = $("confirm-cancel");
    send.hidden = false;
    send.disabled = false;
    send.className = `btn ${danger ? "btn-danger" : "btn-primary"}`;
    send.textContent = `Send ${route}`;
    cancel.textContent = "Cancel";
    dlg.dataset.state = "confirm";
    $("confirm-form").onsubmit = (e) => {
      if (e.submitter?.value !== "send") return; // Cancel / Close: the dialog closes
      e.preventDefault();
      if (dlg.dataset.state !== "confirm") return;
      dlg.dataset.state = "sending";
      send.disabled = true;
      send.textContent = "Sending…";
      this.send(route, body).then((res) => {
        this.showLast(route, res);
        if (!dlg.open) return;
        dlg.dataset.state = "answered";
        $("confirm-title").textContent = res.ok ? "Done" : "The request failed";
        answer.replaceChildren(...this.answerNodes(route, res, true));
        answer.hidden = false;
        send.hidden = true;
        cancel.textContent = "Close";
        cancel.focus();
      });
    };
    dlg.onclose = () => { form.querySelector("button[type=submit]").focus({ preventScroll: true }); };
    dlg.showModal();
  }

  /** POSTs `body`; resolves to {ok, status, json, text, error, ms} (never rejects). */
  async send(route, body) {
    const headers = { "Content-Type": "application/json", Accept: "application/json" };
    if (token()) headers.Authorization = `Bearer ${token()}`;
    const started = performance.now();
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), REQUEST_TIMEOUT_MS);
    const res = { ok: false, status: 0, json: null, text: "", error: null, ms: 0 };
    try {
      const resp = await fetch(route, { method: "POST", headers, body: JSON.stringify(body), signal: ctl.signal, cache: "no-store" });
      res.status = resp.status;
      res.ok = resp.ok;
      res.text = await resp.text();
      try { res.json = res.text ? JSON.parse(res.text) : null; } catch { /* not JSON: shown raw */ }
    } catch (e) {
      res.error = e.name === "AbortError" ? `no answer within ${REQUEST_TIMEOUT_MS / 1000} s` : `network error: ${e.message}`;
    } finally {
      clearTimeout(timer);
    }
    res.ms = Math.round(performance.now() - started);
    return res;
  }

  /** Status line, then the detail or summary, then (when `full`) the JSON answer. */
  answerNodes(route, res, full) {
    const code = res.error ? "failed" : `${res.status} ${REASONS[res.status] || ""}`.trim();
    const summary = res.ok ? summarize(route, res.json) : "";
    const nodes = [h("div", { class: "result-head" },
      h("span", { class: `code-status ${res.ok ? "code-ok" : "code-err"}`, text: code }),
      h("code", { text: `POST ${route}` }),
      summary ? h("span", { class: "result-summary", title: summary, text: summary }) : null,
      h("span", { class: "ms", text: `${res.ms} ms` }))];
    if (res.error) nodes.push(h("p", { class: "result-detail", text: res.error }));
    else if (!res.ok) {
      const d = res.json?.detail;
      nodes.push(h("p", { class: "result-detail", text: d != null ? (typeof d === "string" ? d : JSON.stringify(d)) : res.text || "(empty answer)" }));
      if (HINTS[res.status]) nodes.push(h("p", { class: "result-hint", text: HINTS[res.status] }));
    }
    if (full && !res.error) nodes.push(h("pre", { class: "code", tabindex: "0", "aria-label": "Answer", text: res.json != null ? prettyJson(res.json) : res.text || "(empty)" }));
    return nodes;
  }

  /** The compact last answer under the forms, with the JSON one click away. */
  showLast(route, res) {
    const box = $("result");
    const nodes = this.answerNodes(route, res, false);
    if (!res.error) {
      nodes.push(h("details", null, h("summary", { text: "Answer JSON" }),
        h("pre", { class: "code", tabindex: "0", text: res.json != null ? prettyJson(res.json) : res.text || "(empty)" })));
    }
    box.dataset.status = String(res.status);
    box.replaceChildren(...nodes);
    box.hidden = false;
  }
}

function summarize(route, json) {
  if (!json) return "";
  if (route === "/health" && json.error_codes && typeof json.error_codes === "object") {
    const codes = Object.entries(json.error_codes);
    if (!codes.length) return "No worker answered (unknown instance?).";
    const bad = codes.filter(([, c]) => c !== 0);
    return bad.length
      ? `${bad.length}/${codes.length} unhealthy: ${bad.map(([w, c]) => `rank ${w} → ${c}`).join(", ")}`
      : `✓ ${codes.length}/${codes.length} healthy`;
  }
  if (typeof json.num_tokens === "number") return `num_tokens: ${json.num_tokens}`;
  return "";
}
