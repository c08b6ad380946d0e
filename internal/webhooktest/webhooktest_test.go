package webhooktest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/testkit"
	"github.com/quillhq/quill/internal/webhooktest"
	"github.com/quillhq/quill/internal/whsecret"
)

// delivery is one POST as the dispatcher sends it, before signing.
type delivery struct {
	id   string
	ts   int64
	body []byte
}

func newDelivery() delivery {
	id := uuid.NewString()
	return delivery{
		id:   id,
		ts:   time.Now().Unix(),
		body: []byte(`{"specversion":"1.0","id":"` + id + `","type":"quill.note.created.v1","source":"/quill","data":{"title":"café ☕"}}`),
	}
}

// sender posts deliveries with a client of its own, closed at cleanup.
type sender struct {
	t      *testing.T
	client *http.Client
	url    string
}

func newSender(t *testing.T, r *webhooktest.Receiver, timeout time.Duration) *sender {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	return &sender{t: t, client: c, url: r.URL + "/hooks/quill"}
}

// post sends d with the headers set as given (a signature made by
// whsecret.Sign unless sig is given) and returns the status, or the
// client's error.
func (s *sender) post(d delivery, headers map[string]string) (int, error) {
	s.t.Helper()
	req, err := http.NewRequestWithContext(s.t.Context(), http.MethodPost, s.url, bytes.NewReader(d.body))
	require.NoError(s.t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// signed returns the Standard Webhooks headers of d signed by secrets.
func signed(t *testing.T, d delivery, secrets ...string) map[string]string {
	t.Helper()
	sig, err := whsecret.Sign(secrets, d.id, d.ts, d.body)
	require.NoError(t, err)
	return map[string]string{
		"webhook-id":        d.id,
		"webhook-timestamp": strconv.FormatInt(d.ts, 10),
		"webhook-signature": sig,
	}
}

func secret(t *testing.T) string {
	t.Helper()
	s, err := whsecret.NewSecret()
	require.NoError(t, err)
	return s
}

func (s *sender) requireStatus(want int, d delivery, headers map[string]string) {
	s.t.Helper()
	got, err := s.post(d, headers)
	require.NoError(s.t, err)
	require.Equal(s.t, want, got)
}

// TestOurSignaturesVerifyWithTheStandardLibrary is the interop proof: what
// whsecret.Sign makes, the Standard Webhooks project's own JavaScript
// library accepts, and what it should refuse it refuses.
func TestOurSignaturesVerifyWithTheStandardLibrary(t *testing.T) {
	t.Parallel()
	current, other := secret(t), secret(t)
	r := webhooktest.Start(t, current)
	s := newSender(t, r, 10*time.Second)

	valid := newDelivery()
	s.requireStatus(http.StatusOK, valid, signed(t, valid, current))

	// A timestamp four minutes old is inside the library's tolerance.
	recent := newDelivery()
	recent.ts -= 4 * 60
	s.requireStatus(http.StatusOK, recent, signed(t, recent, current))

	rejected := map[string]func() (delivery, map[string]string){
		"wrong secret": func() (delivery, map[string]string) {
			d := newDelivery()
			return d, signed(t, d, other)
		},
		"body changed after signing": func() (delivery, map[string]string) {
			d := newDelivery()
			h := signed(t, d, current)
			d.body = bytes.Replace(d.body, []byte("café"), []byte("cafe"), 1)
			return d, h
		},
		"id changed after signing": func() (delivery, map[string]string) {
			d := newDelivery()
			h := signed(t, d, current)
			h["webhook-id"] = uuid.NewString()
			return d, h
		},
		"timestamp changed after signing": func() (delivery, map[string]string) {
			d := newDelivery()
			h := signed(t, d, current)
			h["webhook-timestamp"] = strconv.FormatInt(d.ts-1, 10)
			return d, h
		},
		"timestamp over five minutes old": func() (delivery, map[string]string) {
			d := newDelivery()
			d.ts -= 6 * 60
			return d, signed(t, d, current)
		},
		"timestamp over five minutes ahead": func() (delivery, map[string]string) {
			d := newDelivery()
			d.ts += 6 * 60
			return d, signed(t, d, current)
		},
		"signature of another version": func() (delivery, map[string]string) {
			d := newDelivery()
			h := signed(t, d, current)
			h["webhook-signature"] = "v1a" + h["webhook-signature"][2:]
			return d, h
		},
	}
	for name, mk := range rejected {
		d, h := mk()
		got, err := s.post(d, h)
		require.NoError(t, err, name)
		require.Equal(t, http.StatusUnauthorized, got, name)
	}

	badRequests := map[string]func() (delivery, map[string]string){
		"no signature": func() (delivery, map[string]string) {
			d := newDelivery()
			h := signed(t, d, current)
			delete(h, "webhook-signature")
			return d, h
		},
		"no id": func() (delivery, map[string]string) {
			d := newDelivery()
			h := signed(t, d, current)
			delete(h, "webhook-id")
			return d, h
		},
		"no timestamp": func() (delivery, map[string]string) {
			d := newDelivery()
			h := signed(t, d, current)
			delete(h, "webhook-timestamp")
			return d, h
		},
		"signed, but not JSON": func() (delivery, map[string]string) {
			d := newDelivery()
			d.body = []byte(`{"specversion":`)
			return d, signed(t, d, current)
		},
		"signed, but empty": func() (delivery, map[string]string) {
			d := newDelivery()
			d.body = nil
			return d, signed(t, d, current)
		},
	}
	for name, mk := range badRequests {
		d, h := mk()
		got, err := s.post(d, h)
		require.NoError(t, err, name)
		require.Equal(t, http.StatusBadRequest, got, name)
	}

	st := r.Stats(t)
	require.Equal(t, 2, st.Accepted)
	require.Equal(t, 0, st.Duplicates)
	require.Equal(t, len(rejected), st.Rejected)
	require.Equal(t, len(badRequests), st.BadRequests)
	require.Equal(t, map[string]int{valid.id: 1, recent.id: 1}, st.IDs)

	evs := r.Events(t)
	require.Len(t, evs, 2)
	require.Equal(t, valid.id, evs[0].ID)
	require.Equal(t, "/hooks/quill", evs[0].Path)
	require.JSONEq(t, string(valid.body), string(evs[0].Body))
}

// The receiver deduplicates by webhook-id: the same delivery twice (a
// retry after a timeout) has one effect, and the duplicate is counted.
func TestTheSameIDTwiceIsOneEffect(t *testing.T) {
	t.Parallel()
	sec := secret(t)
	r := webhooktest.Start(t, sec)
	s := newSender(t, r, 10*time.Second)
	d := newDelivery()
	s.requireStatus(http.StatusOK, d, signed(t, d, sec))
	// The retry is signed anew, with a later timestamp: still the same id.
	d.ts++
	s.requireStatus(http.StatusOK, d, signed(t, d, sec))

	st := r.Stats(t)
	require.Equal(t, 1, st.Accepted)
	require.Equal(t, 1, st.Duplicates)
	require.Equal(t, map[string]int{d.id: 2}, st.IDs)
	require.Len(t, r.Events(t), 1)
}

// During a rotation Quill signs with the new secret and the old one; a
// receiver that still has only the old secret, or already only the new
// one, or both, accepts.
func TestARotationVerifiesWithEitherSecret(t *testing.T) {
	t.Parallel()
	oldSecret, newSecret := secret(t), secret(t)
	for name, configured := range map[string][]string{
		"only the old secret": {oldSecret},
		"only the new secret": {newSecret},
		"both":                {newSecret, oldSecret},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := webhooktest.Start(t, configured...)
			s := newSender(t, r, 10*time.Second)
			d := newDelivery()
			s.requireStatus(http.StatusOK, d, signed(t, d, newSecret, oldSecret))
			require.Equal(t, 1, r.Stats(t).Accepted)
		})
	}

	// Configured with both, a delivery signed by the old secret alone (a
	// sender that has not rotated yet) verifies too.
	r := webhooktest.Start(t, newSecret, oldSecret)
	s := newSender(t, r, 10*time.Second)
	d := newDelivery()
	s.requireStatus(http.StatusOK, d, signed(t, d, oldSecret))
}

