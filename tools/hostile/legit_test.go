package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLegitBody: a resend is byte for byte the first send (the API would
// answer 422 idempotency_key_reused otherwise), the title carries the key
// the integrity check looks for, and only the ops that say so carry the PNG.
func TestLegitBody(t *testing.T) {
	t.Parallel()
	l := newLegit(config{legitClients: 1, runID: "h-test", legitTokens: []string{"t"}, url: defaultURL})
	for _, attach := range []bool{false, true} {
		op := l.newOp("q", 0, 7, attach)
		require.Equal(t, "h-test-q-0-7", op.key)
		b := l.body(op)
		require.Equal(t, b, l.body(op))
		var v struct {
			Title      string `json:"title"`
			Attachment *struct {
				ContentType string `json:"content_type"`
				Data        []byte `json:"data"`
			} `json:"attachment"`
		}
		require.NoError(t, json.Unmarshal(b, &v))
		require.Equal(t, legitTitlePrefix+op.key, v.Title)
		if !attach {
			require.Nil(t, v.Attachment)
			continue
		}
		require.NotNil(t, v.Attachment)
		require.Equal(t, "image/png", v.Attachment.ContentType)
		require.Greater(t, len(v.Attachment.Data), 60<<10)
	}
}
