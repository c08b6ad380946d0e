// Command hostile is the overload benchmark behind `make bench-hostile`
// (issue 13): a legitimate agent workload runs alone, then again beside
// attackers, and the two runs are reported side by side.
//
// The legitimate workload: --legit-clients clients, each one request at a
// time, creating notes (some with a 64 KiB PNG attachment) and resending a
// share of earlier creates under the same key, as an agent unsure of its
// first attempt does. A create without a 2xx is retried under the same key
// (after Retry-After, within 50 ms-2 s); one still unanswered when its phase
// ends is resent after the phases. Then every key is checked in
// PostgreSQL: exactly one note per key (the key is in the note's title),
// the note each 2xx named exists, and every resend was a replay of the same
// note.
//
// The hostile phase adds: slowloris connections (headers announcing a body
// of 100,000 bytes, no token, no body; replaced when the server closes
// them), requests with random well-formed tokens at a fixed rate, one tenant
// creating at --flood-factor × its concurrency limit, and image bombs (a
// uniform 6320×6320 16-bit RGBA PNG: ~330 KB that decodes into ~305 MiB) at
// a fixed rate, and (issue 24) requests with invented HTTP methods, one in
// four 60 KiB long, and one host holding --idle-conns idle connections to
// the API and to its admin server. Each attacker connects from a loopback
// address of its own, the legitimate clients from 127.0.0.1 (addrs.go).
//
// Per phase it reports the legitimate throughput and latency, the peak RSS
// (VmHWM, reset at the phase's start) of --api-pid and --worker-pid, with
// --admin-url the series of the API's HTTP metrics at the measured
// window's start and end and a probe of its /healthz, and for the hostile
// phase what each attacker was answered; the last line counts the targets
// missed. A slow or failing API is measured, never fatal: only a
// bad flag (exit 2) or an unreachable database (exit 1) stops the tool.
//
// Usage:
//
//	hostile --url http://127.0.0.1:8080 --admin-url http://127.0.0.1:9091 --database-url postgres://... \
//	        --token qt_... --flood-token qt_... --bomb-token qt_... \
//	        --api-pid 123 --worker-pid 456 [--duration 20s ...]
//
// Run "hostile --help" for every flag.
package main

import "github.com/quillhq/quill/internal/cli"

func main() { cli.Main("hostile", run) }
