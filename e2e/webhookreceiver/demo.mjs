// The webhook part of `make demo` (scripts/demo.sh runs it after the
// article's story): against the running system (make dev, whose dispatcher
// may deliver to this machine), it starts a receiver (server.mjs, which
// verifies with the Standard Webhooks project's own npm package),
// registers an endpoint for note.created at it through the API, creates a
// note, and shows the delivery arriving verified and its effect in the
// operation's lookup. It deletes the endpoint at the end, so that nothing
// goes on retrying to a receiver that is gone.
//
// Settings (environment): QUILL_URL (default http://127.0.0.1:8080),
// QUILL_TOKEN (required), QUILL_DEMO_WAIT (how long to wait for the
// delivery, default 30s). Exit 0 when every step behaved as promised, 1
// with one line saying which did not.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import net from "node:net";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const base = (process.env.QUILL_URL || "http://127.0.0.1:8080").replace(/\/+$/, "");
const token = process.env.QUILL_TOKEN || "";
const waitMs = parseWait(process.env.QUILL_DEMO_WAIT || "30s");
const run = randomBytes(4).toString("hex");

function parseWait(s) {
  const m = /^(\d+)(ms|s|m)$/.exec(s);
  if (!m) die(`QUILL_DEMO_WAIT=${JSON.stringify(s)} is not a duration such as 30s`);
  return Number(m[1]) * { ms: 1, s: 1000, m: 60000 }[m[2]];
}

function die(msg) {
  process.stderr.write(`demo (webhooks): ${msg}\n`);
  process.exit(1);
}

const say = (s = "") => process.stdout.write(s + "\n");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function api(method, path, { key, body } = {}) {
  const headers = { authorization: `Bearer ${token}` };
  if (key) headers["idempotency-key"] = key;
  if (body !== undefined) headers["content-type"] = "application/json";
  let res;
  try {
    res = await fetch(base + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (err) {
    throw new Error(`${method} ${path}: ${err.cause?.message ?? err.message} (is the system running? make dev)`);
  }
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    // not JSON: shown as text below
  }
  return { status: res.status, json, text };
}

// freePort asks the kernel for a port on 127.0.0.1 that is free now: the
// endpoint's URL must be known before the receiver can start, since the
// receiver needs the secret that registering the endpoint returns.
function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function startReceiver(secret, port) {
  const child = spawn(process.execPath, [join(here, "server.mjs")], {
    cwd: here,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, RECEIVER_SECRETS: secret, RECEIVER_PORT: String(port) },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (c) => (stderr += c));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the receiver did not start within 15 s: ${stderr}`)), 15000);
    createInterface({ input: child.stdout }).once("line", (line) => {
      clearTimeout(timer);
      resolve({ child, url: JSON.parse(line).url });
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`the receiver exited (${code}): ${stderr.trim()}`));
    });
  });
}

async function main() {
  if (!token) die("QUILL_TOKEN is not set (scripts/demo.sh creates one)");
  let endpoint = null;
  let receiver = null;
  try {
    say("== Webhooks: a receiver nobody here wrote the verifier of ==");
    const port = await freePort();
    const url = `http://127.0.0.1:${port}/quill-demo`;
    const created = await api("POST", "/v1/webhooks", {
      key: `demo-webhook-${run}`,
      body: { url, event_types: ["quill.note.created.v1"], description: "make demo" },
    });
    if (created.status === 503) throw new Error("the API has no QUILL_WEBHOOK_SECRET_KEY, so webhooks are off (make dev sets one)");
    if (created.status === 400 && /https/.test(created.text))
      throw new Error("the API refuses a receiver on this machine: run it with QUILL_WEBHOOK_ALLOW_PRIVATE=true (make dev does)");
    if (created.status !== 201) throw new Error(`POST /v1/webhooks answered ${created.status}: ${created.text}`);
    endpoint = created.json;
    say(`POST /v1/webhooks → 201: endpoint ${endpoint.id} for quill.note.created.v1 at ${url}`);
    say("  its secret (whsec_…, shown once) goes to the receiver, nowhere else");

    receiver = await startReceiver(endpoint.secret, port);
    say(`receiver listening at ${receiver.url}, verifying with the standardwebhooks npm package`);

    const key = `demo-webhook-note-${run}`;
    const note = await api("POST", "/v1/notes", { key, body: { title: "Hello, webhooks" } });
    if (note.status !== 201) throw new Error(`POST /v1/notes answered ${note.status}: ${note.text}`);
    say(`POST /v1/notes (Idempotency-Key: ${key}) → 201: note ${note.json.id}`);

    // The event's id, from the operation's lookup: the webhook-id the
    // delivery must carry.
    const lookup = await api("GET", `/v1/operations/${key}`);
    const event = (lookup.json?.effects ?? []).find((e) => e.kind === "event" && e.type === "quill.note.created.v1");
    if (!event) throw new Error(`the lookup lists no note.created event: ${lookup.text}`);

    const deadline = Date.now() + waitMs;
    let got = null;
    while (!got) {
      const res = await fetch(receiver.url + "/events");
      got = (await res.json()).find((e) => e.id === event.id) ?? null;
      if (got) break;
      if (Date.now() > deadline) throw new Error(`no delivery of event ${event.id} reached the receiver within ${waitMs / 1000} s (is the webhook-dispatcher running?)`);
      await sleep(200);
    }
    const stats = await (await fetch(receiver.url + "/stats")).json();
    if (stats.rejected > 0) throw new Error(`the receiver refused ${stats.rejected} deliveries: the signature did not verify`);
    say(`delivery arrived: POST ${got.path}, webhook-id ${got.id} (the event's id), signature verified`);
    say(`  body: a ${got.body.type} CloudEvent for note ${got.body.subject}`);

    let effect = null;
    while (!effect) {
      const l = await api("GET", `/v1/operations/${key}`);
      effect = (l.json?.effects ?? []).find((e) => e.kind === "webhook" && e.endpoint_id === endpoint.id && e.state === "delivered") ?? null;
      if (effect) break;
      if (Date.now() > deadline) throw new Error(`the lookup shows no delivered webhook effect within ${waitMs / 1000} s: ${l.text}`);
      await sleep(200);
    }
    say(`GET /v1/operations/${key} lists the delivery as an effect:`);
    say(`  ${JSON.stringify(effect)}`);
    say("The webhook was delivered, verified by the Standard Webhooks library, and the lookup says so.");
  } finally {
    if (endpoint) {
      const del = await api("DELETE", `/v1/webhooks/${endpoint.id}`, { key: `demo-webhook-delete-${run}` }).catch((e) => ({ status: 0, text: e.message }));
      if (del.status !== 200) process.stderr.write(`demo (webhooks): could not delete endpoint ${endpoint.id}: ${del.status} ${del.text}\n`);
    }
    if (receiver) receiver.child.kill("SIGTERM");
  }
}

main().catch((err) => die(err.message));