func TestFaults(t *testing.T) {
	t.Parallel()
	sec := secret(t)

	t.Run("fail the next N, then accept", func(t *testing.T) {
		t.Parallel()
		r := webhooktest.Start(t, sec)
		s := newSender(t, r, 10*time.Second)
		r.Control(t, webhooktest.Faults{FailNext: 2})
		d := newDelivery()
		h := signed(t, d, sec)
		s.requireStatus(http.StatusInternalServerError, d, h)
		s.requireStatus(http.StatusInternalServerError, d, h)
		s.requireStatus(http.StatusOK, d, h)
		st := r.Stats(t)
		require.Equal(t, 2, st.Failed)
		require.Equal(t, 1, st.Accepted)
		require.Equal(t, 0, st.Duplicates, "a failed delivery had no effect")
	})

	t.Run("another failure status", func(t *testing.T) {
		t.Parallel()
		r := webhooktest.Start(t, sec)
		s := newSender(t, r, 10*time.Second)
		r.Control(t, webhooktest.Faults{FailNext: 1, FailStatus: http.StatusServiceUnavailable})
		d := newDelivery()
		s.requireStatus(http.StatusServiceUnavailable, d, signed(t, d, sec))
		s.requireStatus(http.StatusOK, d, signed(t, d, sec))
	})

	t.Run("a bad signature is refused before any fault", func(t *testing.T) {
		t.Parallel()
		r := webhooktest.Start(t, sec)
		s := newSender(t, r, 10*time.Second)
		r.Control(t, webhooktest.Faults{FailNext: 1})
		d := newDelivery()
		s.requireStatus(http.StatusUnauthorized, d, signed(t, d, secret(t)))
		s.requireStatus(http.StatusInternalServerError, d, signed(t, d, sec))
	})

	t.Run("gone", func(t *testing.T) {
		t.Parallel()
		r := webhooktest.Start(t, sec)
		s := newSender(t, r, 10*time.Second)
		r.Control(t, webhooktest.Faults{Gone: true})
		d := newDelivery()
		s.requireStatus(http.StatusGone, d, signed(t, d, sec))
		s.requireStatus(http.StatusGone, d, signed(t, d, sec))
		r.Control(t, webhooktest.Faults{})
		s.requireStatus(http.StatusOK, d, signed(t, d, sec))
		st := r.Stats(t)
		require.Equal(t, 2, st.Gone)
		require.Equal(t, 1, st.Accepted)
	})

	t.Run("slow", func(t *testing.T) {
		t.Parallel()
		r := webhooktest.Start(t, sec)
		s := newSender(t, r, 10*time.Second)
		r.Control(t, webhooktest.Faults{Delay: 300 * time.Millisecond})
		d := newDelivery()
		start := time.Now()
		s.requireStatus(http.StatusOK, d, signed(t, d, sec))
		require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	})

	// The unknown outcome the issue names: the receiver has the effect, the
	// sender saw only its timeout. The retry under the same id is a
	// duplicate, not a second effect.
	t.Run("accept, then time out", func(t *testing.T) {
		t.Parallel()
		r := webhooktest.Start(t, sec)
		s := newSender(t, r, 500*time.Millisecond)
		r.Control(t, webhooktest.Faults{Hang: true})
		d := newDelivery()
		_, err := s.post(d, signed(t, d, sec))
		var ne net.Error
		require.True(t, errors.As(err, &ne) && ne.Timeout(), "the sender times out: %v", err)
		st := r.Stats(t)
		require.Equal(t, 1, st.Accepted, "the receiver recorded the delivery it never answered")
		require.Equal(t, 1, st.Held)

		r.Control(t, webhooktest.Faults{})
		d.ts++
		s.requireStatus(http.StatusOK, d, signed(t, d, sec))
		st = r.Stats(t)
		require.Equal(t, 1, st.Accepted)
		require.Equal(t, 1, st.Duplicates)
	})

	// Some deliveries answered, every second one recorded and held past
	// the sender's timeout; a retry of a held one may be answered.
	t.Run("accept some, hang on every second", func(t *testing.T) {
		t.Parallel()
		r := webhooktest.Start(t, sec)
		s := newSender(t, r, 500*time.Millisecond)
		r.Control(t, webhooktest.Faults{HangEvery: 2})
		var timedOut []int
		for i := range 4 {
			d := newDelivery()
			code, err := s.post(d, signed(t, d, sec))
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				timedOut = append(timedOut, i)
				continue
			}
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code, "delivery %d", i)
		}
		require.Equal(t, []int{1, 3}, timedOut, "every second delivery is held")
		st := r.Stats(t)
		require.Equal(t, 4, st.Accepted, "a held delivery is recorded: the effect happened")
		require.Equal(t, 2, st.Held)
		testkit.WaitFor(t, 10*time.Second, func() bool { return r.Stats(t).Holding == 0 }, "the timed-out requests to be closed")

		// A new HangEvery counts from its Control.
		r.Control(t, webhooktest.Faults{HangEvery: 3})
		for range 2 {
			d := newDelivery()
			s.requireStatus(http.StatusOK, d, signed(t, d, sec))
		}
	})

	t.Run("holding counts the open held requests", func(t *testing.T) {
		t.Parallel()
		r := webhooktest.Start(t, sec)
		r.Control(t, webhooktest.Faults{Hang: true})
		s := newSender(t, r, time.Minute)
		d := newDelivery()
		ctx, cancel := context.WithCancel(t.Context())
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(d.body))
		require.NoError(t, err)
		for k, v := range signed(t, d, sec) {
			req.Header.Set(k, v)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := s.client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		testkit.WaitFor(t, 10*time.Second, func() bool { return r.Stats(t).Holding == 1 }, "the delivery to be held open")
		cancel()
		<-done
		testkit.WaitFor(t, 10*time.Second, func() bool { return r.Stats(t).Holding == 0 }, "the sender's close to end the hold")
		require.Equal(t, 1, r.Stats(t).Held)
	})

	t.Run("a held delivery does not stop the receiver's shutdown", func(t *testing.T) {
		t.Parallel()
		r := webhooktest.Start(t, sec)
		r.Control(t, webhooktest.Faults{Hang: true})
		// Never answered: the sender's context ends it at the test's end,
		// and the cleanup's SIGTERM must still stop the receiver at once.
		s := newSender(t, r, time.Minute)
		d := newDelivery()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.url, bytes.NewReader(d.body))
		require.NoError(t, err)
		for k, v := range signed(t, d, sec) {
			req.Header.Set(k, v)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := s.client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		t.Cleanup(func() { <-done })
		testkit.WaitFor(t, 10*time.Second, func() bool { return r.Stats(t).Held == 1 }, "the delivery to be held")
	})
}

