package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quillhq/quill/consumer"
	"github.com/quillhq/quill/contract"
	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
	"github.com/quillhq/quill/internal/daemon"
	"github.com/quillhq/quill/internal/dispatch"
	"github.com/quillhq/quill/internal/metrics"
	"github.com/quillhq/quill/internal/stream"
	"github.com/quillhq/quill/internal/whsecret"
)

const overview = `usage: webhook-dispatcher [run] [flags]                      deliver events to webhook endpoints (default)
       webhook-dispatcher deliveries list [--state failed|pending|delivered] [--tenant T] [--endpoint ID] [--json]
       webhook-dispatcher deliveries retry (ID... | --failed [--endpoint ID])   send failed deliveries again
       webhook-dispatcher endpoints enable ID                                    enable a disabled endpoint

Run "webhook-dispatcher run --help" for the settings.`

// defaultAdminAddr is the dispatcher's admin address.
const defaultAdminAddr = ":9093"

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c := settings{}
	return daemon.Program{
		Name:      "webhook-dispatcher",
		Overview:  overview,
		About:     "Consumes every event and delivers each to the tenant's webhook endpoints subscribed to its type: signed, retried under the same webhook-id.",
		AdminAddr: defaultAdminAddr,
		Define:    c.define,
		Start:     c.start,
		Commands:  map[string]cli.RunFunc{"deliveries": deliveries, "endpoints": endpoints},
	}.Main(ctx, args, getenv, stdout, stderr)
}

// settings are the dispatcher's own settings, besides daemon.Settings.
type settings struct {
	stream   stream.Config
	consumer consumer.Config
	cfg      dispatch.Config
	keys     string
}

func (c *settings) define(s *config.Set) {
	c.stream.DefineSubjects(s)
	s.String(&c.consumer.Durable, "consumer", "QUILL_CONSUMER", dispatch.DefaultConsumer,
		"durable consumer name, also the name its inbox rows and dead letters are kept under")
	s.Int(&c.consumer.MaxDeliver, "max-deliver", "QUILL_MAX_DELIVER", consumer.DefaultMaxDeliver, 1, "deliveries before an event that cannot be recorded becomes a dead letter")
	s.Duration(&c.consumer.AckWait, "ack-wait", "QUILL_ACK_WAIT", consumer.DefaultAckWait, "the consumer's ack wait")
	s.FuncRedacted("webhook-secret-key", whsecret.KeyEnv, "", "keys opening the endpoints' sealed secrets (base64 of 32 bytes, comma-separated; required)",
		func(string) string { return "(redacted)" }, func(v string) error { c.keys = v; return nil })
	d := &c.cfg
	s.Duration(&d.Timeout, "webhook-timeout", "QUILL_WEBHOOK_TIMEOUT", dispatch.DefaultTimeout, "bound of one POST; past it the outcome is unknown and it is retried")
	s.Duration(&d.BackoffMin, "webhook-backoff-min", "QUILL_WEBHOOK_BACKOFF_MIN", dispatch.DefaultBackoffMin, "first retry delay (doubled per attempt, with full jitter)")
	s.Duration(&d.BackoffMax, "webhook-backoff-max", "QUILL_WEBHOOK_BACKOFF_MAX", dispatch.DefaultBackoffMax, "longest retry delay")
	s.Duration(&d.RetryFor, "webhook-retry-for", "QUILL_WEBHOOK_RETRY_FOR", dispatch.DefaultRetryFor, "how long after its first attempt a delivery is retried before it fails")
	s.Duration(&d.DisableAfter, "webhook-disable-after", "QUILL_WEBHOOK_DISABLE_AFTER", dispatch.DefaultDisableAfter, "an endpoint failing without a success this long is disabled")
	s.Int(&d.EndpointConcurrency, "webhook-endpoint-concurrency", "QUILL_WEBHOOK_ENDPOINT_CONCURRENCY", dispatch.DefaultEndpointConcurrency, 1, "POSTs in flight to one endpoint from this process")
	s.Int(&d.Concurrency, "webhook-concurrency", "QUILL_WEBHOOK_CONCURRENCY", dispatch.DefaultConcurrency, 1, "POSTs in flight from this process")
	s.Int(&d.Batch, "webhook-batch", "QUILL_WEBHOOK_BATCH", dispatch.DefaultBatch, 1, "events this process's consumer holds at once and records in one transaction")
	s.Bool(&d.AllowPrivate, "webhook-allow-private", "QUILL_WEBHOOK_ALLOW_PRIVATE", false, "allow http:// and private, loopback and link-local addresses (development and tests only)")
	s.String(&d.TLSCA, "webhook-tls-ca", "QUILL_WEBHOOK_TLS_CA", "", "PEM file of extra root certificates for endpoints under a private CA")
	s.Duration(&d.Retention, "webhook-retention", "QUILL_WEBHOOK_RETENTION", dispatch.DefaultRetention, "how long delivered and failed deliveries are kept")
}

