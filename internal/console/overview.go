package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/outbox"
)

// The overview's figures. The pipeline's history over the last hour comes
// from the rows' own times (published_at and the inbox's processed_at are
// indexed), so every API instance draws the same charts, from the first
// look; the backlog has no history in the tables, so the console samples
// it when the overview is asked for, at most once per sampleEvery, and
// keeps the last hour of samples.
const (
	window      = time.Hour
	sampleEvery = 10 * time.Second

	sqlPublishedPerMinute = `SELECT floor(extract(epoch FROM published_at) / 60)::bigint AS m,
		count(*), count(*) FILTER (WHERE ack_duplicate)
	FROM outbox_events WHERE published_at >= $1 GROUP BY m ORDER BY m`

	// The worker's results per minute: inbox rows are its commits (the
	// consumer package's table, under the worker's durable name); the
	// note.created event's attachment tells processed from failed, and the
	// event's commit time gives the end-to-end latency (outbox commit to
	// worker commit, as quill_event_end_to_end_seconds measures it).
	sqlWorkerPerMinute = `SELECT floor(extract(epoch FROM i.processed_at) / 60)::bigint AS m,
		count(*) FILTER (WHERE a.status = 'processed'),
		count(*) FILTER (WHERE a.status = 'failed'),
		count(*),
		coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM i.processed_at - e.created_at)), 0)::float8,
		coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM i.processed_at - e.created_at)), 0)::float8
	FROM quill_consumer_inbox i
	LEFT JOIN outbox_events e ON e.id = i.event_id
	LEFT JOIN attachments a ON a.note_id = e.aggregate_id AND e.type = 'note.created'
	WHERE i.consumer = $1 AND i.processed_at >= $2
	GROUP BY m ORDER BY m`
)

// sample is one look at the backlog.
type sample struct {
	At        int64   `json:"t"`
	Pending   int64   `json:"pending"`
	OldestAge float64 `json:"oldest_age_seconds"`
}

// sampler keeps the last samples in a ring.
type sampler struct {
	mu   sync.Mutex
	ring []sample
	next int
	full bool
}

func newSampler(n int) *sampler { return &sampler{ring: make([]sample, n)} }

func (s *sampler) last() (sample, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.full && s.next == 0 {
		return sample{}, false
	}
	return s.ring[(s.next+len(s.ring)-1)%len(s.ring)], true
}

func (s *sampler) add(x sample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ring[s.next] = x
	s.next = (s.next + 1) % len(s.ring)
	s.full = s.full || s.next == 0
}

// since returns the samples at or after t, oldest first.
func (s *sampler) since(t int64) []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sample
	n := s.next
	if s.full {
		n = len(s.ring)
	}
	start := 0
	if s.full {
		start = s.next
	}
	for i := range n {
		x := s.ring[(start+i)%len(s.ring)]
		if x.At >= t {
			out = append(out, x)
		}
	}
	return out
}

// minute is one minute of the pipeline.
type minute struct {
	At         int64   `json:"t"`
	Published  int64   `json:"published"`
	Duplicates int64   `json:"duplicates"`
	Processed  int64   `json:"processed"`
	Failed     int64   `json:"failed"`
	Handled    int64   `json:"handled"`
	LatencyP50 float64 `json:"latency_p50_seconds"`
	LatencyP99 float64 `json:"latency_p99_seconds"`
}

// overviewData is the overview: figures of now and the last hour.
type overviewData struct {
	At        int64   `json:"t"`
	Pending   int64   `json:"pending"`
	OldestAge float64 `json:"oldest_age_seconds"`
	Parked    int64   `json:"parked"`
	// DeadLetters are the open dead letters of every consumer, and
	// DeadLettersByConsumer the consumers that have some, by name.
	DeadLetters           int64                          `json:"dead_letters"`
	DeadLettersByConsumer []consumer.ConsumerDeadLetters `json:"dead_letters_by_consumer"`
	// Consumer is the worker's, whose results the charts show.
	Consumer string   `json:"consumer"`
	Minutes  []minute `json:"minutes"`
	Backlog  []sample `json:"backlog"`
	// Totals over the window, for the page without its script.
	Published, Duplicates, Processed, Failed int64
}

