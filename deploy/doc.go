// Package deploy holds the container deployment files that are not Go code:
// deploy/nats.conf (the NATS JetStream server configuration mounted by
// compose.yaml), and the tests that check the invariants of the repository's
// compose.yaml, Dockerfile and nats.conf. It has no exported API.
package deploy
