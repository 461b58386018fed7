// Drives the Sluice console in Debian's headless Chromium, as a person
// would: sign in, deploy word count, start it, push lines, watch the charts
// and the output tail, compare a new version and upgrade to it (with
// --upgrade-wasm), pause it; another tenant's pipelines stay hidden.
//
//   node console.mjs --url URL --token TOKEN --wasm WASM --other OTHER_PIPELINE \
//       --out-dir OUT_DIR [--admin-token ADMIN_TOKEN] [--upgrade-wasm WASM]
//
// Exits 0 when every check passed; screenshots go to OUT_DIR, an absolute
// path outside this directory (tests/e2e/console.rs passes
// $CARGO_TARGET_TMPDIR/console-screenshots). The arguments are named: when
// they were positional, a mixed-up call took the admin token for OUT_DIR
// and wrote a screenshot into tests/browser/<token>/.
import { mkdirSync, statSync } from "node:fs";
import { dirname, isAbsolute, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const usage =
  "usage: node console.mjs --url URL --token TOKEN --wasm WASM --other OTHER_PIPELINE " +
  "--out-dir OUT_DIR [--admin-token ADMIN_TOKEN] [--upgrade-wasm WASM]";
function refuse(why) {
  console.error(`console.mjs: ${why}\n${usage}`);
  process.exit(2);
}

let args;
try {
  args = parseArgs({
    options: {
      url: { type: "string" },
      token: { type: "string" },
      wasm: { type: "string" },
      other: { type: "string" },
      "out-dir": { type: "string" },
      "admin-token": { type: "string" },
      "upgrade-wasm": { type: "string" },
    },
    strict: true,
    allowPositionals: false,
  }).values;
} catch (e) {
  refuse(e.message);
}
for (const name of ["url", "token", "wasm", "other", "out-dir"]) {
  if (!args[name]) refuse(`--${name} is missing`);
}
const { url, token, wasm, other } = args;
const out = args["out-dir"];
const adminToken = args["admin-token"];
const upgradeWasm = args["upgrade-wasm"];
if (!/^https?:\/\//.test(url)) refuse(`--url must be an http(s) URL, not ${JSON.stringify(url)}`);
// The screenshots' directory: absolute (not relative to wherever node runs),
// not in this script's directory (where a stray one would be committed), and
// not named after a token (arguments mixed up).
if (!isAbsolute(out)) refuse(`--out-dir must be an absolute path, not ${JSON.stringify(out)}`);
const here = dirname(fileURLToPath(import.meta.url));
const inside = relative(here, resolve(out));
if (!inside.startsWith("..") && !isAbsolute(inside)) {
  refuse(`--out-dir ${out} is inside ${here}: screenshots belong under the test's scratch directory`);
}
if ([token, adminToken].some((t) => t && t.length >= 8 && out.includes(t))) {
  refuse(`--out-dir ${out} contains a token: are the arguments mixed up?`);
}
let kind = null;
try {
  kind = statSync(out);
} catch {
  // Created below.
}
if (kind && !kind.isDirectory()) refuse(`--out-dir ${out} exists and is not a directory`);
mkdirSync(out, { recursive: true });
// Loaded after the arguments are checked: a bad call is refused even where
// playwright-core is not installed.
const { chromium } = await import("playwright-core");

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const failures = [];
let page = null;
try {
  page = await browser.newPage({ viewport: { width: 1360, height: 900 } });
  page.on("pageerror", (e) => failures.push(`page error: ${e.message}`));
  // A 503 is the API's answer to a request for a pipeline in the middle of
  // its upgrade (`upgrading`, documented; the console asks again at its next
  // poll); the browser logs the response as an error of its own. Anything
  // else fails.
  const upgrading = (text) => text.includes("status of 503");
  page.on("console", (m) => {
    if (m.type() === "error" && !upgrading(m.text())) failures.push(`console: ${m.text()}`);
  });
  page.setDefaultTimeout(30_000);
  const step = (what) => console.log(`console test: ${what}`);

  step("sign in");
  await page.goto(url + "/");
  await page.fill("input[name=token]", token);
  await page.click("button[type=submit]");
  await page.waitForSelector("#pipelines");
  await page.screenshot({ path: `${out}/1-pipelines.png`, fullPage: true });

  step("the other tenant's pipelines are not shown");
  const html = await page.content();
  if (html.includes(other)) failures.push(`another tenant's pipeline "${other}" is on the page`);

  step("deploy word count");
  await page.setInputFiles("input[name=component]", wasm);
  await page.fill("#deploy input[name=name]", "wc");
  await page.fill("#deploy input[name=workers]", "2");
  await page.click("#deploy button[type=submit]");
  await page.waitForSelector("tr[data-pipeline=wc]");
  await page.waitForSelector("tr[data-pipeline=wc] td[data-state=running], tr[data-pipeline=wc] td[data-state=idle]");
  await page.screenshot({ path: `${out}/2-deployed.png`, fullPage: true });

  step("open it and start it");
  await page.click("tr[data-pipeline=wc] a");
  await page.waitForSelector("#state");
  await page.click("h2 [data-action=start]");

  step("push lines");
  const lines = [];
  for (let i = 0; i < 40; i++) lines.push(JSON.stringify(`hello world ${i % 5} sluice console`));
  await page.waitForSelector("#push-port option", { state: "attached" });
  await page.fill("#push-text", lines.join("\n") + "\n");
  await page.click("#push button[type=submit]");
  await page.waitForSelector(".message.info");

  step("the figures, the charts and the output tail follow");
  await page.waitForFunction(() => Number(document.getElementById("fig-in")?.textContent) >= 40);
  await page.waitForFunction(() => document.getElementById("tail")?.textContent.includes('"hello"'));
  // A second push, so the rate chart has a point with input after a point without.
  await page.fill("#push-text", lines.join("\n") + "\n");
  await page.click("#push button[type=submit]");
  await page.waitForFunction(() => Number(document.getElementById("fig-in")?.textContent) >= 80);
  await page.waitForFunction(() => Number(document.querySelector(".chart")?.dataset.samples) >= 3);
  await page.waitForFunction(() => document.getElementById("tail").textContent.includes('"word":"hello","count":80'));
  const workers = await page.$$eval("#workers tbody tr", (rows) => rows.length);
  if (workers !== 2) failures.push(`the workers table has ${workers} rows, not 2`);
  await page.screenshot({ path: `${out}/3-pipeline.png`, fullPage: true });

  if (upgradeWasm) {
    step("compare a new version, then upgrade to it");
    await page.setInputFiles("#upgrade-file", upgradeWasm);
    await page.fill("#upgrade-name", "wc-v2");
    // The diff of a rebuild first: every operator rebuilt.
    await page.check("#upgrade-rebuild");
    await page.click("#upgrade-compare");
    await page.waitForSelector("#upgrade-diff tr[data-operator=counts][data-change=rebuilt]");
    if (!(await page.$("#upgrade-diff tr[data-operator=lengths][data-change=rebuilt]"))) {
      failures.push(`the rebuild's diff does not show lengths rebuilt: ${await page.textContent("#upgrade-diff")}`);
    }
    await page.uncheck("#upgrade-rebuild");
    await page.click("#upgrade-compare");
    await page.waitForSelector("#upgrade-diff tr[data-operator=counts][data-change=kept]");
    await page.waitForSelector("#upgrade-verdict[data-accepted=true]");
    for (const [op, change] of [["counts", "kept"], ["lengths", "new"]]) {
      if (!(await page.$(`#upgrade-diff tr[data-operator=${op}][data-change=${change}]`))) {
        failures.push(`the diff does not show ${op} as ${change}: ${await page.textContent("#upgrade-diff")}`);
      }
    }
    await page.screenshot({ path: `${out}/4-upgrade-diff.png`, fullPage: true });
    let asked = null;
    page.once("dialog", (d) => { asked = d.message(); d.accept(); });
    await page.click("#upgrade-go");
    await page.waitForSelector("text=Upgraded wc to wc-v2.");
    if (!asked || !asked.includes("wc-v2")) failures.push(`the upgrade did not ask first (${asked})`);
    await page.waitForSelector("#state[data-state=running], #state[data-state=idle]");
    await page.fill("#push-text", lines.join("\n") + "\n");
    await page.click("#push button[type=submit]");
    await page.waitForSelector("text=Appended 40 events.");
    // Counted since the new version opened: the 40 lines just pushed.
    await page.waitForFunction(() => Number(document.getElementById("fig-in")?.textContent) === 40);
  }

  step("pause it");
  await page.click("h2 [data-action=pause]");
  await page.waitForSelector("#state[data-state=paused]");
  await page.screenshot({ path: `${out}/5-paused.png`, fullPage: true });

  step("back to the list");
  await page.click("text=← Pipelines");
  await page.waitForSelector("tr[data-pipeline=wc] td[data-state=paused]");
  if ((await page.content()).includes(other)) failures.push(`another tenant's pipeline "${other}" is on the list`);

  if (adminToken) {
    step("the admin's view");
    const admin = await browser.newPage({ viewport: { width: 1360, height: 700 } });
    admin.on("pageerror", (e) => failures.push(`admin page error: ${e.message}`));
    await admin.goto(url + "/");
    await admin.fill("input[name=token]", adminToken);
    await admin.click("button[type=submit]");
    await admin.waitForSelector("#tenants tr[data-tenant]");
    await admin.screenshot({ path: `${out}/6-admin.png`, fullPage: true });
  }
} catch (e) {
  failures.push(String(e && e.stack || e));
  if (page) await page.screenshot({ path: `${out}/failed.png`, fullPage: true }).catch(() => {});
} finally {
  await browser.close();
}
if (failures.length) {
  console.error("console test failed:\n" + failures.join("\n"));
  process.exit(1);
}
console.log("console test: passed");
