// Package natsconn is how every Quill process connects to NATS (SPEC §2):
// NATS_URL as one URL or a cluster's comma-separated server list, a
// credentials file (QUILL_NATS_CREDS) and TLS files (QUILL_NATS_TLS_CA,
// QUILL_NATS_TLS_CERT, QUILL_NATS_TLS_KEY). Define registers the settings,
// each also a flag, and checks each value as it is parsed; Validate checks
// them together; Options turns them into nats.Options. A bad value is a
// usage error naming its setting, caught before anything connects. Connect
// connects; Explain says which setting a refused connection concerns.
//
// NATS_URL may carry a password (nats://user:secret@host) or a token
// (nats://token@host). It is never printed as given: Redact takes the user
// information out of every message, log line and error this package makes,
// Servers returns the redacted list, and Connect's errors are scrubbed of
// the secrets.
package natsconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/quillhq/quill/internal/config"
)

// DefaultURL is the NATS server used when NATS_URL is not set.
const DefaultURL = "nats://127.0.0.1:4222"

// Settings are the NATS connection settings. The zero value connects to
// DefaultURL without credentials or TLS.
type Settings struct {
	// URL is NATS_URL: one server URL or several, comma-separated, of one
	// cluster; the client connects to one and fails over to the others
	// (and to those the cluster announces). Default DefaultURL.
	URL string
	// Creds is QUILL_NATS_CREDS: a credentials file (user JWT and NKey
	// seed). Default none.
	Creds string
	// TLSCA is QUILL_NATS_TLS_CA: PEM certificates that verify the
	// servers. Default the system's roots.
	TLSCA string
	// TLSCert and TLSKey are QUILL_NATS_TLS_CERT and QUILL_NATS_TLS_KEY:
	// a client certificate and its key, both or neither. Default none.
	TLSCert, TLSKey string
}

// Define registers NATS_URL, QUILL_NATS_CREDS and QUILL_NATS_TLS_* on s;
// what names the role of NATS for the process, in NATS_URL's help.
func (c *Settings) Define(s *config.Set, what string) {
	s.FuncRedacted("nats-url", "NATS_URL", DefaultURL, what+"; one URL or a cluster's comma-separated server list", Redact, func(v string) error {
		if err := checkURLs(v); err != nil {
			return err
		}
		c.URL = v
		return nil
	})
	file := func(p *string, name, env, usage string, check func(string) error) {
		s.Func(name, env, "", usage, func(v string) error {
			if v == "" {
				*p = ""
				return nil
			}
			if err := check(v); err != nil {
				return err
			}
			*p = v
			return nil
		})
	}
	file(&c.Creds, "nats-creds", "QUILL_NATS_CREDS", "NATS credentials file (user JWT and NKey seed)", checkCreds)
	file(&c.TLSCA, "nats-tls-ca", "QUILL_NATS_TLS_CA", "PEM CA certificates that verify the NATS servers", checkCA)
	file(&c.TLSCert, "nats-tls-cert", "QUILL_NATS_TLS_CERT", "PEM client certificate for NATS (with --nats-tls-key)", checkReadable)
	file(&c.TLSKey, "nats-tls-key", "QUILL_NATS_TLS_KEY", "PEM key of the NATS client certificate", checkReadable)
}

// Validate checks what Define's per-setting checks cannot: a client
// certificate and its key come together and match. The error names the
// settings.
func (c Settings) Validate() error {
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		return errors.New("QUILL_NATS_TLS_CERT is set without QUILL_NATS_TLS_KEY")
	case c.TLSKey != "" && c.TLSCert == "":
		return errors.New("QUILL_NATS_TLS_KEY is set without QUILL_NATS_TLS_CERT")
	case c.TLSCert != "":
		if _, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey); err != nil {
			return fmt.Errorf("QUILL_NATS_TLS_CERT %q and QUILL_NATS_TLS_KEY %q are not a certificate and its key: %w", c.TLSCert, c.TLSKey, err)
		}
	}
	if err := checkURLs(c.server()); err != nil {
		return fmt.Errorf("invalid NATS_URL %q: %w", Redact(c.URL), err)
	}
	return nil
}

