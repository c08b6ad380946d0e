// Package clientsuite tests the public client module
// (github.com/quillhq/quill/client) against the real API — the apitest
// server on real PostgreSQL, the fault proxy dropping answers — from the
// server's module, so that the client's own module needs neither the
// server nor its test harness. The client's unit tests stay beside it.
package clientsuite
