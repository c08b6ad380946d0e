package client

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLimitsJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    Limits
		wantErr string
	}{
		{in: `{"response_retention":"72h","key_retention":"720h","max_body_bytes":2097152,"max_attachment_bytes":1048576,"tenant_concurrency":32}`,
			want: Limits{ResponseRetention: 72 * time.Hour, KeyRetention: 720 * time.Hour, MaxBodyBytes: 2097152, MaxAttachmentBytes: 1048576, TenantConcurrency: 32}},
		{in: `{"response_retention":"1h","key_retention":"1h30m","extra":true}`,
			want: Limits{ResponseRetention: time.Hour, KeyRetention: 90 * time.Minute}},
		{in: `{"response_retention":"720h0m0s","key_retention":"720h0m0s"}`,
			want: Limits{ResponseRetention: 720 * time.Hour, KeyRetention: 720 * time.Hour}},
		{in: `{"response_retention":"72h"}`, wantErr: "key_retention"},
		{in: `{"response_retention":"72h","key_retention":"30 days"}`, wantErr: "key_retention"},
		{in: `{"response_retention":"72h","key_retention":"0s"}`, wantErr: "key_retention"},
		{in: `{"response_retention":"72h","key_retention":"-1h"}`, wantErr: "key_retention"},
		{in: `{"response_retention":720,"key_retention":"720h"}`, wantErr: "string"},
		{in: `{"key_retention":"720h"}`, wantErr: "response_retention"},
		{in: `[]`, wantErr: "array"},
	} {
		var l Limits
		err := json.Unmarshal([]byte(tc.in), &l)
		if tc.wantErr != "" {
			require.ErrorContains(t, err, tc.wantErr, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, l, tc.in)
	}
	b, err := json.Marshal(Limits{ResponseRetention: 72 * time.Hour, KeyRetention: 720 * time.Hour, MaxBodyBytes: 1, MaxAttachmentBytes: 2, TenantConcurrency: 3})
	require.NoError(t, err)
	require.JSONEq(t, `{"response_retention":"72h","key_retention":"720h","max_body_bytes":1,"max_attachment_bytes":2,"tenant_concurrency":3}`, string(b))
}
