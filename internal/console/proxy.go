package console

import "github.com/quillhq/quill/internal/httpserve"

// TrustedProxies are the peers whose X-Forwarded-Proto and X-Forwarded-For
// the console believes (QUILL_TRUSTED_PROXIES).
type TrustedProxies = httpserve.TrustedProxies

// ParseTrustedProxies parses QUILL_TRUSTED_PROXIES: a comma-separated list
// of CIDR prefixes or single IP addresses ("" for none), such as
// "10.0.0.0/8, 192.0.2.7". Errors: an entry that is neither, named.
func ParseTrustedProxies(s string) (TrustedProxies, error) {
	return httpserve.ParsePrefixes(s)
}
