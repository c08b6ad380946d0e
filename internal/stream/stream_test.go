package stream_test

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/natstest"
	"github.com/quillhq/quill/internal/stream"
)

func TestSubjects(t *testing.T) {
	t.Parallel()
	require.Equal(t, "quill.acme.note.created", contract.Subject("quill", "acme", "note.created"))
	require.Equal(t, "quill.>", contract.AllSubjects("quill"))
	require.Equal(t, "quill.acme.>", contract.TenantSubjects("quill", "acme"))
	require.Equal(t, "quill.*.note.created", contract.TypeSubjects("quill", "note.created"))
	for _, tc := range []struct{ prefix, subject, tenant string }{
		{"quill", "quill.acme.note.created", "acme"},
		{"quill", "quill.acme", "acme"},
		{"quill", "other.acme.note.created", ""},
		{"quill", "quillx.acme.note.created", ""},
	} {
		require.Equal(t, tc.tenant, contract.SubjectTenant(tc.prefix, tc.subject), tc.subject)
	}
}

func TestConfigDefaultsAndValidate(t *testing.T) {
	t.Parallel()
	c := stream.Config{}.WithDefaults()
	require.Equal(t, stream.Config{Name: contract.DefaultStream, SubjectPrefix: contract.DefaultSubjectPrefix,
		DuplicateWindow: stream.DefaultDuplicateWindow, MaxAge: stream.DefaultMaxAge}, c)
	require.NoError(t, c.Validate())
	require.NoError(t, stream.Config{DuplicateWindow: time.Hour, MaxAge: time.Hour}.Validate())
	err := stream.Config{DuplicateWindow: 2 * time.Hour, MaxAge: time.Hour}.Validate()
	require.ErrorContains(t, err, "QUILL_DUPLICATE_WINDOW 2h0m0s")
	require.ErrorContains(t, err, "QUILL_STREAM_MAX_AGE 1h0m0s")
	for _, n := range []int{-1, 6} {
		require.ErrorContains(t, stream.Config{Replicas: n}.WithDefaults().Validate(), "QUILL_STREAM_REPLICAS")
	}
	require.NoError(t, stream.Config{Replicas: 5}.WithDefaults().Validate())
	require.Equal(t, 1, stream.Config{}.StreamConfig().Replicas, "created with one replica when unset")
	require.Equal(t, 3, stream.Config{Replicas: 3}.StreamConfig().Replicas)
}

// Provision creates the stream and sets what Quill owns of an existing
// one.
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
	require.Equal(t, 1, st.CachedInfo().Config.Replicas)
	c.DuplicateWindow = 2 * time.Minute
	st, err = stream.Provision(ctx, js, c)
	require.NoError(t, err)
	require.Equal(t, 2*time.Minute, st.CachedInfo().Config.Duplicates, "an existing stream is updated")

	_, err = stream.Provision(ctx, js, stream.Config{Name: "CLASH", SubjectPrefix: "owned", DuplicateWindow: time.Minute, MaxAge: time.Hour})
	require.ErrorContains(t, err, "provision stream CLASH", "the error names the stream")
}

// operatorStream is a stream as an operator may have set it up: Quill's
// subjects, but their own window, age, limits, description, compression.
func operatorStream(name, prefix string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name: name, Subjects: []string{contract.AllSubjects(prefix), "extra." + prefix + ".>"}, Storage: jetstream.FileStorage,
		Replicas: replicas, Duplicates: 5 * time.Minute, MaxAge: 2 * time.Hour,
		MaxMsgs: 1_000_000, MaxBytes: 1 << 30, Description: "the operator's", Compression: jetstream.S2Compression,
		MaxMsgsPerSubject: 1000, Discard: jetstream.DiscardOld,
	}
}

// requireOperatorsKept checks that of an operator's stream only what Quill
// owns changed.
func requireOperatorsKept(t *testing.T, op, got jetstream.StreamConfig, c stream.Config) {
	t.Helper()
	require.Equal(t, []string{contract.AllSubjects(c.SubjectPrefix)}, got.Subjects, "subjects are Quill's")
	require.Equal(t, c.DuplicateWindow, got.Duplicates)
	require.Equal(t, c.MaxAge, got.MaxAge)
	require.Equal(t, op.MaxMsgs, got.MaxMsgs)
	require.Equal(t, op.MaxBytes, got.MaxBytes)
	require.Equal(t, op.Description, got.Description)
	require.Equal(t, op.Compression, got.Compression)
	require.Equal(t, op.MaxMsgsPerSubject, got.MaxMsgsPerSubject)
	require.Equal(t, op.Discard, got.Discard)
}

