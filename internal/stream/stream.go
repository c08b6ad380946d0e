// Package stream owns Quill's JetStream stream (SPEC §5): its settings and
// their defaults, and its provisioning. The relay, the attachment worker
// and the audit take both from here, so the stream has one definition; the
// names of the stream and of its subjects
// (<prefix>.<tenant>.<aggregate>.<event>) are package contract's.
package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/config"
)

// Defaults of Config.
const (
	DefaultDuplicateWindow = 10 * time.Minute
	DefaultMaxAge          = 168 * time.Hour
	// DefaultReplicas is the replicas of a stream created while
	// QUILL_STREAM_REPLICAS is unset.
	DefaultReplicas = 1
	// MaxReplicas is the most replicas JetStream allows a stream.
	MaxReplicas = 5
)

// Config is the part of the stream's configuration that Quill owns. Every
// zero field takes its default.
type Config struct {
	// Name is the JetStream stream (QUILL_STREAM). Default QUILL_EVENTS.
	Name string
	// SubjectPrefix is the first token of every subject
	// (QUILL_SUBJECT_PREFIX). Default quill.
	SubjectPrefix string
	// DuplicateWindow is the stream's Duplicates window
	// (QUILL_DUPLICATE_WINDOW). Default 10m.
	DuplicateWindow time.Duration
	// MaxAge is the stream's MaxAge (QUILL_STREAM_MAX_AGE). Default 168h.
	MaxAge time.Duration
	// Replicas is the stream's replicas (QUILL_STREAM_REPLICAS), 1 to
	// MaxReplicas. Zero means unset: a stream is created with
	// DefaultReplicas and an existing one keeps its own, so an operator
	// who scaled the stream is not overruled by a relay's start.
	Replicas int
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Name = cmp.Or(c.Name, contract.DefaultStream)
	c.SubjectPrefix = cmp.Or(c.SubjectPrefix, contract.DefaultSubjectPrefix)
	c.DuplicateWindow = cmp.Or(c.DuplicateWindow, DefaultDuplicateWindow)
	c.MaxAge = cmp.Or(c.MaxAge, DefaultMaxAge)
	return c
}

// DefineSubjects registers the settings that name the stream and its
// subjects on s: QUILL_STREAM and QUILL_SUBJECT_PREFIX.
func (c *Config) DefineSubjects(s *config.Set) {
	s.String(&c.Name, "stream", "QUILL_STREAM", contract.DefaultStream, "JetStream stream name")
	s.String(&c.SubjectPrefix, "subject-prefix", "QUILL_SUBJECT_PREFIX", contract.DefaultSubjectPrefix, "first token of every subject")
}

// Define registers the settings of the stream's owner, the relay, on s:
// those of DefineSubjects, QUILL_DUPLICATE_WINDOW, QUILL_STREAM_MAX_AGE and
// QUILL_STREAM_REPLICAS. A consumer, which never creates the stream, needs
// only DefineSubjects.
func (c *Config) Define(s *config.Set) {
	c.DefineSubjects(s)
	s.Duration(&c.DuplicateWindow, "duplicate-window", "QUILL_DUPLICATE_WINDOW", DefaultDuplicateWindow, "the stream's Duplicates window")
	s.Duration(&c.MaxAge, "stream-max-age", "QUILL_STREAM_MAX_AGE", DefaultMaxAge, "the stream's MaxAge; at least the duplicate window, at most the inbox retention")
	s.OptionalInt(&c.Replicas, "stream-replicas", "QUILL_STREAM_REPLICAS", 1, MaxReplicas,
		"the stream's replicas; unset: a new stream gets 1 and an existing one keeps its own; set: an existing stream is scaled to it")
}

// Validate returns an error naming the settings when the duplicate window
// does not fit in the stream's MaxAge (JetStream would forget a message's
// id while it could still be republished), or the replicas are out of
// range.
func (c Config) Validate() error {
	if c.DuplicateWindow > c.MaxAge {
		return fmt.Errorf("QUILL_DUPLICATE_WINDOW %s must not exceed QUILL_STREAM_MAX_AGE %s", c.DuplicateWindow, c.MaxAge)
	}
	if c.Replicas < 0 || c.Replicas > MaxReplicas {
		return fmt.Errorf("QUILL_STREAM_REPLICAS %d must be 1 to %d", c.Replicas, MaxReplicas)
	}
	return nil
}

// StreamConfig is the stream as Quill creates it: subjects <prefix>.>, file
// storage, the duplicate window, MaxAge and the replicas (DefaultReplicas
// when unset).
func (c Config) StreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       c.Name,
		Subjects:   []string{contract.AllSubjects(c.SubjectPrefix)},
		Storage:    jetstream.FileStorage,
		Duplicates: c.DuplicateWindow,
		MaxAge:     c.MaxAge,
		Replicas:   cmp.Or(c.Replicas, DefaultReplicas),
	}
}

// Owned returns have with the settings Quill owns set to c's — subjects,
// Duplicates, MaxAge, and Replicas when c.Replicas is set — and every other
// setting as it was, and whether any owned setting differed.
func (c Config) Owned(have jetstream.StreamConfig) (jetstream.StreamConfig, bool) {
	want := have
	want.Subjects = []string{contract.AllSubjects(c.SubjectPrefix)}
	want.Duplicates = c.DuplicateWindow
	want.MaxAge = c.MaxAge
	if c.Replicas > 0 {
		want.Replicas = c.Replicas
	}
	changed := !slices.Equal(have.Subjects, want.Subjects) || have.Duplicates != want.Duplicates ||
		have.MaxAge != want.MaxAge || max(have.Replicas, 1) != max(want.Replicas, 1)
	return want, changed
}

// Provision creates the stream when it is missing (StreamConfig), and of
// an existing one sets only what Quill owns (Owned), keeping every other
// setting an operator made; it sends no update when nothing owned differs.
// The relay, the stream's owner, runs it at start and whenever the stream
// has disappeared; consumers wait for the stream instead. Processes provisioning at once all succeed. The error
// wraps JetStream's.
func Provision(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, c.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = js.CreateStream(ctx, c.StreamConfig())
		if err == nil {
			return st, nil
		}
		// Another relay created it meanwhile, perhaps differently
		// configured: treat it as an existing stream.
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			st, err = js.Stream(ctx, c.Name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("provision stream %s: %w", c.Name, err)
	}
	want, changed := c.Owned(st.CachedInfo().Config)
	if !changed {
		return st, nil
	}
	st, err = js.UpdateStream(ctx, want)
	if err != nil {
		return nil, fmt.Errorf("provision stream %s: update: %w", c.Name, err)
	}
	return st, nil
}
