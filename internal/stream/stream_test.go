package stream_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/stream"
)

func TestSubjects(t *testing.T) {
	t.Parallel()
	require.Equal(t, "quill.acme.note.created", stream.Subject("quill", "acme", "note.created"))
	require.Equal(t, "quill.>", stream.All("quill"))
	require.Equal(t, "quill.acme.>", stream.OfTenant("quill", "acme"))
	require.Equal(t, "quill.*.note.created", stream.OfType("quill", "note.created"))
	for _, tc := range []struct{ prefix, subject, tenant string }{
		{"quill", "quill.acme.note.created", "acme"},
		{"quill", "quill.acme", "acme"},
		{"quill", "other.acme.note.created", ""},
		{"quill", "quillx.acme.note.created", ""},
	} {
		require.Equal(t, tc.tenant, stream.Tenant(tc.prefix, tc.subject), tc.subject)
	}
}

func TestConfigDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	c := stream.Config{}.WithDefaults()
	require.Equal(t, stream.Config{Name: stream.DefaultName, SubjectPrefix: stream.DefaultSubjectPrefix,
		DuplicateWindow: stream.DefaultDuplicateWindow, MaxAge: stream.DefaultMaxAge}, c)
	require.NoError(t, c.Validate())
	require.NoError(t, stream.Config{DuplicateWindow: time.Hour, MaxAge: time.Hour}.Validate())
	err := stream.Config{DuplicateWindow: 2 * time.Hour, MaxAge: time.Hour}.Validate()
	require.ErrorContains(t, err, "QUILL_DUPLICATE_WINDOW 2h0m0s")
	require.ErrorContains(t, err, "QUILL_STREAM_MAX_AGE 1h0m0s")
}

// Provision creates the stream and updates it to the definition;
// ProvisionIfMissing creates a missing one but leaves an existing one as it
// is.
func TestProvision(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx := t.Context()

	c := stream.Config{Name: "OWNED", SubjectPrefix: "owned", DuplicateWindow: time.Minute, MaxAge: time.Hour}
	st, err := stream.Provision(ctx, js, c)
	require.NoError(t, err)
	require.Equal(t, c.StreamConfig().Subjects, st.CachedInfo().Config.Subjects)
	require.Equal(t, jetstream.FileStorage, st.CachedInfo().Config.Storage)
	c.DuplicateWindow = 2 * time.Minute
	st, err = stream.Provision(ctx, js, c)
	require.NoError(t, err)
	require.Equal(t, 2*time.Minute, st.CachedInfo().Config.Duplicates, "an existing stream is updated")

	c.DuplicateWindow = 3 * time.Minute
	st, err = stream.ProvisionIfMissing(ctx, js, c)
	require.NoError(t, err)
	require.Equal(t, 2*time.Minute, st.CachedInfo().Config.Duplicates, "an existing stream is left as it is")

	missing := stream.Config{Name: "CREATED", SubjectPrefix: "created", DuplicateWindow: time.Minute, MaxAge: time.Hour}
	st, err = stream.ProvisionIfMissing(ctx, js, missing)
	require.NoError(t, err)
	require.Equal(t, []string{"created.>"}, st.CachedInfo().Config.Subjects)
	require.Equal(t, time.Hour, st.CachedInfo().Config.MaxAge)

	_, err = stream.Provision(ctx, js, stream.Config{Name: "CLASH", SubjectPrefix: "owned", DuplicateWindow: time.Minute, MaxAge: time.Hour})
	require.ErrorContains(t, err, "provision stream CLASH", "the error names the stream")
}
