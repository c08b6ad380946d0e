package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/outbox"
)

// The list pages walk their tables by primary key from a cursor (?after=),
// one page and one probe row more: each page costs one index range scan
// whatever the number of rows, 10,000 parked events or ten million.
const (
	// The relays' queue (outbox_pending, migration 00007) holds only the
	// unpublished events and flags the parked ones: walking it, not the
	// outbox, keeps a page from stepping over every published event.
	sqlParkedPage = `SELECT e.seq, e.id, e.tenant, e.type, e.aggregate_id, e.created_at, e.parked_at, coalesce(e.parked_reason, ''), e.attempts
	FROM outbox_pending q JOIN outbox_events e ON e.seq = q.seq
	WHERE q.parked AND q.seq > $1 AND e.parked_at IS NOT NULL AND e.published_at IS NULL
	ORDER BY q.seq LIMIT $2`
	sqlParkedOne = `SELECT seq, id, tenant, type, aggregate_id, created_at, parked_at, coalesce(parked_reason, ''), attempts
	FROM outbox_events WHERE parked_at IS NOT NULL AND published_at IS NULL AND id = $1`
)

// parkedRow is a parked event as the pages show it.
type parkedRow struct {
	Seq                    int64
	ID, Tenant, Type, Note string
	CreatedAt, ParkedAt    time.Time
	Reason                 string
	Attempts               int
}

// listView is a list page's data.
type listView[T any] struct {
	Rows []T
	// Next is the cursor of the next page, 0 when this is the last.
	Next int64
	// After is this page's cursor (0: the first page).
	After int64
	// Retriable is false when the retry needs what the API lacks (NATS).
	Retriable bool
}

// cursor reads ?after= and ?limit=.
func (c *Console) cursor(r *http.Request) (after int64, limit int, ok bool) {
	q := r.URL.Query()
	limit = c.cfg.PageSize
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return 0, 0, false
		}
		after = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageSize {
			return 0, 0, false
		}
		limit = n
	}
	return after, limit, true
}

func scanParked(row pgx.Row) (parkedRow, error) {
	var p parkedRow
	var id, note uuid.UUID
	err := row.Scan(&p.Seq, &id, &p.Tenant, &p.Type, &note, &p.CreatedAt, &p.ParkedAt, &p.Reason, &p.Attempts)
	p.ID, p.Note = id.String(), note.String()
	return p, err
}

// listPage answers the rows of a list page, or reports false once it has
// answered why there are none to show: it reads ?after= and ?limit= (400
// when either is off) and fetches limit+1 rows after the cursor; what
// names the list in the failure
// answered when the rows cannot be read.
func listPage[T any](c *Console, w http.ResponseWriter, r *http.Request, what string, key func(T) int64,
	fetch func(ctx context.Context, after int64, limit int) ([]T, error)) (listView[T], bool) {
	after, limit, ok := c.cursor(r)
	if !ok {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("?after= is a non-negative number and ?limit= is from 1 to %d.", MaxPageSize))
		return listView[T]{}, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	out, err := fetch(ctx, after, limit+1)
	if err != nil {
		c.failErr(w, r, what, db.Translate(err))
		return listView[T]{}, false
	}
	v := listView[T]{Rows: out, After: after}
	if len(out) > limit {
		v.Rows = out[:limit]
		v.Next = key(out[limit-1])
	}
	return v, true
}

func (c *Console) parkedList(w http.ResponseWriter, r *http.Request) {
	v, ok := listPage(c, w, r, "list the parked events", func(p parkedRow) int64 { return p.Seq },
		func(ctx context.Context, after int64, limit int) ([]parkedRow, error) {
			rows, err := c.pool.Query(ctx, sqlParkedPage, after, limit)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, func(row pgx.CollectableRow) (parkedRow, error) { return scanParked(row) })
		})
	if !ok {
		return
	}
	v.Retriable = true
	c.render(w, r, http.StatusOK, "parked", page{Title: "Parked events", Nav: "parked", Data: v, Message: parkedDone(r)})
}

// confirmView is a confirmation page's data.
type confirmView struct {
	Kind   string // parked or dead
	What   string
	Action string
	// Fields are the form's hidden fields: what names the row.
	Fields map[string]string
	Row    any
	Back   string
}

// stuckKind is one kind of row the console lists and retries, parked events
// or dead letters: how its id is read and its row found, and the words and
// paths of its pages.
type stuckKind[K, T any] struct {
	// kind is the confirmation page's Kind and the pages' Nav.
	kind string
	// list is the path of the kind's list page, below Prefix.
	list string
	// noun names one row, for the page title and the failure line.
	noun string
	// none says that no row has the id asked for.
	none string
	// question is what the confirmation page asks.
	question string
	// parse reads the key of a row from a request's values (the query
	// of a confirmation page, the form of a retry); fields are the form's
	// values that name key.
	parse  func(get func(string) string) (K, error)
	fields func(K) map[string]string
	// one reads the row of id: pgx.ErrNoRows when there is none to retry.
	one func(ctx context.Context, c *Console, id K) (T, error)
}

