// A webhook receiver that nobody at Quill wrote the verifier of: every
// delivery is checked by the Standard Webhooks project's own library (the
// npm package standardwebhooks, pinned in package.json), so a test that
// sees a delivery accepted here has proved that Quill's signatures verify
// with it. internal/webhooktest starts it for Go tests; see docs/testing.md
// for running it by hand.
//
// Settings (environment; the port also as the first argument or --port N):
//   RECEIVER_SECRETS    comma-separated whsec_ secrets; a delivery verified
//                       by any one is accepted (a rotation signs with two).
//                       May be empty: every delivery is then refused (401)
//                       until POST /control sets the secrets — a test that
//                       registers its endpoint learns the secret only then
//   RECEIVER_PORT       port on 127.0.0.1 (default 0: any free port)
//   RECEIVER_HOST       address to listen on (default 127.0.0.1)
//   RECEIVER_FAIL_NEXT, RECEIVER_FAIL_STATUS, RECEIVER_GONE, RECEIVER_HANG,
//   RECEIVER_HANG_EVERY, RECEIVER_DELAY_MS
//                       the faults at start (as POST /control sets them)
//
// The first line on stdout is JSON {"url", "port"} once it listens. Log
// lines go to stderr. SIGTERM or SIGINT: stop listening, end the held
// requests, print the stats to stderr, exit 0.
//
// Endpoints:
//   POST any path but these   a delivery (below)
//   GET  /stats               {accepted, duplicates, rejected, bad_requests,
//                              failed, gone, held, holding,
//                              ids: {id: deliveries}} (holding: the held
//                              requests still open now)
//   GET  /events              the accepted deliveries, first of each id, in
//                             order: [{id, timestamp, received_at, path, body}]
//   GET  /control             the faults in force
//   POST /control             JSON; each field given replaces one fault:
//                             {fail_next, fail_status, gone, hang,
//                             hang_every, delay_ms}, and "secrets" (a list
//                             of whsec_ secrets) replaces the secrets; a
//                             bad field changes nothing
//
// A delivery, in this order: missing webhook-id, webhook-timestamp or
// webhook-signature → 400; no configured secret verifies it (the library's
// five-minute tolerance included) → 401; a body that is not JSON → 400;
// then the faults: fail_next > 0 → fail_status (default 500) and one fewer,
// gone → 410, neither recorded; otherwise the id is recorded — once: a
// second delivery of an id counts as a duplicate and has no effect — and
// then hang holds the response unanswered (until the sender gives up or the
// receiver stops: "accepted, then timed out"), hang_every N > 0 holds every
// Nth recorded delivery so (counted from when it was set; the others are
// answered: "accepts some, then hangs"), delay_ms delays the 200.
import http from "node:http";
import { Webhook } from "standardwebhooks";

const MAX_BODY = 1 << 20;
const RESERVED = new Set(["/stats", "/events", "/control"]);

const log = (fields) => process.stderr.write(JSON.stringify({ at: new Date().toISOString(), ...fields }) + "\n");

function fail(msg) {
  process.stderr.write(`webhookreceiver: ${msg}\n`);
  process.exit(2);
}

function parsePort(args, env) {
  let raw = env.RECEIVER_PORT ?? "0";
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "--port" && i + 1 < args.length) raw = args[++i];
    else if (args[i].startsWith("--port=")) raw = args[i].slice("--port=".length);
    else if (/^\d+$/.test(args[i])) raw = args[i];
    else fail(`unknown argument ${JSON.stringify(args[i])} (usage: node server.mjs [--port N])`);
  }
  if (!/^\d+$/.test(raw) || Number(raw) > 65535) fail(`port ${JSON.stringify(raw)} is not a number from 0 to 65535`);
  return Number(raw);
}

// verifiersOf returns {verifiers} for a list of whsec_ secrets, or {error}
// naming the first that is not one.
function verifiersOf(secrets) {
  const out = [];
  for (const [i, s] of secrets.entries()) {
    if (typeof s !== "string" || s.trim() === "") return { error: `secret ${i + 1} is not a string` };
    try {
      out.push(new Webhook(s.trim()));
    } catch (err) {
      return { error: `secret ${i + 1} is not whsec_ followed by base64 (${err.message})` };
    }
  }
  return { verifiers: out };
}

function parseSecrets(raw) {
  const secrets = (raw ?? "").split(",").map((s) => s.trim()).filter((s) => s !== "");
  const { verifiers, error } = verifiersOf(secrets);
  if (error) fail(`RECEIVER_SECRETS: ${error}`);
  return verifiers;
}

