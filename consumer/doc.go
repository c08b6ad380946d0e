// Package consumer is for services that consume Quill's events (SPEC §5)
// and must apply each event's effect once although JetStream delivers it at
// least once.
//
// A Consumer reads one durable JetStream pull consumer and runs a Handler
// for each event, at most Config.Concurrency at once, inside the service's
// own PostgreSQL transaction. That transaction first inserts the event id
// into an inbox table (INSERT … ON CONFLICT DO NOTHING): an event already
// there — redelivered after a lost acknowledgement, or republished beyond
// the stream's duplicate window — commits nothing else and is
// acknowledged. The message is acknowledged only after the commit, so a
// crash at any point leads to a redelivery, never to a lost or doubled
// effect.
//
// Failures: a handler's error rolls the transaction back; the delivery is
// retried in process (Config.Retries), then Nak'ed with a delay that grows
// with the delivery count. On the Config.MaxDeliver-th delivery a failing
// event becomes a dead letter (a row with the reason, the message and its
// delivery count) and is acknowledged; so does a message delivered more
// often than that before it is handled again (its handler crashed the
// process each time), a message that is not a CloudEvent of Quill's form,
// one that Config.Validate refuses, and one whose handler returned a
// Permanent error. The tables ship with the package: run Migrate at
// start-up.
//
// Order: Quill publishes the events of one note in commit order, and the
// stream delivers them in that order, but with Concurrency > 1 two events of
// one note may be handled at once and commit in either order. With
// Config.OrderBySubject the events of one subject (one note) run one at a
// time in the order the process received them. That holds within one
// process while nothing fails: a Nak'ed or timed-out event is redelivered
// after its successors, and two processes sharing the durable consumer may
// each hold an event of one note. Handlers should therefore still tolerate
// an event arriving late — for instance keep the note's latest event time
// and skip what is older, or treat a deletion as final.
//
// Versions: every note event carries the note's version after the change
// (Event.Version), contiguous per note. Config.Versions turns on the
// standard guard, in the consumer's transaction against a versions table
// of the package: VersionsSkipStale skips an event whose version is not
// above the one the consumer applied for the note (counted stale);
// VersionsInOrder also holds back one that comes before its predecessor
// (redelivered shortly, counted held_back) so that a note.updated, which
// carries only the fields it changed, is never applied ahead of the one it
// follows. Off by default: which mode fits depends on the filter.
//
// Group commit: NewBatch's consumer takes a BatchHandler and commits the
// deliveries that arrive together (up to Config.MaxBatch, and
// Config.MaxBatchWeight of their Config.Weight) in one transaction, their
// inbox rows inserted in one statement and the duplicates left out, at
// most Config.MaxConcurrentBatches transactions at once. A batch that
// fails is rolled back and each of its events handled again alone, under
// every rule above, so one bad event does not fail its neighbours.
//
// NewStaged's consumer runs Stages: Prepare before the transaction and
// outside it (it may put off a slow event, which leaves its batch and is
// handled alone, or skip one that needs no effect), Apply in the
// transaction with an outcome per event (an event that fails on its own is
// left out, its inbox row forgotten, while the rest commits), Committed
// after the commit. Config.Inbox and Config.DeadLetters let a service keep
// an inbox and dead letters of its own instead of the package's tables.
//
// The package's tables hold the rows of every consumer that uses them,
// each under its Durable: several consumers share one database without
// seeing each other's processed ids or dead letters. Store lists, counts
// and re-drives a consumer's dead letters and cleans the inbox, for the
// tools around the consumers.
//
// Watermill carries the handling: the package's own Subscriber feeds a
// watermill Router, whose middleware writes the dead letters (poison
// queue), retries in process and recovers panics.
package consumer
