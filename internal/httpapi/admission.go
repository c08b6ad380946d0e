package httpapi

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/quillhq/quill/internal/problem"
)

// Defaults of Config's admission limits (SPEC §2).
const (
	DefaultMaxConcurrency    = 256
	DefaultTenantConcurrency = 32
)

// rateLimitedRetryAfter is the Retry-After of a 429, in seconds: the
// limits count requests in flight, which mostly end within a second.
const rateLimitedRetryAfter = 1

// The policy names of the RateLimit-Policy and RateLimit fields
// (docs/decisions/0040).
const (
	policyServer = "server"
	policyTenant = "tenant"
	// policyAuth is the per-address budget of failed authentications
	// (decision 0042).
	policyAuth = "auth"
)

// admission counts the requests the API works on, in all and per tenant,
// and refuses one past either limit at once: a request never waits for a
// slot, so a flood costs its sender 429s, not everyone else's latency.
type admission struct {
	max, perTenant int

	mu      sync.Mutex
	all     int
	tenants map[string]int
}

func newAdmission(max, perTenant int) *admission {
	return &admission{max: max, perTenant: perTenant, tenants: map[string]int{}}
}

// enter takes a slot of the server's limit; it reports false when all are
// taken. A true answer must be followed by leave.
func (a *admission) enter() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.all >= a.max {
		return false
	}
	a.all++
	return true
}

func (a *admission) leave() {
	a.mu.Lock()
	a.all--
	a.mu.Unlock()
}

// enterTenant takes one of tenant's slots; it reports false when the
// tenant has all of its own. A true answer must be followed by
// leaveTenant.
func (a *admission) enterTenant(tenant string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.tenants[tenant] >= a.perTenant {
		return false
	}
	a.tenants[tenant]++
	return true
}

func (a *admission) leaveTenant(tenant string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.tenants[tenant]--; a.tenants[tenant] <= 0 {
		delete(a.tenants, tenant) // the map holds only tenants in flight
	}
}

// policy is the RateLimit-Policy field: both concurrency limits, in
// draft-ietf-httpapi-ratelimit-headers' syntax with the
// "concurrent-requests" quota unit.
func (a *admission) policy() string {
	return fmt.Sprintf(`"%s";q=%d;qu="concurrent-requests", "%s";q=%d;qu="concurrent-requests"`,
		policyServer, a.max, policyTenant, a.perTenant)
}

// admitServer refuses a request, before anything of it but its headers is
// read, while the API works on Config.MaxConcurrency requests.
func (s *server) admitServer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.admit.enter() {
			s.rateLimited(w, r, policyServer, "the server is working on as many requests as it takes at once; nothing was executed: send the same request with the same key after Retry-After")
			return
		}
		defer s.admit.leave()
		next.ServeHTTP(w, r)
	})
}

// admitTenant refuses an authenticated request, before its body is read,
// while the API works on Config.TenantConcurrency requests of its tenant.
func (s *server) admitTenant(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := info(r).tenant
		if !s.admit.enterTenant(tenant) {
			s.rateLimited(w, r, policyTenant, "this tenant has as many requests in flight as it may; nothing was executed: send the same request with the same key after Retry-After")
			return
		}
		defer s.admit.leaveTenant(tenant)
		next.ServeHTTP(w, r)
	})
}

// rateLimited answers 429 rate_limited for the exhausted policy, with
// Retry-After, RateLimit-Policy and RateLimit (no quota left, reset after
// Retry-After's seconds).
func (s *server) rateLimited(w http.ResponseWriter, r *http.Request, policy, detail string) {
	h := w.Header()
	h.Set("RateLimit-Policy", s.admit.policy())
	h.Set("RateLimit", `"`+policy+`";r=0;t=`+strconv.Itoa(rateLimitedRetryAfter))
	p := problem.New(http.StatusTooManyRequests, problem.CodeRateLimited, detail)
	p.RetryAfter = rateLimitedRetryAfter
	writeProblem(w, r, p)
}
