package clientsuite_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/problem"
)

// The client declares its own Problem, since a public package must not hand
// out internal types; this test keeps it in step with the server's: every
// member the server writes is decoded, and none is lost.
func TestProblemDecodesEveryMemberTheServerWrites(t *testing.T) {
	t.Parallel()
	sent := problem.New(http.StatusUnprocessableEntity, contract.CodeKeyReused, "the key was used for other parameters")
	sent.Errors = []problem.FieldError{{Field: "title", Message: "differs"}}
	sent.Fields = []string{"title"}
	sent.Resource = "/v1/notes/0190b6c4-5a3e-7b6f-8d2c-1e9a4f3b2c1d"
	sent.RetryAfter = 7
	sent.CurrentVersion = 4
	v := reflect.ValueOf(*sent)
	for i := range v.NumField() {
		require.False(t, v.Field(i).IsZero(), "set problem.Problem.%s in this test", v.Type().Field(i).Name)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { sent.Write(w) }))
	t.Cleanup(srv.Close)

	c, err := client.New(client.Config{BaseURL: srv.URL, Token: "t", Attempts: 1})
	require.NoError(t, err)
	_, err = c.GetNote(t.Context(), "0190b6c4-5a3e-7b6f-8d2c-1e9a4f3b2c1d")
	var got *client.Problem
	require.True(t, errors.As(err, &got), "%v", err)

	var want, decoded map[string]any
	require.NoError(t, json.Unmarshal(sent.JSON(), &want))
	b, err := json.Marshal(got)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &decoded))
	require.Equal(t, want, decoded)
	require.Equal(t, 7*time.Second, got.RetryAfter)
}
