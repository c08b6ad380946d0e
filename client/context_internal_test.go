package client

import (
	"context"
	"testing"
)

// testContext is a context that ends with the test (testing.T.Context's
// job, which needs Go 1.24: the module's go line is what the package
// needs, 1.22, and its tests keep to it).
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}