// collect reads the overview: one snapshot transaction, four statements.
func (c *Console) collect(ctx context.Context) (*overviewData, error) {
	now := c.cfg.Now()
	from := now.Add(-window).Truncate(time.Minute)
	d := &overviewData{At: now.Unix(), Consumer: c.cfg.Audit.Consumer, Minutes: []minute{}}
	byMinute := map[int64]*minute{}
	at := func(m int64) *minute {
		if x := byMinute[m]; x != nil {
			return x
		}
		x := &minute{At: m * 60}
		byMinute[m] = x
		return x
	}
	err := db.WithSnapshot(ctx, c.pool, func(tx pgx.Tx) error {
		st, err := outbox.Backlog(ctx, tx)
		if err != nil {
			return err
		}
		d.Pending, d.Parked, d.OldestAge = st.Pending, st.Parked, st.OldestAge
		store, err := consumer.NewStore(tx, "")
		if err != nil {
			return err
		}
		if d.DeadLettersByConsumer, err = store.OpenDeadLettersByConsumer(ctx); err != nil {
			return err
		}
		for _, n := range d.DeadLettersByConsumer {
			d.DeadLetters += n.Open
		}
		rows, err := tx.Query(ctx, sqlPublishedPerMinute, from)
		if err != nil {
			return fmt.Errorf("publishes per minute: %w", err)
		}
		for rows.Next() {
			var m, n, dup int64
			if err := rows.Scan(&m, &n, &dup); err != nil {
				rows.Close()
				return fmt.Errorf("publishes per minute: %w", err)
			}
			x := at(m)
			x.Published, x.Duplicates = n, dup
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("publishes per minute: %w", err)
		}
		rows, err = tx.Query(ctx, sqlWorkerPerMinute, c.cfg.Audit.Consumer, from)
		if err != nil {
			return fmt.Errorf("worker results per minute: %w", err)
		}
		for rows.Next() {
			var m int64
			var y minute
			if err := rows.Scan(&m, &y.Processed, &y.Failed, &y.Handled, &y.LatencyP50, &y.LatencyP99); err != nil {
				rows.Close()
				return fmt.Errorf("worker results per minute: %w", err)
			}
			x := at(m)
			x.Processed, x.Failed, x.Handled, x.LatencyP50, x.LatencyP99 = y.Processed, y.Failed, y.Handled, y.LatencyP50, y.LatencyP99
		}
		return rows.Err()
	})
	if err != nil {
		return nil, db.Translate(err)
	}
	for m := from.Unix() / 60; m <= now.Unix()/60; m++ {
		x := at(m)
		d.Minutes = append(d.Minutes, *x)
		d.Published += x.Published
		d.Duplicates += x.Duplicates
		d.Processed += x.Processed
		d.Failed += x.Failed
	}
	if last, ok := c.samples.last(); !ok || now.Unix()-last.At >= int64(sampleEvery/time.Second) {
		c.samples.add(sample{At: now.Unix(), Pending: d.Pending, OldestAge: d.OldestAge})
	}
	d.Backlog = c.samples.since(now.Add(-window).Unix())
	return d, nil
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	d, err := c.collect(ctx)
	if err != nil {
		c.failErr(w, r, "read the pipeline's figures", err)
		return
	}
	c.render(w, r, http.StatusOK, "overview", page{Title: "Overview", Nav: "overview", Data: d})
}

func (c *Console) overviewJSON(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	d, err := c.collect(ctx)
	if err != nil {
		c.log.Error().Err(err).Str("error_category", "console_failed").Msg("console overview failed")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"the pipeline's figures could not be read"}` + "\n"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(d)
}
