// Headless check of a service's dashboard page (indexer, fleet, node), driven by
// tests/system/dashboard_services.rs:
//
//   node services.mjs <base-url> <page> <screenshot.png> '<expectations JSON>'
//
// Loads the page in Debian's Chromium (playwright-core, no browser download) and checks that
// its charts are drawn from the server's history on the first paint (more points than the
// page has polled), then what the page is for: the indexer's publisher table and its query
// box (a same-origin JSON POST to /query, whose per-tier answer is shown), the fleet's
// servers and a tenant against its quota, the node's tier usage. Saves a screenshot. Fails on
// any console error, page error (a CSP violation included) or request that leaves the base
// origin. Prints a JSON report as its last line; exits 1 on failure.

import { inBrowser, openPage, reporter, STEP_MS } from "./harness.mjs";

const [base, kind, shot, expectJson] = process.argv.slice(2);
if (!base || !kind || !shot || !expectJson) {
  console.error("usage: node services.mjs <base-url> <indexer|indexer-replica|fleet|node|controller-cluster> <screenshot.png> '<expectations JSON>'");
  process.exit(2);
}
const expect = JSON.parse(expectJson);
const origin = new URL(base).origin;
const { report, check } = reporter(`browser:${kind}`, { page: kind });
const posts = [];
const num = (s) => Number(String(s).replace(/,/g, ""));

/** Waits until canvas `id` has at least `n` points in its window. */
async function points(page, id, n, timeout = STEP_MS) {
  await page.waitForFunction(([c, k]) => Number(document.getElementById(c)?.dataset.points) >= k, [id, n], { timeout });
  return page.$eval(`#${id}`, (c) => Number(c.dataset.points));
}

/** The charts start from the server's history: more points than polls on the first paint. */
async function fromHistory(page, ids) {
  await page.waitForFunction(() => window.kvplane && window.kvplane.live.polls >= 1);
  const got = await page.evaluate((cs) => ({
    polls: window.kvplane.live.polls,
    points: cs.map((c) => Number(document.getElementById(c).dataset.points)),
  }), ids);
  for (const [i, id] of ids.entries()) {
    check(got.points[i] >= expect.min_history_points && got.points[i] > got.polls,
      `#${id} has ${got.points[i]} points from the server's history after ${got.polls} poll(s)`);
  }
}

