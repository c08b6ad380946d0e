package daemon

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/quillhq/quill/internal/cli"
	"github.com/quillhq/quill/internal/config"
)

// probeTimeout bounds one probe: below the 5 s a compose or Kubernetes
// health check waits by default, so that the probe's own line, not the
// runner's timeout, says what went wrong.
const probeTimeout = 3 * time.Second

// probe is every daemon's probe command: it asks the daemon's admin
// address (QUILL_ADMIN_ADDR, as the daemon reads it) for /readyz, or
// /healthz with --live, and succeeds only on 200. It exists for health
// checks in the image, which has no shell and no curl: compose's
// healthcheck and an exec probe run "relay probe". It returns a
// cli.UsageError for a bad flag or address and an error naming the URL
// and the answer's first line otherwise.
func (p Program) probe(ctx context.Context, args []string, getenv func(string) string, stdout, _ io.Writer) error {
	var (
		addr    string
		timeout time.Duration
	)
	s := config.New(p.Name+" probe", "usage: "+p.Name+" probe [--live] [flags]\n\n"+
		"Asks the running "+p.Name+"'s admin address for /readyz (ready: its dependencies answer) or, with --live,\n"+
		"/healthz (the process is alive), and exits 0 on 200, 1 otherwise: a health check for an image without a shell.",
		getenv, stdout)
	s.String(&addr, "admin-addr", "QUILL_ADMIN_ADDR", p.AdminAddr, "the admin address the daemon listens on")
	s.Duration(&timeout, "timeout", "", probeTimeout, "how long to wait for the answer")
	live := s.FlagSet().Bool("live", false, "ask /healthz (alive) instead of /readyz (ready)")
	if err := parse(s, args); err != nil {
		return err
	}
	path := "/readyz"
	if *live {
		path = "/healthz"
	}
	url, err := probeURL(addr, path)
	if err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	return Probe(ctx, url, timeout)
}

// probeURL is the URL of path on a listen address: an unspecified or
// missing host (":9090", "0.0.0.0:9090", "[::]:9090") is probed on the
// loopback address of its family, where a listener on every address
// answers too.
func probeURL(addr, path string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return "", fmt.Errorf("QUILL_ADMIN_ADDR %q is not host:port", addr)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}

// Probe GETs url within timeout and returns nil for a 200 answer, else an
// error naming the URL and what came back: the status and the body's
// first line (the failing readiness check, for /readyz), or the transport
// error.
func Probe(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	// A fresh connection each time, never a proxy from the environment.
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	res, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusOK {
		return nil
	}
	line, _, _ := bufio.NewReader(io.LimitReader(res.Body, 512)).ReadLine()
	return fmt.Errorf("probe %s answered %d: %s", url, res.StatusCode, cli.Printable(string(line)))
}