// A receiver started without secrets refuses everything until it is given
// one; SetSecrets replaces them (a rotation's new secret alone), and a bad
// list changes nothing.
func TestSecretsGivenLater(t *testing.T) {
	t.Parallel()
	first, second := secret(t), secret(t)
	r := webhooktest.Start(t)
	s := newSender(t, r, 10*time.Second)
	d := newDelivery()
	s.requireStatus(http.StatusUnauthorized, d, signed(t, d, first))

	r.SetSecrets(t, first)
	s.requireStatus(http.StatusOK, d, signed(t, d, first))

	r.SetSecrets(t, second)
	d2 := newDelivery()
	s.requireStatus(http.StatusUnauthorized, d2, signed(t, d2, first))
	s.requireStatus(http.StatusOK, d2, signed(t, d2, second, first))

	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	for _, body := range []string{
		`{"secrets":"` + first + `"}`,
		`{"secrets":["whsec_not base64!"]}`,
		`{"secrets":[7]}`,
		`{"secrets":["` + first + `"],"hang":"yes"}`,
	} {
		resp, err := c.Post(r.URL+"/control", "application/json", bytes.NewReader([]byte(body)))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", body)
	}
	d3 := newDelivery()
	s.requireStatus(http.StatusUnauthorized, d3, signed(t, d3, first))
	s.requireStatus(http.StatusOK, d3, signed(t, d3, second))
	require.Equal(t, 3, r.Stats(t).Rejected, "d before any secret, d2 and d3 signed by the replaced one")
}