func parkedEvents() stuckKind[uuid.UUID, parkedRow] {
	return stuckKind[uuid.UUID, parkedRow]{
		kind: "parked", list: "parked", noun: "parked event", none: "no parked event has this id",
		question: "Return this event to the relays' queue? They publish it on their next pass; if the reason it was parked still holds, it is parked again.",
		parse:    func(get func(string) string) (uuid.UUID, error) { return uuid.Parse(get("id")) },
		fields:   func(id uuid.UUID) map[string]string { return map[string]string{"id": id.String()} },
		one: func(ctx context.Context, c *Console, id uuid.UUID) (parkedRow, error) {
			return scanParked(c.pool.QueryRow(ctx, sqlParkedOne, id))
		},
	}
}

// deadKey names a dead letter: its consumer (the durable name it is kept
// under) and its id. Both come from the request, and the store reads a
// dead letter only under its consumer: a pair that does not match, forged
// or stale, finds none.
type deadKey struct {
	consumer string
	id       int64
}

func deadLetters() stuckKind[deadKey, consumer.StoredDeadLetter] {
	return stuckKind[deadKey, consumer.StoredDeadLetter]{
		kind: "dead", list: "dead-letters", noun: "dead letter", none: "this consumer has no open dead letter with this id",
		question: "Republish this message to its subject? Its consumer handles it again; its inbox still recognises an event it has already applied.",
		parse: func(get func(string) string) (deadKey, error) {
			k := deadKey{consumer: get("consumer")}
			if k.consumer == "" {
				return k, errors.New("no consumer named")
			}
			var err error
			k.id, err = strconv.ParseInt(get("id"), 10, 64)
			return k, err
		},
		fields: func(k deadKey) map[string]string {
			return map[string]string{"consumer": k.consumer, "id": strconv.FormatInt(k.id, 10)}
		},
		one: func(ctx context.Context, c *Console, k deadKey) (consumer.StoredDeadLetter, error) {
			// Only an open dead letter of the consumer named: the list
			// shows those, and a retried one would be published again.
			l, err := c.store.DeadLetter(ctx, k.consumer, k.id)
			if errors.Is(err, consumer.ErrDeadLetterNotFound) || err == nil && l.RetriedAt != nil {
				return l, pgx.ErrNoRows
			}
			return l, err
		},
	}
}

// id parses the key a page was asked for from get (the query's or the
// form's values); one that does not parse is answered 404, as no row has
// it.
func (k stuckKind[K, T]) id(c *Console, w http.ResponseWriter, r *http.Request, get func(string) string) (K, bool) {
	id, err := k.parse(get)
	if err != nil {
		k.unknown(c, w, r)
		return id, false
	}
	return id, true
}

// unknown answers 404 for an id no row has.
func (k stuckKind[K, T]) unknown(c *Console, w http.ResponseWriter, r *http.Request) {
	c.fail(w, r, http.StatusNotFound, "Not found: "+k.none+".")
}

// gone answers 404 for an id whose row is not there to retry (any more).
func (k stuckKind[K, T]) gone(c *Console, w http.ResponseWriter, r *http.Request) {
	c.fail(w, r, http.StatusNotFound, "Not found: "+k.none+" (it may have been retried already).")
}

// row reads the row of id, answering 404 when there is none and the
// failure when it cannot be read.
func (k stuckKind[K, T]) row(ctx context.Context, c *Console, w http.ResponseWriter, r *http.Request, id K) (T, bool) {
	row, err := k.one(ctx, c, id)
	if errors.Is(err, pgx.ErrNoRows) {
		k.gone(c, w, r)
		return row, false
	}
	if err != nil {
		c.failErr(w, r, "read the "+k.noun, err)
		return row, false
	}
	return row, true
}

// confirm answers the page that asks the operator to confirm the retry of
// the row ?id= names.
func (k stuckKind[K, T]) confirm(c *Console, w http.ResponseWriter, r *http.Request) {
	id, ok := k.id(c, w, r, r.URL.Query().Get)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	row, ok := k.row(ctx, c, w, r, id)
	if !ok {
		return
	}
	c.render(w, r, http.StatusOK, "confirm", page{Title: "Retry a " + k.noun, Nav: k.kind, Data: confirmView{Kind: k.kind,
		What: k.question, Action: Prefix + k.list + "/retry", Fields: k.fields(id), Row: row, Back: Prefix + k.list}})
}

func (c *Console) parkedConfirm(w http.ResponseWriter, r *http.Request) {
	parkedEvents().confirm(c, w, r)
}

// retry answers a retry's POST: it reads the form's id and runs act with
// it, for the signed-in operator s, under the query timeout.
func (k stuckKind[K, T]) retry(c *Console, w http.ResponseWriter, r *http.Request, act func(ctx context.Context, s session, id K)) {
	s, _ := sessionOf(r)
	id, ok := k.id(c, w, r, r.PostFormValue)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
	defer cancel()
	act(ctx, s, id)
}

