package webhooks

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func ptr[T any](v T) *T { return &v }

func TestValidateCreate(t *testing.T) {
	t.Parallel()
	created := "quill.note.created.v1"
	deleted := "quill.note.deleted.v1"
	ok := func(u string) CreateInput { return CreateInput{URL: &u, EventTypes: &[]string{created}} }
	for _, tc := range []struct {
		name    string
		in      CreateInput
		private bool
		field   string // "" for valid
	}{
		{name: "https", in: ok("https://example.com/hooks")},
		{name: "https with port and query", in: ok("https://example.com:8443/h?x=1")},
		{name: "public literal IPv4", in: ok("https://93.184.216.34/h")},
		{name: "public literal IPv6", in: ok("https://[2606:2800:220:1::1]/h")},
		{name: "http", in: ok("http://example.com/h"), field: "url"},
		{name: "http allowed", in: ok("http://example.com/h"), private: true},
		{name: "ftp", in: ok("ftp://example.com/h"), field: "url"},
		{name: "relative", in: ok("/hooks"), field: "url"},
		{name: "no host", in: ok("https:///hooks"), field: "url"},
		{name: "opaque", in: ok("https:example.com"), field: "url"},
		{name: "userinfo", in: ok("https://user:pw@example.com/h"), field: "url"},
		{name: "fragment", in: ok("https://example.com/h#x"), field: "url"},
		{name: "empty fragment", in: ok("https://example.com/h#"), field: "url"},
		{name: "empty", in: ok(""), field: "url"},
		{name: "too long", in: ok("https://example.com/" + strings.Repeat("a", MaxURLBytes)), field: "url"},
		{name: "loopback", in: ok("https://127.0.0.1/h"), field: "url"},
		{name: "loopback IPv6", in: ok("https://[::1]/h"), field: "url"},
		{name: "RFC 1918 10", in: ok("https://10.1.2.3/h"), field: "url"},
		{name: "RFC 1918 172", in: ok("https://172.16.0.1/h"), field: "url"},
		{name: "RFC 1918 192", in: ok("https://192.168.1.1/h"), field: "url"},
		{name: "link-local metadata", in: ok("https://169.254.169.254/latest"), field: "url"},
		{name: "ULA", in: ok("https://[fd00::1]/h"), field: "url"},
		{name: "link-local IPv6 with zone", in: ok("https://[fe80::1%25eth0]/h"), field: "url"},
		{name: "unspecified", in: ok("https://0.0.0.0/h"), field: "url"},
		{name: "CGNAT", in: ok("https://100.64.0.1/h"), field: "url"},
		{name: "multicast", in: ok("https://224.0.0.1/h"), field: "url"},
		{name: "IPv4-mapped loopback", in: ok("https://[::ffff:127.0.0.1]/h"), field: "url"},
		{name: "localhost", in: ok("https://localhost/h"), field: "url"},
		{name: "private allowed", in: ok("http://127.0.0.1:8080/h"), private: true},
		{name: "no url", in: CreateInput{EventTypes: &[]string{created}}, field: "url"},
		{name: "no event types", in: CreateInput{URL: ptr("https://example.com")}, field: "event_types"},
		{name: "empty event types", in: CreateInput{URL: ptr("https://example.com"), EventTypes: &[]string{}}, field: "event_types"},
		{name: "unknown event type", in: CreateInput{URL: ptr("https://example.com"), EventTypes: &[]string{created, "note.created"}}, field: "event_types"},
		{name: "description", in: CreateInput{URL: ptr("https://example.com"), EventTypes: &[]string{deleted}, Description: ptr(strings.Repeat("d", MaxDescriptionBytes))}},
		{name: "description too long", in: CreateInput{URL: ptr("https://example.com"), EventTypes: &[]string{deleted}, Description: ptr(strings.Repeat("d", MaxDescriptionBytes+1))}, field: "description"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := Rules{AllowPrivate: tc.private}.ValidateCreate(tc.in)
			if tc.field == "" {
				require.NoError(t, err)
				require.Equal(t, *tc.in.URL, p.URL)
				return
			}
			var verr *ValidationError
			require.ErrorAs(t, err, &verr)
			require.Equal(t, tc.field, verr.Errors[0].Field, verr.Error())
		})
	}
}

func TestEventTypesDeduplicatedAndSorted(t *testing.T) {
	t.Parallel()
	p, err := Rules{}.ValidateCreate(CreateInput{URL: ptr("https://example.com"),
		EventTypes: &[]string{"quill.note.updated.v1", "quill.note.created.v1", "quill.note.updated.v1"}})
	require.NoError(t, err)
	require.Equal(t, []string{"quill.note.created.v1", "quill.note.updated.v1"}, p.EventTypes)
	require.Equal(t, []string{"quill.note.created.v1", "quill.note.updated.v1", "quill.note.deleted.v1", "quill.attachment.processed.v1"}, EventTypes())
}

func TestUnknownEventTypeIsNamed(t *testing.T) {
	t.Parallel()
	_, err := Rules{}.ValidateCreate(CreateInput{URL: ptr("https://example.com"), EventTypes: &[]string{"quill.note.archived.v1"}})
	require.ErrorContains(t, err, `"quill.note.archived.v1" is not an event type`)
}

func TestPublic(t *testing.T) {
	t.Parallel()
	for addr, public := range map[string]bool{
		"8.8.8.8": true, "2001:4860:4860::8888": true,
		"127.0.0.1": false, "10.0.0.1": false, "172.31.255.255": false, "192.168.0.1": false,
		"169.254.169.254": false, "fe80::1": false, "fc00::1": false, "fd12::1": false,
		"0.0.0.0": false, "::": false, "100.127.255.255": false, "224.0.0.251": false, "ff02::1": false,
		"::ffff:10.0.0.1": false, "255.255.255.255": false, "192.0.2.1": false, "2001:db8::1": false,
	} {
		require.Equal(t, public, Public(netip.MustParseAddr(addr)), addr)
	}
}

// Any input is either refused with a field error or accepted as https to
// a host that is not a literal non-public address, within the limits.
func FuzzValidateCreate(f *testing.F) {
	f.Add("https://example.com/h", "quill.note.created.v1", "d", false)
	f.Add("http://[::1]:80/#", "x", "", true)
	f.Add("https://user@10.0.0.1/", "", "", false)
	f.Fuzz(func(t *testing.T, u, typ, desc string, private bool) {
		p, err := Rules{AllowPrivate: private}.ValidateCreate(CreateInput{URL: &u, EventTypes: &[]string{typ}, Description: &desc})
		if err != nil {
			var verr *ValidationError
			require.ErrorAs(t, err, &verr)
			require.NotEmpty(t, verr.Errors)
			return
		}
		require.LessOrEqual(t, len(p.URL), MaxURLBytes)
		require.LessOrEqual(t, len(p.Description), MaxDescriptionBytes)
		require.Len(t, p.EventTypes, 1)
		if !private {
			require.True(t, strings.HasPrefix(strings.ToLower(p.URL), "https:"), p.URL)
		}
	})
}
