// The operator console in a real browser (Chromium through playwright-core),
// run by e2e/console_test.go against the real API, relay and worker, which
// prepared: chain A (a note with an attachment, created, replayed,
// published and processed) and chain B (a note whose event the stream
// refused for its size, so the relay parked it; the stream has since been
// allowed larger messages, so a retry can publish it), and a webhook endpoint
// the dispatcher disabled with one failed delivery (HOOK_ENDPOINT,
// HOOK_DELIVERY).
//
// Every step asserts what an operator would look for on the page, and
// screenshots go to SCREENSHOTS (one PNG per page). Exits 1 with one line
// naming the failed step.
"use strict";

const assert = require("node:assert/strict");
const path = require("node:path");
const { chromium } = require("playwright-core");

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const base = env("CONSOLE_URL"); // http://127.0.0.1:PORT
const shots = env("SCREENSHOTS");
const tenant = env("TENANT");

let step = "start";
async function shot(page, name) {
  await page.screenshot({ path: path.join(shots, `console-${name}.png`), fullPage: true });
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    // Root in a container has no user namespaces for Chromium's sandbox.
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  const context = await browser.newContext({ viewport: { width: 1200, height: 900 } });
  const page = await context.newPage();
  const cspViolations = [];
  page.on("console", (m) => {
    if (/Content Security Policy/i.test(m.text())) cspViolations.push(m.text());
  });
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));

  try {
    step = "a page without a session leads to the sign-in";
    await page.goto(`${base}/console/lookup`);
    assert.match(page.url(), /\/console\/signin\?next=/);

    step = "a tenant token is refused";
    await page.fill('input[name="token"]', env("TENANT_TOKEN"));
    await page.click('button[type="submit"]');
    await page.waitForSelector("text=A tenant token cannot sign in");
    await shot(page, "signin-refused");

    step = "an operator token signs in";
    await page.fill('input[name="token"]', env("OPERATOR_TOKEN"));
    await page.click('button[type="submit"]');
    await page.waitForURL(`${base}/console/lookup`);

    step = "the overview's charts draw from the pipeline's figures";
    await page.goto(`${base}/console/`);
    await page.waitForFunction(() => document.body.dataset.updated !== undefined);
    assert.equal(await page.textContent('[data-figure="parked"]'), "1");
    const firstOverview = Date.now();

    step = "the lookup shows every link of chain A";
    await page.goto(`${base}/console/lookup`);
    await page.fill('input[name="tenant"]', tenant);
    await page.selectOption('select[name="by"]', "key");
    await page.fill('input[name="q"]', env("KEY_A"));
    await page.click('form.lookup button[type="submit"]');
    await page.waitForSelector("section.chain");
    const chain = await page.textContent("section.chain");
    assert.match(chain, /create-note: executed .* answered 201/);
    assert.match(chain, /2 requests answered: 1 execution and 1 replay/);
    assert.ok(chain.includes(env("NOTE_A")), "the note id");
    assert.match(chain, /Event note\.created/);
    assert.equal(await page.textContent('li[data-step="event"] .state'), "published");
    assert.match(chain, /Stream \S+ sequence \d+; stream check: ok/);
    assert.match(chain, /Worker: applied .* \(inbox row\), after 1 delivery/);
    assert.equal(await page.textContent('li[data-step="attachment"] .status'), "processed");
    const thumbWidth = await page.$eval("img.thumbnail", (img) => img.complete && img.naturalWidth);
    assert.ok(thumbWidth > 0, "the thumbnail loads");
    assert.equal(await page.$("p.anomaly-summary"), null, "no anomaly on a clean chain");
    await shot(page, "lookup");

    step = "another tenant's view of the note is a plain not found";
    await page.goto(`${base}/console/lookup?tenant=someone-else&by=note&q=${env("NOTE_A")}`);
    await page.waitForSelector("p.notfound");
    assert.equal(await page.$("section.chain"), null);

    step = "the parked event of chain B is listed with its reason";
    await page.goto(`${base}/console/parked`);
    const row = page.locator(`tr[data-event="${env("EVENT_B")}"]`);
    await row.waitFor();
    assert.match(await row.textContent(), /exceeds|maximum|size|large/i);
    await shot(page, "parked");

    step = "an action posted from another site is refused";
    // A page of another origin (served by the test itself) whose form
    // posts the retry to the console: the browser says where it comes
    // from, and http.CrossOriginProtection refuses it.
    const evil = await context.newPage();
    await evil.route("http://evil.test/**", (route) =>
      route.fulfill({
        contentType: "text/html",
        body: `<form method="post" action="${base}/console/parked/retry"><input name="id" value="${env("EVENT_B")}"><button type="submit">go</button></form>`,
      }),
    );
    await evil.goto("http://evil.test/");
    await evil.click('button[type="submit"]');
    await evil.waitForURL(`${base}/console/parked/retry`);
    assert.match(await evil.textContent("body"), /sent from another site or origin/);
    await evil.close();
    await page.reload();
    await row.waitFor();

    step = "an inline script is blocked by the Content-Security-Policy";
    await page.evaluate(() => {
      const s = document.createElement("script");
      s.textContent = "window.__inline = true";
      document.body.appendChild(s);
    });
    assert.equal(await page.evaluate(() => window.__inline === true), false);

    step = "the parked event is retried from the page, with a confirmation";
    await row.locator("a.button").click();
    await page.waitForSelector("form.confirm");
    await shot(page, "confirm");
    await page.click('form.confirm button[type="submit"]');
    await page.waitForSelector(`text=Event ${env("EVENT_B")} is queued again`);
    assert.equal(await page.locator(`tr[data-event="${env("EVENT_B")}"]`).count(), 0);

    step = "the relay publishes the retried event (chain B's lookup says published)";
    const deadline = Date.now() + 30000;
    for (;;) {
      await page.goto(`${base}/console/lookup?tenant=${tenant}&by=event&q=${env("EVENT_B")}`);
      const state = await page.textContent(`li[data-event="${env("EVENT_B")}"] .state`);
      if (state === "published") break;
      if (Date.now() > deadline) throw new Error(`event B is still ${state} 30 s after the retry`);
      await page.waitForTimeout(500);
    }
    await shot(page, "lookup-retried");

    step = "the dead letters page answers";
    await page.goto(`${base}/console/dead-letters`);
    await page.waitForSelector("table#dead-letters");
    await shot(page, "dead-letters");

    step = "the webhooks page lists the disabled endpoint and its failed delivery";
    await page.click('nav a[href="/console/webhooks"]');
    await page.waitForSelector("table#failed-deliveries");
    const hook = page.locator(`#disabled-endpoints tr[data-endpoint="${env("HOOK_ENDPOINT")}"]`);
    await hook.waitFor();
    assert.match(await hook.textContent(), /answered 410 Gone/);
    assert.match(await hook.textContent(), /https:\/\/hooks\.example\/quill/);
    assert.equal(await page.locator(`tr[data-delivery="${env("HOOK_DELIVERY")}"]`).count(), 1);
    await shot(page, "webhooks");

    step = "the endpoint is enabled, then its failed delivery re-sent, each confirmed";
    await hook.locator("a.button").click();
    await page.waitForSelector("form.confirm");
    await page.click('form.confirm button[type="submit"]');
    await page.waitForSelector(`text=Endpoint ${env("HOOK_ENDPOINT")} is enabled`);
    assert.equal(await page.getAttribute("section#endpoint", "data-state"), "active");
    await page.click('a.button[href^="/console/webhooks/retry-failed"]');
    await page.waitForSelector("form.confirm");
    await page.click('form.confirm button[type="submit"]');
    await page.waitForSelector(`text=1 failed deliveries of endpoint ${env("HOOK_ENDPOINT")} are pending again`);
    assert.equal(await page.locator(`tr[data-delivery="${env("HOOK_DELIVERY")}"]`).count(), 0);

    step = "the overview again, with a second backlog sample (one per 10 s)";
    await page.waitForTimeout(Math.max(0, 10500 - (Date.now() - firstOverview)));
    await page.goto(`${base}/console/`);
    await page.waitForFunction(() => document.body.dataset.updated !== undefined);
    assert.equal(await page.textContent('[data-figure="parked"]'), "0");
    await shot(page, "overview");

    step = "no script error and no CSP violation on the console's own pages";
    assert.deepEqual(pageErrors, []);
    // The one violation expected is the inline script this test injected.
    assert.ok(cspViolations.length <= 1, cspViolations.join("\n"));

    step = "sign out ends the session, and its cookie put back is refused";
    const signedIn = await context.cookies();
    assert.ok(signedIn.some((c) => c.name === "quill_console"), "the session cookie");
    await page.click('form.signout button[type="submit"]');
    await page.waitForURL(/\/console\/signin/);
    await page.goto(`${base}/console/parked`);
    assert.match(page.url(), /\/console\/signin/);
    await context.addCookies(signedIn);
    await page.goto(`${base}/console/parked`);
    assert.match(page.url(), /\/console\/signin/);
    console.log("console browser test: every step passed");
  } catch (err) {
    await shot(page, "failure").catch(() => {});
    console.error(`console browser test failed at "${step}": ${err && err.message ? err.message : err}`);
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
})();
