// Package deploy holds the container deployment files that are not Go code:
// deploy/nats.conf (the NATS JetStream server configuration mounted by
// compose.yaml), deploy/nats-cluster.conf (one node of the `cluster`
// profile's three-node JetStream cluster), deploy/prometheus (the
// Prometheus configuration and alerting rules, with the rules' promtool unit
// tests), deploy/grafana (Grafana's provisioning and the dashboard; its
// PromQL is checked against the running programs by the nested module in
// deploy/dashboard), deploy/postgres (roles.sql, the owner and runtime
// roles, run by its tests), and the tests that check the
// invariants of the repository's compose.yaml (its observability profile
// included), Dockerfile and NATS configurations. It has no exported API.
package deploy