// Of an existing stream, Provision sets only subjects, Duplicates, MaxAge
// and (when configured) Replicas; an unchanged stream is not updated.
func TestProvisionKeepsTheOperatorsSettings(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx := t.Context()

	op := operatorStream("KEPT", "kept", 1)
	_, err := js.CreateStream(ctx, op)
	require.NoError(t, err)
	c := stream.Config{Name: "KEPT", SubjectPrefix: "kept", DuplicateWindow: time.Minute, MaxAge: time.Hour}.WithDefaults()
	st, err := stream.Provision(ctx, js, c)
	require.NoError(t, err)
	requireOperatorsKept(t, op, st.CachedInfo().Config, c)
	created := st.CachedInfo().Created

	_, changed := c.Owned(st.CachedInfo().Config)
	require.False(t, changed, "provisioned: nothing owned differs")
	st, err = stream.Provision(ctx, js, c)
	require.NoError(t, err)
	requireOperatorsKept(t, op, st.CachedInfo().Config, c)
	require.Equal(t, created, st.CachedInfo().Created)
}

func TestOwned(t *testing.T) {
	t.Parallel()
	c := stream.Config{Name: "S", SubjectPrefix: "s", DuplicateWindow: time.Minute, MaxAge: time.Hour}
	have := c.StreamConfig()
	have.Replicas = 3
	have.MaxMsgs = 10
	for _, tc := range []struct {
		name     string
		edit     func(*jetstream.StreamConfig)
		replicas int
		changed  bool
		want     int
	}{
		{name: "as provisioned", edit: func(*jetstream.StreamConfig) {}, want: 3},
		{name: "replicas unset keep the stream's", edit: func(*jetstream.StreamConfig) {}, replicas: 0, want: 3},
		{name: "replicas set scale it", edit: func(*jetstream.StreamConfig) {}, replicas: 1, changed: true, want: 1},
		{name: "replicas set as they are", edit: func(*jetstream.StreamConfig) {}, replicas: 3, want: 3},
		{name: "an extra subject", edit: func(s *jetstream.StreamConfig) { s.Subjects = append(s.Subjects, "x.>") }, changed: true, want: 3},
		{name: "another window", edit: func(s *jetstream.StreamConfig) { s.Duplicates = time.Second }, changed: true, want: 3},
		{name: "another max age", edit: func(s *jetstream.StreamConfig) { s.MaxAge = 0 }, changed: true, want: 3},
		{name: "an operator's limit", edit: func(s *jetstream.StreamConfig) { s.MaxBytes = 1 }, want: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := have
			h.Subjects = slices.Clone(have.Subjects)
			tc.edit(&h)
			c := c
			c.Replicas = tc.replicas
			got, changed := c.Owned(h)
			require.Equal(t, tc.changed, changed)
			require.Equal(t, tc.want, got.Replicas)
			require.Equal(t, int64(10), got.MaxMsgs)
			require.Equal(t, h.MaxBytes, got.MaxBytes)
			require.Equal(t, []string{"s.>"}, got.Subjects)
		})
	}
}

// On a cluster: QUILL_STREAM_REPLICAS unset keeps an operator's R3 stream
// at R3 with its settings; set to 3 it creates a missing stream R3; set to
// 1 it scales an R3 stream to 1, as the operator asked.
func TestProvisionReplicas(t *testing.T) {
	t.Parallel()
	cl := natstest.StartCluster(t, 3)
	_, js := cl.Connect(t)
	ctx := t.Context()

	op := operatorStream("R3OP", "r3op", 3)
	_, err := js.CreateStream(ctx, op)
	require.NoError(t, err)
	c := stream.Config{Name: "R3OP", SubjectPrefix: "r3op"}.WithDefaults()
	for range 2 { // a start and a restart
		st, err := stream.Provision(ctx, js, c)
		require.NoError(t, err)
		require.Equal(t, 3, st.CachedInfo().Config.Replicas)
		requireOperatorsKept(t, op, st.CachedInfo().Config, c)
	}
	cl.WaitForStreamReplicas(t, js, "R3OP", 3)

	created := stream.Config{Name: "R3NEW", SubjectPrefix: "r3new", Replicas: 3}.WithDefaults()
	st, err := stream.Provision(ctx, js, created)
	require.NoError(t, err)
	require.Equal(t, 3, st.CachedInfo().Config.Replicas)
	cl.WaitForStreamReplicas(t, js, "R3NEW", 3)

	down := c
	down.Replicas = 1
	st, err = stream.Provision(ctx, js, down)
	require.NoError(t, err)
	require.Equal(t, 1, st.CachedInfo().Config.Replicas)
	requireOperatorsKept(t, op, st.CachedInfo().Config, down)
	cl.WaitForStreamReplicas(t, js, "R3OP", 1)
}
