package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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

// TestSeedCreatesCountNotesWithAttachment: seed mode sends exactly --count
// creates, each with the named fixture as its attachment, and exits.
func TestSeedCreatesCountNotesWithAttachment(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	var bad atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		var body struct {
			Title      string `json:"title"`
			Attachment *struct {
				ContentType string `json:"content_type"`
				Data        []byte `json:"data"`
			} `json:"attachment"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Attachment == nil ||
			body.Attachment.ContentType != "image/png" || len(body.Attachment.Data) < 1000 {
			bad.Store(fmt.Sprintf("body: %v, attachment %+v", err, body.Attachment))
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	var out, errOut bytes.Buffer
	args := []string{"--url", srv.URL, "--token", "t", "--concurrency", "4", "--mode", "seed", "--count", "37",
		"--attachment", "png64k", "--json"}
	require.NoError(t, run(t.Context(), args, func(string) string { return "" }, &out, &errOut), errOut.String())
	require.Nil(t, bad.Load())
	require.EqualValues(t, 37, n.Load())
	var res struct {
		Created int `json:"created"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
	require.Equal(t, 37, res.Created)
}

func TestUnknownAttachmentIsAUsageError(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"--token", "t", "--attachment", "gif"}, func(string) string { return "" }, &out, &errOut)
	var uerr cli.UsageError
	require.ErrorAs(t, err, &uerr)
}
