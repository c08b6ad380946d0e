// Command webhookbench is the Go half of `make bench-webhooks`
// (scripts/bench-webhooks.sh, see bench/README.md): it measures how fast
// the webhook dispatcher delivers against the same POSTs sent directly, on
// the same machine in the same run, and the dispatcher's delivery latency
// at a steady rate.
//
// It runs a local receiver (a plain Go HTTP server that verifies each
// POST's Standard Webhooks signature, HMAC-SHA256 over id.timestamp.body,
// itself), inserts one endpoint pointing at it (as the API would), and
// then:
//
//  1. direct: sends --events POSTs of note.created CloudEvents, signed as
//     the dispatcher signs them, straight to the receiver with
//     --concurrency senders (the dispatcher's per-endpoint concurrency)
//     over the dispatcher's own HTTP client → direct deliveries/s;
//  2. drain: publishes --events such events onto the stream the running
//     dispatcher (a separate process) consumes, as the relay publishes
//     them, and times them until the receiver has every one →
//     dispatcher deliveries/s, and the ratio to direct;
//  3. latency: publishes --rate events/s for --duration, each stamped
//     with the time it was published, and reports commit → delivered
//     (the event's time to the receiver's arrival) percentiles, and the
//     p99 bucket of the dispatcher's quill_webhook_delivery_seconds.
//
// It prints a text report, or one JSON object with --json.
package main

import "github.com/quillhq/quill/internal/cli"

func main() { cli.Main("webhookbench", run) }
