// Package deploy holds the container deployment files that are not Go code:
// deploy/nats.conf (the NATS JetStream server configuration mounted by
// compose.yaml), deploy/nats-cluster.conf (one node of the `cluster`
// profile's three-node JetStream cluster), and the tests that check the
// invariants of the repository's compose.yaml, Dockerfile and NATS
// configurations. It has no exported API.
package deploy