async function indexerPage(page) {
  await fromHistory(page, ["chart-ingest", "chart-blocks"]);
  const row = page.locator("#publishers tbody tr", { hasText: expect.endpoint });
  await row.waitFor();
  const text = await row.textContent();
  check(text.includes("connected") && text.includes(expect.instance), `the publisher table shows ${expect.endpoint}: ${text.replace(/\s+/g, " ").slice(0, 160)}`);
  const lastSeq = await row.locator("td").nth(2).textContent();
  check(lastSeq !== "—" && num(lastSeq) >= 0, `its last sequence number shows (${lastSeq})`);
  const gpu = await row.locator("td").nth(7).textContent();
  check(num(gpu.replace(/k$/, "")) > 0, `its GPU blocks show (${gpu})`);
  const kpi = await page.textContent('[data-k="publishers"]');
  check(kpi === "1", `publishers total shows 1 (${kpi})`);
  await points(page, "chart-ingest", 4);

  // The query box: the form starts from the registered service; paste tokens, query.
  const model = await page.inputValue('#query-form input[name="model"]');
  const bs = await page.inputValue('#query-form input[name="block_size"]');
  check(model === expect.model && bs === String(expect.block_size), `the form is prefilled from the service (${model}, block size ${bs})`);
  await page.fill("#token-ids", expect.tokens);
  const count = await page.textContent("#token-count");
  check(count.includes(`${expect.blocks} complete blocks`), `the token count shows (${count})`);
  await page.click("#query-send");
  await page.waitForSelector("#query-answer:not([hidden])");
  const status = await page.getAttribute("#query-answer", "data-status");
  const answer = await page.textContent("#query-answer");
  check(status === "200", `POST /query answered 200 (${status}: ${answer.slice(0, 200)})`);
  const cells = await page.$$eval("#answer-table tbody tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent.trim())));
  report.answer = cells;
  const mine = cells.find((c) => c[1] === expect.instance);
  // The answer counts tokens (the Conductor API's unit), whole blocks only.
  const matched = expect.blocks * expect.block_size;
  check(mine && mine[2] === `${matched} / ${matched}` && mine[3] === String(matched) && mine[6].includes(`rank 0: ${matched}`),
    `the answer shows ${expect.instance}: ${matched} tokens (${expect.blocks} blocks) matched, on GPU, rank 0 (${JSON.stringify(mine)})`);
  const post = posts.find((p) => p.url.endsWith("/query"));
  check(post && post.type.startsWith("application/json") && (!post.origin || post.origin === origin), `the query went out as same-origin JSON (${JSON.stringify(post)})`);

  // A prefix the index has only partly: the first block of the chain, then unknown tokens.
  await page.fill("#token-ids", expect.partial_tokens);
  await page.click("#query-send");
  await page.waitForFunction((n) => [...document.querySelectorAll("#answer-table tbody tr td:nth-child(3)")].some((td) => td.textContent.startsWith(`${n} /`)), expect.partial_blocks * expect.block_size);
  check(true, `a partial prefix shows ${expect.partial_blocks} matched block(s)`);
  // Bad input is refused in the page, before any request.
  const before = posts.length;
  await page.fill("#token-ids", "1, 2, x");
  await page.click("#query-send");
  await page.waitForFunction(() => document.getElementById("query-error").textContent.includes("not an integer"));
  check(posts.length === before, "a bad token id is refused in the page, no request sent");
  await page.fill("#token-ids", expect.tokens);
  await page.click("#query-send");
  await page.waitForFunction(() => document.querySelector("#query-answer")?.dataset.status === "200" && !!document.getElementById("answer-table"));
}

// A read replica (docs/CLUSTER.md): no publishers of its own; its role and lag show where the
// publishers would, and the query box answers from the index it follows.
async function replicaPage(page) {
  await page.waitForFunction(() => document.querySelector('[data-k="publishers"]')?.textContent === "replica");
  const sub = await page.textContent('[data-k="publishers-sub"]');
  check(sub.includes("caught up") && sub.includes("pending"), `the replica's state shows (${sub})`);
  const empty = await page.textContent("#publishers tbody tr");
  check(empty.includes("read replica"), `the publisher table says why it is empty (${empty})`);
  await page.fill('#query-form input[name="model"]', expect.model);
  await page.fill('#query-form input[name="block_size"]', String(expect.block_size));
  await page.fill("#token-ids", expect.tokens);
  await page.click("#query-send");
  await page.waitForSelector("#query-answer:not([hidden])");
  const status = await page.getAttribute("#query-answer", "data-status");
  check(status === "200", `POST /query to the replica answered 200 (${status})`);
  await page.waitForSelector("#answer-table");
  const cells = await page.$$eval("#answer-table tbody tr", (rows) => rows.map((r) => [...r.cells].map((c) => c.textContent.trim())));
  const matched = expect.blocks * expect.block_size;
  const mine = cells.find((c) => c[1] === expect.instance);
  check(mine && mine[3] === String(matched), `the replica's answer shows ${expect.instance} with ${matched} tokens on GPU (${JSON.stringify(mine)})`);
}

async function fleetPage(page) {
  await fromHistory(page, ["chart-tenants", "chart-quota", "chart-evictions"]);
  const server = page.locator("#servers tbody tr", { hasText: expect.instance });
  await server.waitFor();
  const stext = (await server.textContent()).replace(/\s+/g, " ");
  check(/\d+s ago/.test(stext), `the servers table shows ${expect.instance} with its heartbeat age (${stext.slice(0, 140)})`);
  const tenant = page.locator("#tenants tbody tr", { hasText: expect.tenant });
  await tenant.waitFor();
  const ttext = (await tenant.textContent()).replace(/\s+/g, " ");
  check(ttext.includes(expect.quota_text), `the tenants table shows ${expect.tenant} against its quota ${expect.quota_text} (${ttext})`);
  await tenant.click();
  await page.waitForFunction((t) => document.getElementById("quota-tenant").textContent === t, expect.tenant);
  const legend = await page.textContent("#legend-quota");
  check(legend.includes("usage") && legend.includes("quota"), `the usage-vs-quota chart draws ${expect.tenant}'s usage and quota (${legend})`);
  const history = await page.evaluate((t) => window.kvplane.gauges.points.filter((p) => p[`quota:${t}`] > 0 && p[`usage:${t}`] > 0).length, expect.tenant);
  check(history >= expect.min_history_points, `${history} points of ${expect.tenant}'s usage and quota over time`);
  const over = await page.textContent('[data-k="over"]');
  check(num(over) >= 1, `a tenant past its watermark is counted (${over})`);
  await page.waitForFunction(() => Number(document.querySelector('[data-k="dispatched"]').textContent) >= 1, null, { timeout: 30000 });
  check(true, `evictions dispatched show ${await page.textContent('[data-k="dispatched"]')}`);
  await points(page, "chart-evictions", 4);
}

async function nodePage(page) {
  await fromHistory(page, ["chart-bytes", "chart-objects", "chart-gets", "chart-evictions"]);
  const l1 = await page.textContent('[data-k="l1"]');
  check(/[KMG]iB$/.test(l1), `L1 usage shows (${l1})`);
  const l2 = await page.textContent('[data-k="l2"]');
  check(/[KMG]iB$/.test(l2), `L2 usage shows (${l2})`);
  await page.waitForFunction(() => /%$/.test(document.querySelector('[data-k="hitrate"]').textContent));
  check(true, `the GET hit rate shows ${await page.textContent('[data-k="hitrate"]')}`);
  const tiers = await page.$$eval("#tiers tbody tr", (rows) => rows.map((r) => r.textContent));
  check(tiers.length === 2 && tiers[0].startsWith("L1") && tiers[1].startsWith("L2"), "the tier table has L1 and L2");
  const cols = await page.$$eval("#tiers thead th", (ths) => ths.map((t) => t.textContent));
  check(cols.includes("Pinned"), `the tier table has a Pinned column (${cols.join(", ")})`);
  const pinned = await page.$$eval("#tiers tbody tr", (rows) => rows.map((r) => r.lastElementChild.textContent));
  check(pinned.length === 2 && pinned.every((p) => /^\d+$/.test(p)), `each tier shows its pinned objects (${pinned})`);
  await page.waitForFunction(() => document.querySelectorAll("#commands tbody tr").length >= 1);
  const cmds = await page.$$eval("#commands tbody tr", (rows) => rows.map((r) => r.textContent));
  check(cmds.length >= 1, `the controller's commands panel shows (${cmds.join(" | ")})`);
  const ev = await page.textContent('[data-k="evictions"]');
  check(num(ev) >= 1, `evictions show (${ev})`);
  const bytes = await page.evaluate(() => window.kvplane.gauges.points.filter((p) => p.l1_bytes > 0 && p.l2_bytes > 0).length);
  check(bytes >= expect.min_history_points, `${bytes} points of L1 and L2 bytes over time`);
}

/** The controller's page of a --cluster member: the topbar names its role. */
async function controllerClusterPage(page) {
  await page.waitForFunction((role) => document.getElementById("cluster")?.dataset.role === role, expect.role);
  const badge = await page.textContent("#cluster");
  for (const part of expect.badge) check(badge.includes(part), `the topbar shows "${part}" (${badge})`);
  await page.waitForFunction((n) => document.querySelectorAll("#grid-body .grid-row").length >= n, expect.rows);
  check(true, `the worker table lists the followed workers`);
}

/** Every request other than a GET, for the checks that the pages send none but /query. */
function recordPosts(req) {
  if (req.method() !== "GET") {
    const hd = req.headers();
    posts.push({ url: req.url(), method: req.method(), type: hd["content-type"] || "", origin: hd.origin || "" });
  }
}

const run = {
  base, report, height: expect.height || 900, onRequest: recordPosts,
  failureName: `kvplane-${kind}-failure-${process.pid}.png`, failureFullPage: true,
};
await inBrowser(run, async (page) => {
  await openPage(page, base, check);
  const title = await page.title();
  check(title.includes(expect.title), `the page is the ${kind} page (${title})`);

  if (kind === "indexer") await indexerPage(page);
  else if (kind === "indexer-replica") await replicaPage(page);
  else if (kind === "fleet") await fleetPage(page);
  else if (kind === "node") await nodePage(page);
  else if (kind === "controller-cluster") await controllerClusterPage(page);
  else throw new Error(`unknown page ${kind}`);

  const mutating = posts.filter((p) => !p.url.endsWith("/query"));
  check(mutating.length === 0, `the page sent no other request than GETs${kind.startsWith("indexer") ? " and /query" : ""} (${JSON.stringify(mutating)})`);
  await page.waitForTimeout(300);
  await page.screenshot({ path: shot, fullPage: !!expect.full_page });
  check(true, `screenshot saved to ${shot}`);
});