// Requests that are no delivery at all: the receiver answers each and
// keeps running (the cleanup fails the test if it exited).
func TestUnreadableRequestsAreAnswered(t *testing.T) {
	t.Parallel()
	r := webhooktest.Start(t, secret(t))
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	for _, tc := range []struct {
		method, path, body string
		want               int
	}{
		{http.MethodPost, "/control", `{"fail_next":`, http.StatusBadRequest},
		{http.MethodPost, "/control", `[1]`, http.StatusBadRequest},
		{http.MethodPost, "/control", `{"fail_next":-1}`, http.StatusBadRequest},
		{http.MethodPost, "/control", `{"hang":"yes"}`, http.StatusBadRequest},
		{http.MethodPost, "/control", `{"fail_status":99}`, http.StatusBadRequest},
		{http.MethodPost, "/control", `{"shout":true}`, http.StatusBadRequest},
		{http.MethodPost, "/control", `null`, http.StatusBadRequest},
		{http.MethodGet, "/control", ``, http.StatusOK},
		{http.MethodDelete, "/stats", ``, http.StatusMethodNotAllowed},
		{http.MethodPost, "/stats", `{}`, http.StatusMethodNotAllowed},
		{http.MethodGet, "/hooks", ``, http.StatusMethodNotAllowed},
		{http.MethodPost, "/hooks", string(bytes.Repeat([]byte("x"), 1<<20+1)), http.StatusRequestEntityTooLarge},
	} {
		req, err := http.NewRequestWithContext(t.Context(), tc.method, r.URL+tc.path, bytes.NewReader([]byte(tc.body)))
		require.NoError(t, err)
		resp, err := c.Do(req)
		require.NoError(t, err, "%s %s", tc.method, tc.path)
		var problem map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&problem)
		resp.Body.Close()
		require.Equal(t, tc.want, resp.StatusCode, "%s %s %.40q: %v", tc.method, tc.path, tc.body, problem)
	}
	// A request line that is no HTTP at all.
	conn, err := net.Dial("tcp", r.URL[len("http://"):])
	require.NoError(t, err)
	_, err = conn.Write([]byte("GARBAGE\r\n\r\n"))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	line := make([]byte, 12)
	_, err = io.ReadFull(conn, line)
	require.NoError(t, err)
	require.Equal(t, "HTTP/1.1 400", string(line))
	conn.Close()

	require.Equal(t, webhooktest.Stats{BadRequests: 1, IDs: map[string]int{}}, r.Stats(t), "a faulty /control changed nothing")
}
