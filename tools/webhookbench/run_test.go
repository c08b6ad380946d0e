package main

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/whsecret"
)

func TestBucketQuantile(t *testing.T) {
	before := histogram{"0.01": 10, "0.1": 10, "1": 10, "+Inf": 10}
	for _, tc := range []struct {
		name  string
		after histogram
		le    string
		n     float64
	}{
		{"all under 10 ms", histogram{"0.01": 110, "0.1": 110, "1": 110, "+Inf": 110}, "0.01", 100},
		{"the 99th in the 100 ms bucket", histogram{"0.01": 108, "0.1": 110, "1": 110, "+Inf": 110}, "0.1", 100},
		{"the slowest past every bound", histogram{"0.01": 10, "0.1": 10, "1": 10, "+Inf": 20}, "+Inf", 10},
		{"nothing observed", histogram{"0.01": 10, "0.1": 10, "1": 10, "+Inf": 10}, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			le, n := bucketQuantile(before, tc.after, 0.99)
			require.Equal(t, tc.le, le)
			require.Equal(t, tc.n, n)
		})
	}
}

func TestReceiverVerifies(t *testing.T) {
	secret, err := whsecret.NewSecret()
	require.NoError(t, err)
	other, err := whsecret.NewSecret()
	require.NoError(t, err)
	rc := newReceiver()
	rc.secret, err = secretKey(secret)
	require.NoError(t, err)
	body := []byte(`{"id":"x"}`)
	now := time.Now().Unix()
	sign := func(s string, ts int64, b []byte) string {
		sig, err := whsecret.Sign([]string{s}, "msg_1", ts, b)
		require.NoError(t, err)
		return sig
	}
	for _, tc := range []struct {
		name string
		ts   int64
		sig  string
		ok   bool
	}{
		{"signed with the secret", now, sign(secret, now, body), true},
		{"the right one among several", now, sign(other, now, body) + " " + sign(secret, now, body), true},
		{"another secret", now, sign(other, now, body), false},
		{"another body", now, sign(secret, now, []byte(`{}`)), false},
		{"ten minutes old", now - 600, sign(secret, now-600, body), false},
		{"not v1", now, "v2," + sign(secret, now, body)[3:], false},
		{"garbage", now, "v1,@@@", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.ok, rc.verify("msg_1", strconv.FormatInt(tc.ts, 10), tc.sig, body))
		})
	}
}

func TestBadInvocations(t *testing.T) {
	key := "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
	for _, args := range [][]string{
		{"--events", "0", "--secret-key", key},
		{"--duration", "0s", "--secret-key", key},
		{},
		{"--secret-key", "not base64"},
		{"--secret-key", key, "extra"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr)
		var ue cli.UsageError
		require.True(t, errors.As(err, &ue), "%v: %v", args, err)
	}
}
