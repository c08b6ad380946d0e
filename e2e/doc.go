// Package e2e is Quill's end-to-end fault suite. Its test builds
// the real programs (api, relay, attachment-worker, webhook-dispatcher) and nats-server
// once with `go build`, runs them as separate processes against a private
// PostgreSQL cluster and a nats-server it controls, drives them through a
// response-dropping proxy (internal/faultproxy) with 64 clients that create,
// update (PATCH under If-Match, two agents racing from one version among
// them) and delete notes and resend operations under the same
// Idempotency-Key, kills and restarts every process at random moments, stops
// NATS for 20 s and restarts PostgreSQL — and then proves that every
// business action reached one explainable final state: one note per create
// key, one outcome per update key, each note's versions contiguous in what
// the API answered, the outbox and the stream's order, one winner per race,
// one delete per deleted note, every event in the stream once, every
// attachment processed once, and `api audit` clean. It
// also proves that its faults fired (duplicate acknowledgements, inbox
// duplicates, redeliveries and replays were observed), or it fails.
//
// TestEditsThroughTheStream follows one note's versions (create, two
// updates, a stale 412, a delete) through two relays into the stream and
// the lookups; TestEditChecksCanFail plants each violation of the edit
// checks in a small final state and sees the check fail.
//
// TestClusterFaults runs the same load and checks against a three-node
// JetStream cluster (internal/natstest) with an R3 stream and two of each
// program, while the stream leader is shut down, the meta leader steps down
// and one node stops for 20 s.
//
// TestWebhookDeliveries runs a webhook dispatcher too and a receiver
// verifying with the Standard Webhooks project's npm package: every
// subscribed event delivered, signed (also across a secret rotation), in
// version order per note, listed as a delivered effect in the lookup.
// TestWebhookFaults SIGKILLs the dispatcher mid-delivery while the receiver
// holds requests past the timeout: every event accepted at least once, one
// effect each after deduplicating by webhook-id, and duplicates seen.
//
// TestPostgresFailover runs every program on one multi-host DATABASE_URL
// over a primary and its synchronous standby, SIGKILLs the primary's
// process group mid-load and promotes the standby: the suite's checks hold
// and no daemon exits.
//
// The short profiles run in `go test ./...`; the long ones are
// `QUILL_E2E_PROFILE=soak go test -run 'TestFaults|TestClusterFaults' -v ./e2e`
// (`make soak`; see docs/testing.md).
package e2e
