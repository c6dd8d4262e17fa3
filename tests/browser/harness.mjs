// What the headless page checks share (dashboard.mjs, services.mjs): Debian's Chromium through
// playwright-core (no browser download), a report of the checks passed, the guard that fails a
// run on any console error, page error (a CSP violation included) or request that leaves the
// base origin, the first load of the page with its same-origin CSP, a screenshot of a failure,
// and the JSON report printed as the last line with the exit code (1 on failure). It checks
// nothing of a page itself.

import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** The bound of one browser step, in milliseconds. */
export const STEP_MS = 20000;

/** A report (`extra` fields beside `ok` and `checks`), and `log` / `check` writing to it. */
export function reporter(label, extra = {}) {
  const report = { ok: false, ...extra, checks: [] };
  const log = (msg) => { report.checks.push(msg); console.log(`[${label}] ${msg}`); };
  const check = (cond, msg) => { if (!cond) throw new Error(`check failed: ${msg}`); log(`ok: ${msg}`); };
  return { report, log, check };
}

/** Loads `base` with a fast poll (the charts fill within seconds) and checks the answer and
 *  its same-origin CSP. */
export async function openPage(page, base, check) {
  const resp = await page.goto(`${base}/?interval=500`, { waitUntil: "load" });
  check(resp && resp.status() === 200, `GET / answered 200 (${resp && resp.status()})`);
  check((resp.headers()["content-security-policy"] || "").includes("connect-src 'self'"), "the page has a same-origin CSP");
  return resp;
}

/** Runs `body(page)` in a fresh headless Chromium, then prints `report` and exits. `onRequest`
 *  sees every request; a failure saves a screenshot named `failureName` in the temp dir. */
export async function inBrowser({ base, report, height = 900, failureName, failureFullPage = false, onRequest = () => {} }, body) {
  const origin = new URL(base).origin;
  const problems = [];
  const profile = mkdtempSync(join(tmpdir(), "kvplane-chromium-"));
  let context;
  let page;
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: "/usr/bin/chromium",
      headless: true,
      args: [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
      ],
      viewport: { width: 1440, height },
      deviceScaleFactor: 1,
      colorScheme: process.env.KVPLANE_COLOR_SCHEME === "light" ? "light" : "dark",
      timeout: STEP_MS,
    });
    context.setDefaultTimeout(STEP_MS);
    context.on("request", (req) => {
      const url = req.url();
      if (!url.startsWith(`${origin}/`) && !url.startsWith("data:")) problems.push(`request left the host: ${url}`);
      onRequest(req);
    });
    page = context.pages()[0] || (await context.newPage());
    page.on("console", (m) => { if (m.type() === "error") problems.push(`console error: ${m.text()}`); });
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    await body(page);
    if (problems.length) throw new Error(problems.join("\n"));
    report.ok = true;
  } catch (e) {
    report.error = String(e && e.stack ? e.stack : e);
    if (problems.length) report.problems = problems;
    console.error(report.error);
    if (page) {
      const failed = join(tmpdir(), failureName);
      await page.screenshot({ path: failed, fullPage: failureFullPage }).then(() => console.error(`screenshot of the failure: ${failed}`), () => {});
    }
  } finally {
    if (context) await context.close().catch(() => {});
    rmSync(profile, { recursive: true, force: true });
  }
  console.log(JSON.stringify(report));
  process.exit(report.ok ? 0 : 1);
}
