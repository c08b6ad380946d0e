// Package e2e is Quill's end-to-end fault suite. Its test builds
// the three real programs (api, relay, attachment-worker) and nats-server
// once with `go build`, runs them as separate processes against a private
// PostgreSQL cluster and a nats-server it controls, drives them through a
// response-dropping proxy (internal/faultproxy) with 64 clients that resend
// operations under the same Idempotency-Key, kills and restarts every process
// at random moments, stops NATS for 20 s and restarts PostgreSQL — and then
// proves that every business action reached one explainable final state:
// one note per create key, one delete per deleted note, every event in the
// stream once, every attachment processed once, and `api audit` clean. It
// also proves that its faults fired (duplicate acknowledgements, inbox
// duplicates, redeliveries and replays were observed), or it fails.
//
// The short profile runs in `go test ./...`; the long one is
// `QUILL_E2E_PROFILE=soak go test -run TestFaults -v ./e2e` (see the README).
package e2e