// applyFaults sets the faults named in spec (from /control or the
// environment) and returns an error message for a field of the wrong kind,
// changing nothing then.
function applyFaults(faults, spec) {
  if (spec === null || typeof spec !== "object" || Array.isArray(spec)) return "the body is not a JSON object";
  const next = { ...faults };
  for (const [k, v] of Object.entries(spec)) {
    switch (k) {
      case "fail_next":
      case "hang_every":
      case "delay_ms":
        if (!Number.isInteger(v) || v < 0 || v > 1e9) return `${k} must be an integer from 0 to 1000000000`;
        next[k] = v;
        break;
      case "fail_status":
        if (!Number.isInteger(v) || v < 100 || v > 599) return "fail_status must be an HTTP status from 100 to 599";
        next[k] = v;
        break;
      case "gone":
      case "hang":
        if (typeof v !== "boolean") return `${k} must be true or false`;
        next[k] = v;
        break;
      default:
        return `unknown field ${JSON.stringify(k)} (known: fail_next, fail_status, gone, hang, hang_every, delay_ms, secrets)`;
    }
  }
  if (spec.hang_every !== undefined) next.hang_count = 0;
  Object.assign(faults, next);
  return null;
}

function faultsFromEnv(env) {
  const faults = { fail_next: 0, fail_status: 500, gone: false, hang: false, hang_every: 0, hang_count: 0, delay_ms: 0 };
  const spec = {};
  const int = (name, key) => {
    if (env[name] === undefined || env[name] === "") return;
    if (!/^\d+$/.test(env[name])) fail(`${name}=${JSON.stringify(env[name])} is not a whole number`);
    spec[key] = Number(env[name]);
  };
  const bool = (name, key) => {
    if (env[name] === undefined || env[name] === "") return;
    if (env[name] !== "true" && env[name] !== "false") fail(`${name}=${JSON.stringify(env[name])} is not true or false`);
    spec[key] = env[name] === "true";
  };
  int("RECEIVER_FAIL_NEXT", "fail_next");
  int("RECEIVER_FAIL_STATUS", "fail_status");
  int("RECEIVER_DELAY_MS", "delay_ms");
  int("RECEIVER_HANG_EVERY", "hang_every");
  bool("RECEIVER_GONE", "gone");
  bool("RECEIVER_HANG", "hang");
  const msg = applyFaults(faults, spec);
  if (msg) fail(msg);
  return faults;
}

let verifiers = parseSecrets(process.env.RECEIVER_SECRETS);
const faults = faultsFromEnv(process.env);
const port = parsePort(process.argv.slice(2), process.env);
const host = process.env.RECEIVER_HOST || "127.0.0.1";

const stats = { accepted: 0, duplicates: 0, rejected: 0, bad_requests: 0, failed: 0, gone: 0, held: 0 };
const seen = new Map(); // webhook-id → deliveries with an effect or a duplicate
const events = [];
const held = new Set(); // responses held unanswered

