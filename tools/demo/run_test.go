package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/clitest"
)

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{name: "no token", env: map[string]string{}, want: "no token"},
		{name: "bad url", env: map[string]string{"QUILL_TOKEN": "t"}, args: []string{"--url", "ftp://x"}, want: "invalid QUILL_URL"},
		{name: "bad wait", env: map[string]string{"QUILL_TOKEN": "t", "QUILL_DEMO_WAIT": "soon"}, want: "QUILL_DEMO_WAIT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := clitest.RunOut(t, run, clitest.Env(tt.env), tt.args...)
			var uerr cli.UsageError
			if !errors.As(err, &uerr) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want a usage error containing %q", err, tt.want)
			}
		})
	}
}

// An API that forgets idempotency — every POST makes a new note — must be
// caught at the retry, not reported as a success.
func TestDemoCatchesAnAPIThatExecutesTwice(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/notes":
			fmt.Fprint(w, `{"items":[],"next_cursor":null}`)
		case r.Method == http.MethodPost && r.URL.Path == "/v1/notes":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"note-%d","title":"x"}`, n.Add(1))
		default:
			http.NotFound(w, r)
		}
	}))
	defer api.Close()

	out, _, err := clitest.RunOut(t, run, clitest.Env(map[string]string{"QUILL_URL": api.URL, "QUILL_TOKEN": "t"}))
	var f failed
	if !errors.As(err, &f) || f.step != "2" || !strings.Contains(f.msg, "Idempotent-Replayed") {
		t.Fatalf("err = %v, want step 2 to fail on the missing replay; output:\n%s", err, out)
	}
	if got := n.Load(); got != 2 {
		t.Fatalf("the API saw %d creates, want 2 (the dropped one and the retry)", got)
	}
}

func TestDemoRefusesWhenTheAPIIsDown(t *testing.T) {
	t.Parallel()
	api := httptest.NewServer(http.NotFoundHandler())
	url := api.URL
	api.Close()
	_, _, err := clitest.RunOut(t, run, clitest.Env(map[string]string{"QUILL_URL": url, "QUILL_TOKEN": "t"}))
	if err == nil || !strings.Contains(err.Error(), "make dev") {
		t.Fatalf("err = %v, want a hint to start the system", err)
	}
}
