package problem_test

import (
	"regexp"
	"testing"

	"github.com/quillhq/quill/internal/problem"
)

// A request id is 24 lowercase hex digits, and ids do not repeat.
func TestNewRequestID(t *testing.T) {
	t.Parallel()
	valid := regexp.MustCompile(`^[0-9a-f]{24}$`)
	seen := make(map[string]bool, 10000)
	for range 10000 {
		id := problem.NewRequestID()
		if !valid.MatchString(id) {
			t.Fatalf("request id %q is not 24 hex digits", id)
		}
		if seen[id] {
			t.Fatalf("request id %q came twice", id)
		}
		seen[id] = true
	}
}