// failed logs a retry that found no row (err is notFound), answered by
// missing, and answers the failure of any other error. It reports whether
// the retry failed; when it did not, the caller logs it found.
func (k stuckKind[K, T]) failed(c *Console, w http.ResponseWriter, r *http.Request, logged *zerolog.Event, err, notFound error,
	missing func(*Console, http.ResponseWriter, *http.Request)) bool {
	if errors.Is(err, notFound) {
		logged.Bool("found", false).Msg("console: retry of a " + k.noun + " found none")
		missing(c, w, r)
		return true
	}
	if err != nil {
		c.failErr(w, r, "retry the "+k.noun, err)
		return true
	}
	return false
}

func (c *Console) parkedRetry(w http.ResponseWriter, r *http.Request) {
	k := parkedEvents()
	k.retry(c, w, r, func(ctx context.Context, s session, id uuid.UUID) {
		err := outbox.Unpark(ctx, c.pool, id)
		logged := c.actionLog(s, "retry_parked").Str("event_id", id.String())
		if k.failed(c, w, r, logged, err, outbox.ErrNotParked, k.gone) {
			return
		}
		logged.Bool("found", true).Msg("console: parked event returned to the queue")
		http.Redirect(w, r, Prefix+"parked?retried="+id.String(), http.StatusSeeOther)
	})
}

// deadListView is the dead-letter list's data: a page of every
// consumer's, or of Consumer's when ?consumer= names one.
type deadListView struct {
	listView[consumer.StoredDeadLetter]
	Consumer string
}

// deadList lists the open dead letters of every consumer, or of the one
// ?consumer= names. The name is only a statement's parameter and is
// escaped wherever the page shows it; a name no consumer has lists none.
func (c *Console) deadList(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("consumer")
	v, ok := listPage(c, w, r, "list the dead letters", func(d consumer.StoredDeadLetter) int64 { return d.ID },
		func(ctx context.Context, after int64, limit int) ([]consumer.StoredDeadLetter, error) {
			return c.store.DeadLetters(ctx, consumer.DeadLetterQuery{Consumer: name, AnyConsumer: name == "", After: after, Limit: limit})
		})
	if !ok {
		return
	}
	v.Retriable = c.js() != nil
	c.render(w, r, http.StatusOK, "deadletters", page{Title: "Dead letters", Nav: "dead",
		Data: deadListView{listView: v, Consumer: name}, Message: deadDone(r)})
}

func (c *Console) deadConfirm(w http.ResponseWriter, r *http.Request) {
	deadLetters().confirm(c, w, r)
}

func (c *Console) deadRetry(w http.ResponseWriter, r *http.Request) {
	k := deadLetters()
	k.retry(c, w, r, func(ctx context.Context, s session, key deadKey) {
		js := c.js()
		if js == nil {
			c.fail(w, r, http.StatusServiceUnavailable, "A dead letter is retried by publishing it to NATS, and the API is not connected to NATS (NATS_URL). Try again, or use \"attachment-worker dead-letters retry --consumer NAME ID\".")
			return
		}
		// The one read serves the check and the republish; a pair of a
		// consumer and an id that do not match finds none.
		l, err := k.one(ctx, c, key)
		logged := c.actionLog(s, "retry_dead_letter").Str("consumer", key.consumer).Int64("dead_letter", key.id)
		if k.failed(c, w, r, logged, err, pgx.ErrNoRows, k.gone) {
			return
		}
		ack, err := c.store.Redrive(ctx, js, l, c.cfg.Now())
		if err != nil {
			c.failErr(w, r, "retry the "+k.noun, err)
			return
		}
		logged.Bool("found", true).Uint64("stream_seq", ack.Sequence).Bool("duplicate", ack.Duplicate).Msg("console: dead letter republished")
		// Back to the list of the letter's consumer, as the row names it.
		back := url.Values{"consumer": {l.Consumer}, "retried": {strconv.FormatInt(l.ID, 10)}, "seq": {strconv.FormatUint(ack.Sequence, 10)}}
		http.Redirect(w, r, Prefix+"dead-letters?"+back.Encode(), http.StatusSeeOther)
	})
}

// parkedDone and deadDone are the line a retry's redirect asks for: made
// here from ids, never a text taken from the URL, so that a crafted link
// cannot make the console say something else.
func parkedDone(r *http.Request) string {
	id, err := uuid.Parse(r.URL.Query().Get("retried"))
	if err != nil {
		return ""
	}
	return "Event " + id.String() + " is queued again; the relays publish it on their next pass."
}

func deadDone(r *http.Request) string {
	id, err := strconv.ParseInt(r.URL.Query().Get("retried"), 10, 64)
	if err != nil {
		return ""
	}
	seq, _ := strconv.ParseUint(r.URL.Query().Get("seq"), 10, 64)
	return fmt.Sprintf("Dead letter %d is republished (stream sequence %d).", id, seq)
}
