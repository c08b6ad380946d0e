package whsecret_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/whsecret"
)

const (
	keyA = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=" // "0123456789abcdef0123456789abcdef"
	keyB = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA="
)

func TestParseKeys(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, err string
	}{
		{"one", keyA, ""},
		{"two", keyA + "," + keyB, ""},
		{"spaces", " " + keyA + " , " + keyB + " ", ""},
		{"empty", "", "is not set"},
		{"blank", "  ", "is not set"},
		{"not base64", "not base64!", "key 1 is not the base64 of 32 bytes"},
		{"16 bytes", base64.StdEncoding.EncodeToString(make([]byte, 16)), "key 1 is not the base64 of 32 bytes"},
		{"second bad", keyA + ",x", "key 2 is not"},
		{"twice", keyA + "," + keyA, "key 2 is given twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := whsecret.ParseKeys(tt.in)
			if tt.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.err)
			require.ErrorContains(t, err, whsecret.KeyEnv)
		})
	}
}

func TestSealOpen(t *testing.T) {
	t.Parallel()
	a, err := whsecret.ParseKeys(keyA)
	require.NoError(t, err)
	ba, err := whsecret.ParseKeys(keyB + "," + keyA) // B seals now, A still opens
	require.NoError(t, err)
	b, err := whsecret.ParseKeys(keyB)
	require.NoError(t, err)

	secret, err := whsecret.NewSecret()
	require.NoError(t, err)
	sealed, err := a.Seal(secret, "t1", "e1")
	require.NoError(t, err)
	require.NotContains(t, string(sealed), strings.TrimPrefix(secret, whsecret.Prefix))

	tests := []struct {
		name       string
		keys       *whsecret.Keys
		sealed     []byte
		tenant, id string
		ok         bool
	}{
		{"same key and endpoint", a, sealed, "t1", "e1", true},
		{"rotated keys open the old seal", ba, sealed, "t1", "e1", true},
		{"another key", b, sealed, "t1", "e1", false},
		{"another endpoint", a, sealed, "t1", "e2", false},
		{"another tenant", a, sealed, "t2", "e1", false},
		{"truncated", a, sealed[:10], "t1", "e1", false},
		{"empty", a, nil, "t1", "e1", false},
		{"flipped byte", a, flip(sealed, len(sealed)-1), "t1", "e1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.keys.Open(tt.sealed, tt.tenant, tt.id)
			if tt.ok {
				require.NoError(t, err)
				require.Equal(t, secret, got)
				return
			}
			require.True(t, errors.Is(err, whsecret.ErrOpen), "err = %v", err)
		})
	}

	// Two seals of one secret differ (a fresh nonce each).
	again, err := a.Seal(secret, "t1", "e1")
	require.NoError(t, err)
	require.NotEqual(t, sealed, again)
	// The rotated set seals under B: A alone cannot open it.
	nb, err := ba.Seal(secret, "t1", "e1")
	require.NoError(t, err)
	_, err = a.Open(nb, "t1", "e1")
	require.ErrorIs(t, err, whsecret.ErrOpen)
}

func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 1
	return c
}

func TestNewSecret(t *testing.T) {
	t.Parallel()
	s1, err := whsecret.NewSecret()
	require.NoError(t, err)
	s2, err := whsecret.NewSecret()
	require.NoError(t, err)
	require.NotEqual(t, s1, s2)
	require.True(t, strings.HasPrefix(s1, "whsec_"))
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s1, "whsec_"))
	require.NoError(t, err)
	require.Len(t, raw, 32)
}

// The Standard Webhooks specification's own example (its README's
// "Signature scheme" test vector, as its libraries' tests use it).
func TestSignStandardWebhooksVector(t *testing.T) {
	t.Parallel()
	const (
		secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		id     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		ts     = int64(1614265330)
		body   = `{"test": 2432232314}`
		want   = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	got, err := whsecret.Sign([]string{secret}, id, ts, []byte(body))
	require.NoError(t, err)
	require.Equal(t, want, got)
	ok, err := whsecret.Verify(secret, got, id, ts, []byte(body))
	require.NoError(t, err)
	require.True(t, ok)
}

func TestSignAndVerify(t *testing.T) {
	t.Parallel()
	cur, err := whsecret.NewSecret()
	require.NoError(t, err)
	prev, err := whsecret.NewSecret()
	require.NoError(t, err)
	body := []byte(`{"id":"e1"}`)
	both, err := whsecret.Sign([]string{cur, prev}, "e1", 100, body)
	require.NoError(t, err)
	require.Len(t, strings.Fields(both), 2)

	tests := []struct {
		name, secret, header, id string
		ts                       int64
		body                     string
		ok                       bool
	}{
		{"current secret", cur, both, "e1", 100, string(body), true},
		{"previous secret", prev, both, "e1", 100, string(body), true},
		{"another body", cur, both, "e1", 100, `{"id":"e2"}`, false},
		{"another id", cur, both, "e2", 100, string(body), false},
		{"another timestamp", cur, both, "e1", 101, string(body), false},
		{"v2 scheme ignored", cur, strings.ReplaceAll(both, "v1,", "v2,"), "e1", 100, string(body), false},
		{"garbage", cur, "v1,!!! nonsense", "e1", 100, string(body), false},
		{"empty header", cur, "", "e1", 100, string(body), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ok, err := whsecret.Verify(tt.secret, tt.header, tt.id, tt.ts, []byte(tt.body))
			require.NoError(t, err)
			require.Equal(t, tt.ok, ok)
		})
	}
	_, err = whsecret.Sign(nil, "e1", 1, body)
	require.Error(t, err)
	_, err = whsecret.Sign([]string{"whsec_!!"}, "e1", 1, body)
	require.Error(t, err)
	_, err = whsecret.Verify("whsec_!!", both, "e1", 1, body)
	require.Error(t, err)
}
