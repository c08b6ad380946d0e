// Package webhooks holds tenants' webhook endpoints (SPEC §11, issue 27):
// their rules (ValidateCreate), their store (the one writer of
// webhook_endpoints) and their writes, each an operation run by the one
// write path, idempotency.Protocol, as the notes' writes are. The
// dispatcher (internal/dispatch) reads the endpoints and writes their health
// and deliveries; this package reads the health only.
package webhooks

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/quillhq/quill/contract"

	"github.com/quillhq/quill/internal/validation"
)

// Limits of an endpoint's fields and of a tenant's endpoints.
const (
	// MaxURLBytes bounds an endpoint's url.
	MaxURLBytes = 2048
	// MaxDescriptionBytes bounds an endpoint's description.
	MaxDescriptionBytes = 256
	// MaxEndpoints is how many live endpoints a tenant may have: each one
	// is a delivery row per event, and a tenant with more is better served
	// by one receiver that fans out.
	MaxEndpoints = 16
)

// CreateInput is the body of POST /v1/webhooks as sent; a nil member was
// absent.
type CreateInput struct {
	URL         *string   `json:"url"`
	EventTypes  *[]string `json:"event_types"`
	Description *string   `json:"description"`
}

// CreateParams are a create's validated parameters: EventTypes are
// CloudEvents types, deduplicated and sorted.
type CreateParams struct {
	URL         string
	EventTypes  []string
	Description string
}

// FieldError is one invalid field of a request (validation.FieldError).
type FieldError = validation.FieldError

// ValidationError lists every invalid field of a request
// (validation.Error, the one type the API renders).
type ValidationError = validation.Error

// Rules are the deployment's choices that validation depends on.
type Rules struct {
	// AllowPrivate accepts http URLs and hosts that are literal private,
	// loopback or otherwise non-public addresses
	// (QUILL_WEBHOOK_ALLOW_PRIVATE, for development and tests).
	AllowPrivate bool
}

// EventTypes returns the CloudEvents types an endpoint may subscribe to,
// in SPEC §5's order.
func EventTypes() []string {
	types := contract.EventTypes()
	for i, t := range types {
		types[i] = contract.CloudEventType(t)
	}
	return types
}

// ValidateCreate checks in and returns its parameters. It returns a
// *ValidationError naming every invalid field.
func (ru Rules) ValidateCreate(in CreateInput) (CreateParams, error) {
	var p CreateParams
	verr := &ValidationError{}
	if in.URL == nil {
		verr.Add("url", "is required: the https URL deliveries are POSTed to")
	} else {
		p.URL = *in.URL
		if msg := ru.checkURL(p.URL); msg != "" {
			verr.Add("url", "%s", msg)
		}
	}
	if in.EventTypes == nil {
		verr.Add("event_types", "is required: a list of the event types to deliver, e.g. [%q]", EventTypes()[0])
	} else {
		p.EventTypes = checkEventTypes(verr, *in.EventTypes)
	}
	if in.Description != nil {
		p.Description = *in.Description
		if n := len(p.Description); n > MaxDescriptionBytes {
			verr.Add("description", "is %d bytes long, the limit is %d", n, MaxDescriptionBytes)
		}
	}
	if len(verr.Errors) > 0 {
		return CreateParams{}, verr
	}
	return p, nil
}

// checkEventTypes returns types deduplicated and sorted, adding an error
// for an empty list and for each type that is not one of EventTypes.
func checkEventTypes(verr *ValidationError, types []string) []string {
	if len(types) == 0 {
		verr.Add("event_types", "must name at least one event type; one of %s", strings.Join(EventTypes(), ", "))
		return nil
	}
	known := EventTypes()
	out := make([]string, 0, len(types))
	for _, t := range types {
		if !slices.Contains(known, t) {
			verr.Add("event_types", "%q is not an event type; the types are %s", truncate(t, 64), strings.Join(known, ", "))
			continue
		}
		out = append(out, t)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// checkURL returns why u is not an acceptable endpoint URL, or "".
func (ru Rules) checkURL(u string) string {
	if len(u) > MaxURLBytes {
		return fmt.Sprintf("is %d bytes long, the limit is %d", len(u), MaxURLBytes)
	}
	if u == "" {
		return "must not be empty"
	}
	pu, err := url.Parse(u)
	if err != nil {
		return "is not a valid URL"
	}
	switch {
	case !pu.IsAbs() || pu.Opaque != "":
		return "must be an absolute https URL, such as https://example.com/hooks/quill"
	case pu.Scheme == "http" && !ru.AllowPrivate:
		return "must use https (http is accepted only when the deployment sets QUILL_WEBHOOK_ALLOW_PRIVATE=true)"
	case pu.Scheme != "https" && pu.Scheme != "http":
		return "must use https"
	case pu.User != nil:
		return "must not hold a user name or password; authenticate deliveries by their signature"
	case pu.Fragment != "" || strings.Contains(u, "#"):
		return "must not have a fragment (#…): it is never sent"
	case pu.Hostname() == "":
		return "must name a host"
	}
	if !ru.AllowPrivate {
		if addr, ok := literalIP(pu.Hostname()); ok && !Public(addr) {
			return fmt.Sprintf("names %s, which is not a public address; deliveries go to public addresses only", addr)
		}
		if h := strings.ToLower(strings.TrimSuffix(pu.Hostname(), ".")); h == "localhost" || strings.HasSuffix(h, ".localhost") {
			return "names localhost, which is not a public address; deliveries go to public addresses only"
		}
	}
	return ""
}

// literalIP returns the address host is, when it is a literal IP (an
// IPv6 zone dropped).
func literalIP(host string) (netip.Addr, bool) {
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = host[:i]
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		// Forms net.ParseIP reads that netip does not (none today), kept
		// for safety: an address refused late is still refused.
		ip := net.ParseIP(host)
		if ip == nil {
			return netip.Addr{}, false
		}
		addr, _ = netip.AddrFromSlice(ip)
	}
	return addr.Unmap(), true
}

// nonPublic are the ranges Public refuses besides what netip classifies:
// CGNAT (RFC 6598), the IETF protocol block, benchmarking and the
// documentation ranges, 6to4 relay anycast, NAT64 and the "this network"
// block.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001:db8::/32"),
}

// Public reports whether addr is a public unicast address: not loopback,
// private (RFC 1918, IPv6 ULA), link-local (cloud metadata lives there),
// unspecified, multicast, CGNAT or one of the reserved ranges.
func Public(addr netip.Addr) bool {
	addr = addr.Unmap()
	if !addr.IsValid() || addr.IsLoopback() || addr.IsPrivate() || addr.IsLinkLocalUnicast() ||
		addr.IsLinkLocalMulticast() || addr.IsInterfaceLocalMulticast() || addr.IsMulticast() || addr.IsUnspecified() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}

// truncate cuts s to at most n bytes for quoting in a message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