func (c Settings) server() string {
	if c.URL == "" {
		return DefaultURL
	}
	return c.URL
}

// Servers returns the server list with its passwords and tokens redacted
// (Redact), for messages and logs; Connect connects with the list itself.
func (c Settings) Servers() string { return Redact(c.server()) }

// Options returns the connection's nats.Options for the credentials and
// TLS files. Call Validate first.
func (c Settings) Options() []nats.Option {
	var opts []nats.Option
	if c.Creds != "" {
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	return opts
}

// Connect validates the settings and connects with Options, then opts. It
// returns Validate's error, or nats.Connect's passed through Explain and
// Scrub.
func (c Settings) Connect(opts ...nats.Option) (*nats.Conn, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	nc, err := nats.Connect(c.server(), append(c.Options(), opts...)...)
	if err != nil {
		return nil, c.Scrub(c.Explain(err))
	}
	return nc, nil
}

// Scrub returns err with every password and token of NATS_URL replaced in
// its message, for an error of nats.go that may quote a server URL; it
// unwraps to err, so errors.Is and errors.As still see what it wraps. An
// error whose message holds no secret, and nil, is returned as it is.
func (c Settings) Scrub(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	clean := msg
	for _, s := range secrets(c.server()) {
		clean = strings.ReplaceAll(clean, s, redacted)
	}
	if clean == msg {
		return err
	}
	return scrubbed{msg: clean, err: err}
}

// scrubbed is an error whose message had secrets taken out.
type scrubbed struct {
	msg string
	err error
}

func (e scrubbed) Error() string { return e.msg }
func (e scrubbed) Unwrap() error { return e.err }

// redacted stands for a password or a token, as net/url's and nats.go's
// own redaction write it.
const redacted = "xxxxx"

// Redact returns a NATS_URL value — one URL or a comma-separated list, well
// formed or not — with the user information of every entry replaced: a
// password by xxxxx (the user name kept: it is no secret), a token (user
// information without a colon, which nats.go sends as a token) by xxxxx
// alone. The rest is kept as written, so that a message still names the
// servers. Entries are told apart as an operator may write them wrongly:
// the user information runs from the scheme's "://" (or the entry's start)
// to the last "@" before the host, so a password holding "@", "," or
// characters a URL may not hold is still taken out whole.
func Redact(list string) string {
	var b strings.Builder
	done := 0
	for _, r := range userinfos(list) {
		b.WriteString(list[done:r.start])
		if user, _, ok := strings.Cut(list[r.start:r.end], ":"); ok {
			b.WriteString(user + ":" + redacted)
		} else {
			b.WriteString(redacted)
		}
		done = r.end
	}
	b.WriteString(list[done:])
	return b.String()
}

// secrets returns the passwords and tokens of a server list, as written.
func secrets(list string) []string {
	var out []string
	for _, r := range userinfos(list) {
		info := list[r.start:r.end]
		if _, pass, ok := strings.Cut(info, ":"); ok {
			info = pass
		}
		if info != "" {
			out = append(out, info)
		}
	}
	return out
}

// span is a byte range [start, end) of a string.
type span struct{ start, end int }

// userinfos returns where the user information of each entry of list is:
// the text before an "@", back to the "://" before it — unless an earlier
// entry ended in between (an "@" and then a "," lie between them), when it
// starts after that ",". Spans of one entry's several "@" are merged.
func userinfos(list string) []span {
	var out []span
	for at := 0; at < len(list); at++ {
		if list[at] != '@' {
			continue
		}
		start := 0
		if c := strings.LastIndexByte(list[:at], ','); c >= 0 {
			start = c + 1
		}
		if sch := strings.LastIndex(list[:at], "://"); sch >= 0 {
			between := list[sch+3 : at]
			if !strings.Contains(between, "@") || !strings.Contains(between, ",") {
				start = sch + 3
			}
		}
		for start < at && list[start] == ' ' {
			start++
		}
		if n := len(out); n > 0 && start < out[n-1].end+1 {
			out[n-1].end = at
			continue
		}
		out = append(out, span{start, at})
	}
	return out
}

// Explain wraps a connection error from nats.go in what it means for the
// settings (decision 0044): a server certificate that QUILL_NATS_TLS_CA
// (or, unset, the system's roots) does not verify; a server that refused
// the client certificate or wanted one (QUILL_NATS_TLS_CERT); a server
// that refused the credentials or wanted some (QUILL_NATS_CREDS). Any
// other error, and nil, is returned as it is. The result wraps err.
func (c Settings) Explain(err error) error {
	var verify *tls.CertificateVerificationError
	var remote *net.OpError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &verify):
		if c.TLSCA == "" {
			return fmt.Errorf("the system's roots do not verify the NATS server's certificate (QUILL_NATS_TLS_CA is not set): %w", err)
		}
		return fmt.Errorf("QUILL_NATS_TLS_CA %q does not verify the NATS server's certificate: %w", c.TLSCA, err)
	// The server's alert about the client's certificate (bad certificate,
	// certificate required, unknown certificate authority, …). Under TLS
	// 1.3 the server checks that certificate after the client's side of
	// the handshake is done, so depending on timing the client reads the
	// alert or finds the connection closed right after the handshake.
	case errors.As(err, &remote) && remote.Op == "remote error" && strings.Contains(remote.Err.Error(), "certificate"),
		errors.Is(err, nats.ErrTLS) && (errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)):
		if c.TLSCert == "" {
			return fmt.Errorf("the NATS server refused the TLS connection, probably because it requires a client certificate (QUILL_NATS_TLS_CERT and QUILL_NATS_TLS_KEY are not set): %w", err)
		}
		return fmt.Errorf("the NATS server refused the TLS connection, probably rejecting the client certificate QUILL_NATS_TLS_CERT %q: %w", c.TLSCert, err)
	case errors.Is(err, nats.ErrAuthorization):
		if c.Creds == "" {
			return fmt.Errorf("the NATS server requires credentials (QUILL_NATS_CREDS is not set): %w", err)
		}
		return fmt.Errorf("the NATS server refused the credentials QUILL_NATS_CREDS %q: %w", c.Creds, err)
	}
	return err
}

