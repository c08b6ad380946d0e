package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/quillhq/quill/internal/natstest"
)

// TestMain fails the package if a test leaves a goroutine behind (other
// than what a cluster node's in-process restart may leave of nats-server).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.ClusterLeakOptions()...)
}
