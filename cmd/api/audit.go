package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/contract/opkey"
	"github.com/quillhq/quill/internal/audit"
	"github.com/quillhq/quill/internal/auth"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/idempotency"
	"github.com/quillhq/quill/internal/natsconn"
	"github.com/quillhq/quill/internal/retention"
)

// Exit statuses of api audit besides 0 (consistent) and 2 (usage).
const (
	auditExitAnomalies  = 1
	auditExitIncomplete = 3
)

// natsConnectTimeout bounds the audit's NATS connection attempt.
const natsConnectTimeout = 5 * time.Second

const auditSynopsis = `usage: api audit [--tenant T [--key K]] [--json] [flags]

Reconciles operation records, notes, attachments, outbox events, the stream
and the worker's inbox, and reports each chain that does not add up, with
counts of requests, business effects, replays and suppressed duplicates.
With --key it prints that operation's whole chain.

Exit status: 0 consistent (every check ran); 1 anomalies found; 2 usage
error; 3 the audit could not be completed: the database could not be read
(one line on stderr), or the stream could not be checked (NATS not
reachable, stream missing) and no anomaly was found in the database —
--no-stream skips the stream on purpose.`

// auditExit is api audit's verdict, carried past cli.ExitCode: its report
// is printed already; msg, when set, is printed as the one-line error.
type auditExit struct {
	code int
	msg  string
}

func (e auditExit) Error() string {
	if e.msg != "" {
		return e.msg
	}
	return fmt.Sprintf("audit exit status %d", e.code)
}

func auditCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		databaseURL      string
		natsCfg          natsconn.Settings
		cfg              audit.Config
		asJSON, noStream bool
	)
	s := config.New("api audit", auditSynopsis, getenv, stdout)
	s.String(&databaseURL, "database-url", "DATABASE_URL", db.DefaultURL, "PostgreSQL URL")
	natsCfg.Define(s, "NATS with JetStream; the stream is compared with the outbox")
	cfg.Stream.DefineSubjects(s)
	s.String(&cfg.Consumer, "consumer", "QUILL_CONSUMER", audit.DefaultConsumer, "the attachment worker's durable consumer (its inbox's consumer)")
	s.Duration(&cfg.ResponseRetention, "idempotency-retention", "QUILL_IDEMPOTENCY_RETENTION", idempotency.DefaultResponseRetention, "how long a completed operation's response is replayed")
	s.Duration(&cfg.KeyRetention, "key-retention", "QUILL_KEY_RETENTION", idempotency.DefaultKeyRetention, "how long a key is remembered at all; an older effect may have lost its operation record")
	s.Duration(&cfg.OutboxRetention, "outbox-retention", "QUILL_OUTBOX_RETENTION", retention.DefaultOutboxRetention, "how long published events stay in the outbox")
	s.Duration(&cfg.InboxRetention, "inbox-retention", "QUILL_INBOX_RETENTION", retention.DefaultInboxRetention, "how long the worker remembers processed event ids")
	fs := s.FlagSet()
	fs.StringVar(&cfg.Tenant, "tenant", "", "audit only this tenant")
	fs.StringVar(&cfg.Key, "key", "", "audit only this operation key (needs --tenant) and print its chain")
	fs.DurationVar(&cfg.PendingThreshold, "pending-threshold", audit.DefaultPendingThreshold, "an event unpublished for longer is an anomaly (default 1m)")
	fs.DurationVar(&cfg.ProcessThreshold, "process-threshold", audit.DefaultProcessThreshold, "a note.created event published longer ago, whose attachment is pending with no inbox row, is an anomaly (default 5m)")
	fs.DurationVar(&cfg.HorizonMargin, "horizon-margin", audit.DefaultHorizonMargin, "subtracted from each retention horizon for clock skew (default 1m)")
	fs.BoolVar(&cfg.AllChains, "chains", false, "print every operation's chain, not only those with an anomaly")
	fs.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	fs.BoolVar(&noStream, "no-stream", false, "do not check the stream (the audit is then complete without it)")
	if err := cli.Parse(s, args); err != nil {
		return err
	}
	if err := natsCfg.Validate(); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	switch {
	case len(s.Args()) > 0:
		return cli.UsageError{Msg: fmt.Sprintf("unexpected arguments %q; run \"api audit --help\"", s.Args())}
	case cfg.Tenant != "" && !contract.ValidTenant(cfg.Tenant):
		return cli.UsageError{Msg: fmt.Sprintf("%v: %q", auth.ErrInvalidTenant, cfg.Tenant)}
	case cfg.Key != "" && cfg.Tenant == "":
		return cli.UsageError{Msg: "--key needs --tenant: a key is scoped by its tenant"}
	case cfg.Key != "" && keyErr(cfg.Key) != nil:
		return cli.UsageError{Msg: fmt.Sprintf("--key: %v", keyErr(cfg.Key))}
	case cfg.PendingThreshold <= 0 || cfg.ProcessThreshold <= 0:
		return cli.UsageError{Msg: "--pending-threshold and --process-threshold must be positive"}
	case cfg.HorizonMargin < 0:
		return cli.UsageError{Msg: "--horizon-margin must not be negative"}
	case cfg.KeyRetention < cfg.ResponseRetention:
		return cli.UsageError{Msg: fmt.Sprintf("QUILL_KEY_RETENTION (%s) must be at least QUILL_IDEMPOTENCY_RETENTION (%s)", cfg.KeyRetention, cfg.ResponseRetention)}
	}

	pool, err := db.Open(ctx, databaseURL, 2)
	if err != nil {
		return auditExit{code: auditExitIncomplete, msg: fmt.Sprintf("cannot read the database: %v", err)}
	}
	defer pool.Close()

	var js jetstream.JetStream
	var notChecked string
	if noStream {
		notChecked = "skipped (--no-stream)"
	} else {
		nc, err := natsCfg.Connect(nats.Name("quill-audit"), nats.Timeout(natsConnectTimeout), nats.NoReconnect())
		if err != nil {
			notChecked = fmt.Sprintf("NATS is not reachable at %s: %v", natsCfg.Servers(), err)
		} else {
			defer nc.Close()
			if js, err = jetstream.New(nc); err != nil {
				js, notChecked = nil, fmt.Sprintf("JetStream: %v", err)
			}
		}
	}

	rep, err := audit.Run(ctx, pool, js, notChecked, cfg)
	if err != nil {
		return auditExit{code: auditExitIncomplete, msg: fmt.Sprintf("audit failed: %v", err)}
	}
	if asJSON {
		if err := json.MarshalWrite(stdout, rep, jsontext.WithIndent("  ")); err != nil {
			return auditExit{code: auditExitIncomplete, msg: fmt.Sprintf("write report: %v", err)}
		}
		fmt.Fprintln(stdout)
	} else if err := rep.WriteText(stdout); err != nil {
		return auditExit{code: auditExitIncomplete, msg: fmt.Sprintf("write report: %v", err)}
	}
	switch {
	case len(rep.Anomalies) > 0:
		return auditExit{code: auditExitAnomalies}
	case !rep.Stream.Checked && !noStream:
		return auditExit{code: auditExitIncomplete, msg: "audit incomplete: the stream was not checked: " + rep.Stream.Reason}
	}
	return nil
}

// keyErr validates an operation key as the API does (bare form only).
func keyErr(key string) error {
	if k, err := opkey.Parse(key); err != nil || k != key {
		if err == nil {
			err = fmt.Errorf("%w: pass the key itself, not its quoted header form", opkey.ErrInvalid)
		}
		return err
	}
	return nil
}

// auditExitCode returns the exit status of an auditExit, printing its
// message; ok is false for any other error.
func auditExitCode(err error, stderr io.Writer) (int, bool) {
	var ae auditExit
	if !errors.As(err, &ae) {
		return 0, false
	}
	if ae.msg != "" {
		fmt.Fprintln(stderr, "api audit:", ae.msg)
	}
	return ae.code, true
}
