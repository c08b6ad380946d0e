package clientsuite_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/apitest"
	"github.com/quillhq/quill/internal/auth"
)

// rateLimited writes the SPEC §3 answer for 429 exactly: problem+json with
// code rate_limited, retry same_key, and Retry-After.
func rateLimited(w http.ResponseWriter, retryAfter string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Retry-After", retryAfter)
	w.WriteHeader(http.StatusTooManyRequests)
	fmt.Fprint(w, `{"type":"urn:quill:problem:rate_limited","title":"Too Many Requests","status":429,`+
		`"detail":"past QUILL_TENANT_CONCURRENCY; nothing was executed","code":"rate_limited","retry":"same_key"}`)
}

// limitPosts answers the first n POSTs (n < 0: all) with 429 and counts
// every POST.
func limitPosts(api *apitest.API, n int64, retryAfter string) *atomic.Int64 {
	var posts atomic.Int64
	api.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				if i := posts.Add(1); n < 0 || i <= n {
					rateLimited(w, retryAfter)
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	})
	return &posts
}

func Test429IsRetriedAfterRetryAfterUnderTheSameKey(t *testing.T) {
	t.Parallel()
	api := apitest.Start(t)
	var keys []string
	posts := limitPosts(api, 2, "1")
	c, err := client.New(client.Config{BaseURL: api.URL, Token: api.Token, BaseDelay: time.Millisecond,
		HTTPClient: &http.Client{Transport: keyRecorder(&keys)}})
	require.NoError(t, err)
	start := time.Now()
	got, err := c.CreateNote(t.Context(), client.NewNote{Title: "after 429"})
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), 2*time.Second, "Retry-After: 1 was waited twice")
	require.Equal(t, 3, got.Attempts, "each 429 counts as an attempt")
	require.EqualValues(t, 3, posts.Load())
	require.Len(t, keys, 3)
	require.Equal(t, keys[0], keys[1])
	require.Equal(t, keys[0], keys[2], "every retry has the same key")
	require.Equal(t, got.Key, keys[0])
	require.Equal(t, 1, api.Notes(t, "after 429"))
}

func Test429CountsAgainstTheAttemptBudget(t *testing.T) {
	t.Parallel()
	api := apitest.Start(t)
	posts := limitPosts(api, -1, "1")
	c, err := client.New(client.Config{BaseURL: api.URL, Token: api.Token, Attempts: 3,
		BaseDelay: time.Millisecond, MaxRetryAfter: 50 * time.Millisecond})
	require.NoError(t, err)
	start := time.Now()
	_, err = c.CreateNote(t.Context(), client.NewNote{Title: "never"}, client.WithKey("k-429"))
	require.Less(t, time.Since(start), 900*time.Millisecond, "Retry-After: 1 was capped at MaxRetryAfter")
	var u *client.UnknownOutcomeError
	require.ErrorAs(t, err, &u)
	require.Equal(t, "k-429", u.Key)
	require.Equal(t, 3, u.Attempts)
	require.EqualValues(t, 3, posts.Load(), "no more requests than Attempts")
	var p *client.Problem
	require.ErrorAs(t, u.Cause, &p)
	require.Equal(t, "rate_limited", p.Code)
	require.Equal(t, time.Second, p.RetryAfter)
	require.Equal(t, "not_found", u.Lookup, "nothing was executed")
	require.Zero(t, api.Notes(t, "never"))
}

func TestLookupWaitsOutA429(t *testing.T) {
	t.Parallel()
	api := apitest.Start(t)
	var lookups atomic.Int64
	api.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == http.MethodPost:
				rateLimited(w, "1")
				return
			case strings.HasPrefix(r.URL.Path, "/v1/operations/") && lookups.Add(1) == 1:
				rateLimited(w, "1")
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	c, err := client.New(client.Config{BaseURL: api.URL, Token: api.Token, Attempts: 1, BaseDelay: time.Millisecond})
	require.NoError(t, err)
	_, err = c.CreateNote(t.Context(), client.NewNote{Title: "lookup limited"})
	var u *client.UnknownOutcomeError
	require.ErrorAs(t, err, &u)
	require.Equal(t, "not_found", u.Lookup, "the lookup's 429 is an answer for now, asked again")
	require.EqualValues(t, 2, lookups.Load())
}

// TestFailedAuthenticationsAre429ThenTheClientGetsThrough runs the real API:
// distinct bad tokens from one address spend its budget (decision 0042) and
// are then answered 429 rate_limited, with the SPEC's problem; a client with
// a valid but never-seen token from that address is told to wait, waits
// Retry-After, and gets through under the same key.
func TestFailedAuthenticationsAre429ThenTheClientGetsThrough(t *testing.T) {
	t.Parallel()
	api := apitest.Start(t)
	bad := func(i int) string { return fmt.Sprintf("Bearer qt_%08x_%s", i, strings.Repeat("A", 43)) }
	codes := map[int]int{}
	var last *http.Response
	for i := range auth.DefaultFailureBurst + 5 {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, api.URL+"/v1/notes", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", bad(i))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		codes[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests {
			last = resp
			var p client.Problem
			require.NoError(t, decodeJSON(resp, &p))
			require.Equal(t, "rate_limited", p.Code)
			require.Equal(t, contract.RetrySameKey, p.Retry)
			require.Equal(t, 429, p.Status)
		}
		resp.Body.Close()
	}
	require.Equal(t, map[int]int{401: auth.DefaultFailureBurst, 429: 5}, codes)
	require.Equal(t, "application/problem+json", last.Header.Get("Content-Type"))
	require.NotEmpty(t, last.Header.Get("Retry-After"))
	require.Equal(t, fmt.Sprintf(`"auth";q=%d;w=%d`, auth.DefaultFailureBurst, int(float64(auth.DefaultFailureBurst)/auth.DefaultFailuresPerSecond)),
		last.Header.Get("RateLimit-Policy"))
	require.Equal(t, `"auth";r=0;t=`+last.Header.Get("Retry-After"), last.Header.Get("RateLimit"))

	tok, err := auth.Create(t.Context(), api.Pool, api.Tenant, time.Now())
	require.NoError(t, err)
	c, err := client.New(client.Config{BaseURL: api.URL, Token: tok, BaseDelay: time.Millisecond})
	require.NoError(t, err)
	got, err := c.CreateNote(t.Context(), client.NewNote{Title: "through"})
	require.NoError(t, err)
	require.Equal(t, 2, got.Attempts, "one 429, then through after Retry-After")
	require.Equal(t, 1, api.Notes(t, "through"))
}

func decodeJSON(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }

// keyRecorder is a transport that records each POST's Idempotency-Key.
func keyRecorder(keys *[]string) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodPost {
			*keys = append(*keys, r.Header.Get("Idempotency-Key"))
		}
		return http.DefaultTransport.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
