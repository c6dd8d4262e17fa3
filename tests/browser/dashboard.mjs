// Headless check of the kvplane dashboard (driven by tests/system/dashboard.rs).
//
//   node dashboard.mjs <base-url> <screenshot.png> '<expectations JSON>'
//
// Loads the page in Debian's Chromium (playwright-core, no browser download), checks that the
// totals, the workers and the charts show, that filtering and selecting work, runs /health
// through the form and its confirmation modal, checks the answer is shown, and saves a
// screenshot. Fails on any console error, page error (a CSP violation included) or request
// that leaves the base origin. Prints a JSON report as its last line; exits 1 on failure.

import { inBrowser, openPage, reporter } from "./harness.mjs";

const [base, shot, expectJson] = process.argv.slice(2);
if (!base || !shot || !expectJson) {
  console.error("usage: node dashboard.mjs <base-url> <screenshot.png> '<expectations JSON>'");
  process.exit(2);
}
const expect = JSON.parse(expectJson);
const { report, check } = reporter("browser");

await inBrowser({ base, report, failureName: `kvplane-dashboard-failure-${process.pid}.png` }, async (page) => {
  // 1. Load with a fast poll so the charts fill within seconds.
  await openPage(page, base, check);

  // 2. Totals and workers.
  await page.waitForFunction((n) => document.querySelector('[data-k="workers"]')?.textContent.replace(/,/g, "") === String(n), expect.workers);
  check(true, `workers total shows ${expect.workers}`);
  // The charts start from the server's history: more points than the page has polled.
  const first = await page.evaluate(() => ({ polls: window.kvplane.state.polls, points: Number(document.getElementById("chart-ingest").dataset.points) }));
  check(first.points >= expect.min_history_points && first.points > first.polls, `charts have data on first paint (${first.points} points after ${first.polls} polls)`);
  const instances = (await page.textContent('[data-k="instances"]')).replace(/,/g, "");
  check(instances === String(expect.instances), `instances total shows ${expect.instances} (got ${instances})`);
  const keys = await page.textContent('[data-k="keys"]');
  check(keys !== "–" && keys !== "0", `keys total shows (${keys})`);
  const rowsAre = (n) => Number(document.getElementById("grid").getAttribute("aria-rowcount")) - 1 === n;
  await page.waitForFunction(rowsAre, expect.workers);
  const domRows = await page.$$eval("#grid-body .grid-row:not([hidden])", (els) => els.length);
  check(domRows > 0 && domRows <= Math.min(expect.workers, 60), `the grid has ${expect.workers} rows, ${domRows} of them in the DOM`);
  const statuses = await page.$$eval("#grid-body .grid-row:not([hidden]) .c-status", (els) => els.map((e) => e.textContent.trim()));
  check(statuses.includes("active") && statuses.includes("warning") && statuses.includes("inactive"), `status colours: ${[...new Set(statuses)].join(", ")}`);
  const silent = await page.evaluate(([inst, id]) => {
    const w = window.kvplane.state.workers.find((x) => x.instance_id === inst && x.worker_id === id);
    return w && { status: w.status, heartbeated: w.heartbeated };
  }, expect.silent_active);
  check(silent && silent.status === "active" && !silent.heartbeated, `a worker that never heartbeats but sends ops is active (${JSON.stringify(silent)})`);
  const rule = await page.textContent("#status-rule");
  check(/last contact/.test(rule) && /5m 00s/.test(rule), `the status rule comes from the server (${rule})`);
  const regLabel = await page.$$eval("#grid-body .grid-row:not([hidden]) .c-hb .reg", (els) => els.length);
  check(regLabel >= 1, `workers that never heartbeated are labelled (${regLabel})`);
  const syncBars = await page.$$eval("#sync-list li .bar", (els) => els.length);
  check(syncBars >= 1, `full-sync progress bars (${syncBars})`);

  // 3. Charts have data points and a non-zero ingest rate.
  await page.waitForFunction(() => Number(document.getElementById("chart-ingest").dataset.points) >= 8, null, { timeout: 30000 });
  const points = await page.$eval("#chart-ingest", (c) => Number(c.dataset.points));
  const lookupPoints = await page.$eval("#chart-lookups", (c) => Number(c.dataset.points));
  check(points >= 8 && lookupPoints >= 8, `charts have data (${points} ingest, ${lookupPoints} lookup points)`);
  await page.waitForFunction(() => {
    const v = document.querySelector('[data-k="ingest"]').textContent;
    return v !== "–" && v !== "0";
  });
  check(true, `ingest rate shows ${await page.textContent('[data-k="ingest"]')} ops/s`);
  const aria = await page.getAttribute("#chart-ingest", "aria-label");
  check(/now admit/.test(aria), "the chart describes itself to screen readers");

  // 4. Filter, then clear it.
  await page.fill("#filter", expect.filter);
  await page.waitForFunction(rowsAre, expect.filter_rows);
  check(true, `filter "${expect.filter}" leaves ${expect.filter_rows} rows`);
  await page.fill("#filter", "");
  await page.waitForFunction(rowsAre, expect.workers);

  // 5. Sort by keys (descending) and check the order.
  await page.click('.grid-head button[data-sort="keys"]');
  const keyCol = await page.$$eval("#grid-body .grid-row:not([hidden])", (rows) => rows
    .map((r) => [Number(r.getAttribute("aria-rowindex")), Number(r.querySelector(".c-keys").textContent.replace(/,/g, ""))])
    .sort((a, b) => a[0] - b[0]).map((x) => x[1]));
  check(keyCol.every((v, i) => i === 0 || keyCol[i - 1] >= v), "sorting by keys orders the rows");
  await page.click('.grid-head button[data-sort="instance"]');

  // 6. Select a worker: the details panel shows it.
  const [selInst, selRank] = expect.select;
  await page.locator("#grid-body .grid-row:not([hidden])", { hasText: selInst }).filter({ has: page.locator(".c-wid", { hasText: new RegExp(`^${selRank}$`) }) }).first().click();
  await page.waitForFunction((inst) => document.querySelector("#details-body .d-title")?.textContent.startsWith(inst), selInst);
  const detailText = await page.textContent("#details-body");
  check(detailText.includes("LocalCPUBackend") && detailText.includes("Endpoint") && detailText.includes("Full sync"), "the details panel shows locations and endpoints");
  check(/LMCache wire0\.3\.12-0\.5\.6 · registers by request/.test(detailText), `the details panel names the worker's LMCache wire generation: ${detailText}`);

  // 7. /health through the form: prefill from the details, review, confirm, read the answer.
  await page.click('#details-body button:has-text("Check health")');
  const prefilled = await page.inputValue('#form-health input[name="instance_id"]');
  check(prefilled === expect.action_instance, `the health form is prefilled (${prefilled})`);
  await page.click('#form-health button[type="submit"]');
  await page.waitForSelector("#confirm[open]");
  const sent = JSON.parse(await page.textContent("#confirm-body"));
  check(sent.instance_id === expect.action_instance && Object.keys(sent).length === 1, `the modal shows the exact body ${JSON.stringify(sent)}`);
  check((await page.textContent("#confirm-route")) === "/health", "the modal names the route");
  await page.click("#confirm-send");
  await page.waitForSelector("#confirm-answer:not([hidden])");
  const answer = await page.textContent("#confirm-answer");
  const status = await page.getAttribute("#result", "data-status");
  report.action = { status: Number(status), answer: answer.slice(0, 400) };
  check(status === "200", `POST /health answered 200 (got ${status}: ${answer.slice(0, 200)})`);
  check(answer.includes("error_codes") && answer.includes(`${expect.action_workers}/${expect.action_workers} healthy`), "the modal shows the answer JSON and its summary");
  await page.click("#confirm-cancel");
  await page.waitForSelector("#confirm", { state: "hidden" });
  const last = await page.textContent("#result");
  check(last.includes("200 OK") && last.includes(`${expect.action_workers}/${expect.action_workers} healthy`), "the last answer stays under the form");

  // 8. A one-minute window with enough history, the ingest chart hovered (tooltip in the
  //    screenshot), the side column at its top; then the screenshot.
  await page.click('[data-window="60"]');
  await page.waitForFunction(() => Number(document.getElementById("chart-ingest").dataset.points) >= 70, null, { timeout: 60000 });
  await page.$eval(".col-side", (e) => { e.scrollTop = 0; });
  const box = await page.locator("#chart-ingest").boundingBox();
  await page.mouse.move(box.x + box.width * 0.72, box.y + box.height * 0.5);
  await page.waitForTimeout(400);
  await page.screenshot({ path: shot, fullPage: false });
  check(true, `screenshot saved to ${shot}`);
});
