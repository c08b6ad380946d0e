// Command loadgen is the load generator behind `make bench-api`: it drives
// Quill's POST /v1/notes (or PATCH /v1/notes/{id}) with a fixed number of
// concurrent clients for a fixed time and reports throughput, latency
// percentiles, errors and its own CPU use.
//
// Modes:
//
//   - create: every request creates a new note under a unique Idempotency-Key;
//     a replayed answer counts as an error.
//   - replay: first creates --replay-keys notes (not measured), then sends
//     those same requests again (same keys, same bodies); every answer must be
//     a 201 with Idempotent-Replayed: true, anything else counts as an error.
//   - update: first creates one note per client (not measured); then each
//     client updates its own note — a new title and body, a unique key,
//     If-Match the ETag of its previous answer — so that no two clients
//     contend for one note. Every answer must be a 200, not replayed, whose
//     ETag is the next version; anything else counts as an error, and 412s
//     are also counted apart (precondition_failed: with one owner per note
//     there should be none). After a 412 the client goes on from the
//     current_version it names.
//   - seed: creates --count notes as fast as it can and exits.
//
// With --rate R the load is open-loop instead: requests start on a fixed
// schedule, R per second, taken by whichever client is free (--concurrency
// caps the requests in flight), and latency counts from each request's
// scheduled start, so a server that falls behind shows as latency rather
// than as fewer requests.
//
// Requests started during --warmup are sent but not measured; the measured
// window is the --duration after it. Latency is kept per request (one slice
// per client, sorted at the end), so percentiles are exact. Any non-2xx
// answer or transport failure is an error; errors are counted by kind.
//
// Usage:
//
//	loadgen --url http://127.0.0.1:8080 --token qt_... --concurrency 16 \
//	        --duration 10s --warmup 2s --mode create|replay|update [--rate 500] [--json]
//
// Run "loadgen --help" for every flag. The token may also come from
// QUILL_TOKEN and the URL from QUILL_URL.
package main

import "github.com/quillhq/quill/internal/cli"

func main() { cli.Main("loadgen", run) }
