// Package dashboard checks that deploy/grafana's dashboard and
// deploy/prometheus's alerting rules name only metrics that Quill's
// programs export: its test parses every query with Prometheus's own PromQL
// parser and scrapes the real api, relay and attachment-worker, built from
// this repository and run against the test PostgreSQL and a NATS server of
// their own. It is a module of its own so that the Prometheus server's
// dependencies stay out of Quill's go.mod; `make test` runs it. It has no
// exported API.
package dashboard
