package webhooktest_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/webhooktest"
	"github.com/quillhq/quill/internal/whsecret"
)

// plainID is an id that survives HTTP unchanged (Node trims a header's
// surrounding spaces and reads its bytes as Latin-1).
var plainID = regexp.MustCompile(`^[\x21-\x7e]+$`)

// FuzzReceiverAnswersEveryDelivery sends the receiver deliveries with any
// id, timestamp, signature and body, signed by whsecret.Sign or not: it
// answers each with 200, 400, 401 or 413 and keeps running; one that
// whsecret signed with a plain id and a UTF-8 JSON body is accepted (so the
// library agrees with Sign on every such input, not just the test's).
func FuzzReceiverAnswersEveryDelivery(f *testing.F) {
	sec, err := whsecret.NewSecret()
	require.NoError(f, err)
	r := webhooktest.Start(f, sec)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	f.Cleanup(c.CloseIdleConnections)

	f.Add("msg_1", "", "", []byte(`{"a":1}`), true)
	f.Add("msg_2", "1700000000", "v1,AAAA", []byte(`{}`), false)
	f.Add("", "", "", []byte(nil), false)
	f.Add("msg_3", "not a number", "v1", []byte(`[`), false)
	f.Add("msg é", "", "", []byte(`"\u00e9"`), true)
	f.Add("msg_4", "", "", []byte("{\"x\":\"\xff\"}"), true)
	f.Add("msg_5", "", "", []byte(`   `), true)
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte, sign bool) {
		if sign {
			now := time.Now().Unix()
			ts = strconv.FormatInt(now, 10)
			var err error
			sig, err = whsecret.Sign([]string{sec}, id, now, body)
			require.NoError(t, err)
		}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, r.URL+"/hooks", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", ts)
		req.Header.Set("webhook-signature", sig)
		resp, err := c.Do(req)
		if err != nil {
			// Go's client refuses to send a header value with control
			// characters; the receiver never saw it.
			return
		}
		resp.Body.Close()
		require.Contains(t, []int{200, 400, 401, 413}, resp.StatusCode)
		// The library hashes the body decoded as UTF-8, so only a valid
		// UTF-8 body verifies (json.Valid alone lets invalid bytes in a
		// string through); Quill's CloudEvents always are.
		if sign && plainID.MatchString(id) && json.Valid(body) && utf8.Valid(body) {
			require.Equal(t, http.StatusOK, resp.StatusCode, "id %q body %q", id, body)
		}
	})
	// Still running after all of it (the cleanup also fails an early exit).
	r.Stats(f)
}