func (c *settings) start(ctx context.Context, ds daemon.Settings, stderr io.Writer) error {
	keys, err := whsecret.ParseKeys(c.keys)
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	if err := c.cfg.WithDefaults().Validate(); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	sc := c.stream.WithDefaults()
	cc := c.consumer
	cc.Stream = sc.Name
	cc.FilterSubjects = []string{contract.AllSubjects(sc.SubjectPrefix)}
	if strings.ContainsAny(cc.Durable, ". *>") || cc.Durable == "" {
		return cli.UsageError{Msg: fmt.Sprintf("QUILL_CONSUMER %q must not be empty nor contain '.', ' ', '*' or '>'", cc.Durable)}
	}
	cfg := c.cfg.WithDefaults()
	d, err := daemon.Start(ctx, ds, daemon.Process{Name: "webhook-dispatcher", Service: "quill-webhook-dispatcher",
		PoolSize: int32(8 + min(cfg.Concurrency, 32)), Disconnected: "NATS connection lost; reconnecting (deliveries recorded go on being sent)"}, stderr)
	if err != nil {
		return err
	}
	defer d.Close()
	disp, err := dispatch.New(d.Pool, d.NATS, cc, cfg, keys, d.Log, dispatch.NewMetrics(d.Registry), d.Registry)
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	d.Log.Info().Str("consumer", cc.Durable).Str("filter", cc.FilterSubjects[0]).Bool("allow_private", cfg.AllowPrivate).Msg("starting")
	return d.Run(ctx, daemon.Services{Ready: map[string]metrics.ReadyFunc{"dispatcher": disp.Ready},
		Loops: []func(context.Context) error{disp.Run}})
}

// opened runs an operator command's work with a pool.
func opened(ctx context.Context, c daemon.CommandSettings, stderr io.Writer, work func(context.Context, *dispatchPool) error) error {
	_, pool, err := c.Open(ctx, "webhook-dispatcher", stderr)
	if err != nil {
		return err
	}
	defer pool.Close()
	return work(ctx, &dispatchPool{pool})
}

func parseEndpoint(s string) (*uuid.UUID, error) {
	if s == "" {
		return nil, nil
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return nil, cli.UsageError{Msg: fmt.Sprintf("--endpoint %q is not an endpoint id (a UUID)", s)}
	}
	return &id, nil
}

