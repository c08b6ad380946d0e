// Command relaybench is the Go half of `make bench-relay`
// (scripts/bench-relay.sh, see bench/README.md). It has one subcommand per
// step the script cannot do well in shell:
//
//   - seed: writes pending events into outbox_events with COPY, shaped as
//     the API writes them (CloudEvents JSON of a note, ~600 bytes, many
//     events per note, in random note order);
//   - raw: the JetStream ceiling — creates the same kind of stream the relay
//     provisions and publishes the same number of messages of the same size
//     with Nats-Msg-Id, asynchronously, with the relay's bound on pending
//     acknowledgements, and reports the rate;
//   - wait: waits until a stream holds N messages and the outbox has no
//     pending event, then reports the publish rate (first to last message,
//     by the server's store timestamps);
//   - latency: per event of a time window, commit → stream store and
//     commit → marked published, with percentiles;
//   - reset: deletes a stream.
//
// Every subcommand prints one JSON object on stdout. Run "relaybench
// SUBCOMMAND --help" for the flags.
package main

import "github.com/quillhq/quill/internal/cli"

func main() { cli.Main("relaybench", run) }
