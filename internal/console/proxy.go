package console

import "github.com/quillhq/quill/internal/httpserve"

// TrustedProxies are the peers whose X-Forwarded-Proto and X-Forwarded-For
// the console believes (QUILL_TRUSTED_PROXIES).
type TrustedProxies = httpserve.TrustedProxies