func deliveries(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: webhook-dispatcher deliveries list [--state failed|pending|delivered] [--tenant T] [--endpoint ID] [--json] | webhook-dispatcher deliveries retry (ID... | --failed [--endpoint ID])"
	sub, args, ok, err := cli.Subcommand("webhook-dispatcher", args, usage, stdout)
	if !ok {
		return err
	}
	if sub != "list" && sub != "retry" {
		return cli.UsageError{Msg: fmt.Sprintf("unknown deliveries command %q; %s", sub, usage)}
	}
	var c daemon.CommandSettings
	var state, tenant, endpoint string
	var asJSON, failed bool
	s := config.New("webhook-dispatcher deliveries "+sub, usage, getenv, stdout)
	c.Define(s)
	s.FlagSet().StringVar(&endpoint, "endpoint", "", "only the deliveries to this endpoint id")
	if sub == "list" {
		s.FlagSet().StringVar(&state, "state", "", "only deliveries in this state: pending, delivered or failed")
		s.FlagSet().StringVar(&tenant, "tenant", "", "only this tenant's deliveries")
		s.FlagSet().BoolVar(&asJSON, "json", false, "one JSON object per line")
	} else {
		s.FlagSet().BoolVar(&failed, "failed", false, "retry every failed delivery (of --endpoint only, when given)")
	}
	if err := cli.Parse(s, args); err != nil {
		return err
	}
	ep, err := parseEndpoint(endpoint)
	if err != nil {
		return err
	}
	if sub == "list" {
		switch state {
		case "", "pending", "delivered", "failed":
		default:
			return cli.UsageError{Msg: fmt.Sprintf("--state %q must be pending, delivered or failed", state)}
		}
		if len(s.Args()) > 0 {
			return cli.UsageError{Msg: usage}
		}
		return opened(ctx, c, stderr, func(ctx context.Context, p *dispatchPool) error {
			list, err := dispatch.List(ctx, p.Pool, dispatch.Query{State: state, Tenant: tenant, Endpoint: ep})
			if err != nil {
				return err
			}
			return cli.PrintList(stdout, list, asJSON, "no deliveries", func(d dispatch.Delivery) string {
				status, lastErr := "-", ""
				if d.LastStatus != nil {
					status = strconv.Itoa(*d.LastStatus)
				}
				if d.LastError != nil {
					lastErr = "  error: " + cli.Printable(*d.LastError)
				}
				return fmt.Sprintf("%d  %s  tenant %s  endpoint %s  event %s %s  attempts %d  last status %s  created %s%s", d.ID, d.State,
					cli.Printable(d.Tenant), d.EndpointID, d.EventID, cli.Printable(d.EventType), d.Attempts, status, d.CreatedAt.UTC().Format(time.RFC3339), lastErr)
			})
		})
	}
	var ids []int64
	for _, a := range s.Args() {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id < 1 {
			return cli.UsageError{Msg: fmt.Sprintf("%q is not a delivery id (a positive integer)", a)}
		}
		ids = append(ids, id)
	}
	switch {
	case failed && len(ids) > 0, !failed && len(ids) == 0, !failed && ep != nil:
		return cli.UsageError{Msg: usage}
	}
	return opened(ctx, c, stderr, func(ctx context.Context, p *dispatchPool) error {
		if failed {
			n, skipped, err := dispatch.RetryFailed(ctx, p.Pool, ep)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%d failed deliveries pending again, sent under their event ids", n)
			if skipped > 0 {
				fmt.Fprintf(stdout, "; %d left failed: their endpoints are deleted or disabled (enable with `webhook-dispatcher endpoints enable ID`)", skipped)
			}
			fmt.Fprintln(stdout)
			return nil
		}
		for _, id := range ids {
			err := dispatch.Retry(ctx, p.Pool, id)
			var refused *dispatch.RefusedRetryError
			switch {
			case errors.Is(err, dispatch.ErrNotFound):
				return cli.UsageError{Msg: fmt.Sprintf("no delivery %d", id)}
			case errors.As(err, &refused):
				return cli.UsageError{Msg: refused.Msg}
			case err != nil:
				return err
			}
			fmt.Fprintf(stdout, "delivery %d pending again, sent under the same event id\n", id)
		}
		return nil
	})
}

func endpoints(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	const usage = "usage: webhook-dispatcher endpoints enable ID"
	sub, args, ok, err := cli.Subcommand("webhook-dispatcher", args, usage, stdout)
	if !ok {
		return err
	}
	if sub != "enable" {
		return cli.UsageError{Msg: fmt.Sprintf("unknown endpoints command %q; %s", sub, usage)}
	}
	var c daemon.CommandSettings
	s := config.New("webhook-dispatcher endpoints enable", usage, getenv, stdout)
	c.Define(s)
	if err := cli.Parse(s, args); err != nil {
		return err
	}
	if len(s.Args()) != 1 {
		return cli.UsageError{Msg: usage}
	}
	id, err := uuid.Parse(s.Args()[0])
	if err != nil {
		return cli.UsageError{Msg: fmt.Sprintf("%q is not an endpoint id (a UUID)", s.Args()[0])}
	}
	return opened(ctx, c, stderr, func(ctx context.Context, p *dispatchPool) error {
		n, err := dispatch.Enable(ctx, p.Pool, id)
		var refused *dispatch.RefusedRetryError
		switch {
		case errors.Is(err, dispatch.ErrNotFound):
			return cli.UsageError{Msg: fmt.Sprintf("no endpoint %s", id)}
		case errors.As(err, &refused):
			return cli.UsageError{Msg: refused.Msg}
		case err != nil:
			return err
		}
		fmt.Fprintf(stdout, "endpoint %s enabled; %d failed deliveries to it (re-send: webhook-dispatcher deliveries retry --failed --endpoint %s)\n", id, n, id)
		return nil
	})
}

// dispatchPool is an operator command's pool.
type dispatchPool struct{ Pool *pgxpool.Pool }