// schemes are those nats.go connects with.
var schemes = map[string]bool{"nats": true, "tls": true, "ws": true, "wss": true}

// checkURLs checks a comma-separated server list as nats.go reads it: each
// entry a URL (nats://, tls://, ws://, wss://, or host:port without a
// scheme) with a host and, if given, a numeric port.
func checkURLs(list string) error {
	entries := strings.Split(list, ",")
	for i, e := range entries {
		e = strings.TrimSpace(e)
		shown := Redact(e) // an entry's password never reaches a message
		where := ""
		if len(entries) > 1 {
			where = fmt.Sprintf("server %d of %d ", i+1, len(entries))
		}
		if e == "" {
			return fmt.Errorf("%sis empty", where)
		}
		raw := e
		if !strings.Contains(e, "://") {
			raw = "nats://" + e
		}
		u, err := url.Parse(raw)
		if err != nil {
			return fmt.Errorf("%s%q is not a URL", where, shown)
		}
		if !schemes[u.Scheme] {
			return fmt.Errorf("%s%q: scheme %q is not nats, tls, ws or wss", where, shown, u.Scheme)
		}
		if u.Hostname() == "" {
			return fmt.Errorf("%s%q has no host", where, shown)
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return fmt.Errorf("%s%q: port %q is not 1 to 65535", where, shown, p)
			}
		} else if strings.HasSuffix(u.Host, ":") {
			return fmt.Errorf("%s%q has an empty port", where, shown)
		}
	}
	return nil
}

func checkReadable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	return f.Close()
}

func checkCreds(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	if !strings.Contains(s, "NATS USER JWT-----") || !strings.Contains(s, "USER NKEY SEED-----") {
		return errors.New("not a NATS credentials file (a user JWT and an NKey seed)")
	}
	return nil
}

func checkCA(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return errors.New("no PEM certificate in it")
	}
	return nil
}
