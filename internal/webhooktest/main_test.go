package webhooktest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind (a
// receiver's process waiter, a client's connection).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
