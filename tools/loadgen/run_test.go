package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/cli"
)

// TestRateSchedulesRequests: with --rate the requests follow the schedule —
// about rate × duration of them, whatever the concurrency — and the result
// says which rate was asked for.
func TestRateSchedulesRequests(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	var out, errOut bytes.Buffer
	args := []string{"--url", srv.URL, "--token", "t", "--concurrency", "8", "--rate", "200",
		"--duration", "1s", "--warmup", "0s", "--json"}
	if err := run(t.Context(), args, func(string) string { return "" }, &out, &errOut); err != nil {
		t.Fatalf("run: %v (%s)", err, errOut.String())
	}
	var res result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("result %q: %v", out.String(), err)
	}
	if res.TargetRate != 200 {
		t.Errorf("target_rate = %v, want 200", res.TargetRate)
	}
	// 200 slots fall in the second; allow for a slow machine at the end.
	if res.OK < 180 || res.OK > 201 || n.Load() > 201 {
		t.Errorf("ok = %d, server saw %d; want about 200", res.OK, n.Load())
	}
	if res.MaxSendLagMs > float64(500*time.Millisecond/time.Millisecond) {
		t.Errorf("max send lag %v ms", res.MaxSendLagMs)
	}
}

func TestRateMustNotBeNegative(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"--token", "t", "--rate", "-1"}, func(string) string { return "" }, &out, &errOut)
	var uerr cli.UsageError
	if !errors.As(err, &uerr) {
		t.Fatalf("err = %v, want a usage error", err)
	}
}

func TestVersionFlag(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(t.Context(), []string{"--version"}, func(string) string { return "" }, &stdout, &stderr))
	require.True(t, strings.HasPrefix(stdout.String(), "loadgen "), stdout.String())
	require.Empty(t, stderr.String())
}