function answer(res, status, body) {
  if (res.writableEnded || res.destroyed) return;
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

// readBody collects the request's body up to MAX_BODY; it resolves to null
// for a larger one (answered 413 by the caller) or a broken connection.
function readBody(req) {
  return new Promise((resolve) => {
    const chunks = [];
    let size = 0;
    let done = false;
    req.on("data", (c) => {
      if (done) return;
      size += c.length;
      if (size > MAX_BODY) {
        done = true;
        resolve(null);
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => {
      if (!done) {
        done = true;
        resolve(Buffer.concat(chunks));
      }
    });
    req.on("error", () => {
      if (!done) {
        done = true;
        resolve(null);
      }
    });
  });
}

// verify returns {outcome: "ok", payload} (the body parsed, by the
// library), {outcome: "bad_signature"} or {outcome: "bad_json"}: which of
// the configured secrets verified the delivery does not matter (a rotation).
function verify(body, headers) {
  let verified = false;
  for (const wh of verifiers) {
    try {
      const payload = wh.verify(body, headers);
      // The library returns nothing for an empty body; Quill's are
      // CloudEvents, so an empty one is not JSON here.
      return payload === undefined ? { outcome: "bad_json" } : { outcome: "ok", payload };
    } catch (err) {
      // The library parses the body as JSON only once a signature matched:
      // a SyntaxError means signed, but not JSON.
      if (err instanceof SyntaxError) verified = true;
    }
  }
  return { outcome: verified ? "bad_json" : "bad_signature" };
}

async function delivery(req, res, path) {
  const body = await readBody(req);
  if (body === null) {
    stats.bad_requests++;
    answer(res, 413, { error: `body over ${MAX_BODY} bytes` });
    return;
  }
  const id = req.headers["webhook-id"];
  const ts = req.headers["webhook-timestamp"];
  const sig = req.headers["webhook-signature"];
  if (!id || !ts || !sig) {
    stats.bad_requests++;
    log({ msg: "missing headers", path, id: id ?? null });
    answer(res, 400, { error: "webhook-id, webhook-timestamp and webhook-signature are required" });
    return;
  }
  const { outcome, payload } = verify(body, { "webhook-id": id, "webhook-timestamp": ts, "webhook-signature": sig });
  if (outcome === "bad_signature") {
    stats.rejected++;
    log({ msg: "rejected", path, id });
    answer(res, 401, { error: "no configured secret verifies the signature (or the timestamp is outside five minutes)" });
    return;
  }
  if (outcome === "bad_json") {
    stats.bad_requests++;
    log({ msg: "signed body is not JSON", path, id });
    answer(res, 400, { error: "the body is not JSON" });
    return;
  }
  if (faults.fail_next > 0) {
    faults.fail_next--;
    stats.failed++;
    log({ msg: "failed on purpose", path, id, status: faults.fail_status });
    answer(res, faults.fail_status, { error: "failed on purpose (fail_next)" });
    return;
  }
  if (faults.gone) {
    stats.gone++;
    answer(res, 410, { error: "gone on purpose" });
    return;
  }
  const n = (seen.get(id) ?? 0) + 1;
  seen.set(id, n);
  if (n === 1) {
    stats.accepted++;
    events.push({ id, timestamp: ts, received_at: new Date().toISOString(), path, body: payload ?? null });
  } else {
    stats.duplicates++;
  }
  let hold = faults.hang;
  if (!hold && faults.hang_every > 0) {
    faults.hang_count = (faults.hang_count + 1) % faults.hang_every;
    hold = faults.hang_count === 0;
  }
  if (hold) {
    stats.held++;
    held.add(res);
    res.on("close", () => held.delete(res));
    return;
  }
  if (faults.delay_ms > 0) await new Promise((r) => setTimeout(r, faults.delay_ms));
  answer(res, 200, { id, duplicate: n > 1 });
}

async function control(req, res) {
  const body = await readBody(req);
  if (body === null) {
    answer(res, 413, { error: `body over ${MAX_BODY} bytes` });
    return;
  }
  let spec;
  try {
    spec = JSON.parse(body.toString());
  } catch {
    answer(res, 400, { error: "the body is not JSON" });
    return;
  }
  let next = null;
  if (spec !== null && typeof spec === "object" && !Array.isArray(spec) && "secrets" in spec) {
    const { secrets, ...rest } = spec;
    if (!Array.isArray(secrets)) {
      answer(res, 400, { error: "secrets must be a list of whsec_ secrets" });
      return;
    }
    const { verifiers: v, error } = verifiersOf(secrets);
    if (error) {
      answer(res, 400, { error: `secrets: ${error}` });
      return;
    }
    next = v;
    spec = rest;
  }
  const msg = applyFaults(faults, spec);
  if (msg) {
    answer(res, 400, { error: msg });
    return;
  }
  if (next !== null) verifiers = next;
  log({ msg: "faults", secrets: verifiers.length, ...faultsBody() });
  answer(res, 200, faultsBody());
}

function statsBody() {
  return { ...stats, holding: held.size, ids: Object.fromEntries(seen) };
}

// faultsBody is the faults as /control shows them, without the counter
// hang_every keeps.
function faultsBody() {
  const { hang_count: _, ...shown } = faults;
  return shown;
}

const server = http.createServer((req, res) => {
  const path = (req.url ?? "/").split("?")[0];
  const run = async () => {
    if (req.method === "GET" && path === "/stats") return answer(res, 200, statsBody());
    if (req.method === "GET" && path === "/events") return answer(res, 200, events);
    if (req.method === "GET" && path === "/control") return answer(res, 200, faultsBody());
    if (req.method === "POST" && path === "/control") return control(req, res);
    if (req.method === "POST" && !RESERVED.has(path)) return delivery(req, res, path);
    res.setHeader("allow", RESERVED.has(path) ? (path === "/control" ? "GET, POST" : "GET") : "POST");
    return answer(res, 405, { error: `${req.method} ${path} is not served` });
  };
  run().catch((err) => {
    // Never crash on one request: answer 500 and go on.
    log({ msg: "handler error", error: String(err && err.stack ? err.stack : err) });
    answer(res, 500, { error: "receiver error" });
  });
});
// A malformed request is answered 400 by Node itself; a reset connection
// must not end the process.
server.on("clientError", (err, socket) => {
  if (socket.writable) socket.end("HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
  else socket.destroy();
});
// A held response must outlast any sender's timeout; Node's defaults would
// end it after five minutes.
server.requestTimeout = 0;
server.headersTimeout = 60_000;

server.on("error", (err) => fail(`listen on ${host}:${port}: ${err.message}`));
server.listen(port, host, () => {
  const addr = server.address();
  const shown = addr.family === "IPv6" ? `[${addr.address}]` : addr.address;
  process.stdout.write(JSON.stringify({ url: `http://${shown}:${addr.port}`, port: addr.port }) + "\n");
});

let stopping = false;
function stop(signal) {
  if (stopping) return;
  stopping = true;
  server.close(() => {
    log({ msg: "stopped", signal, ...statsBody() });
    process.exit(0);
  });
  for (const res of held) res.destroy();
  server.closeIdleConnections();
  // Connections still busy after a moment (a slow answer) are cut.
  setTimeout(() => server.closeAllConnections(), 2000).unref();
}
process.on("SIGTERM", () => stop("SIGTERM"));
process.on("SIGINT", () => stop("SIGINT"));
