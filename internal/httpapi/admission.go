package httpapi

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"

	"golang.org/x/time/rate"

	"github.com/quillhq/quill/contract"
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
	// policyTenantRate is the per-tenant request rate (decision 0046).
	policyTenantRate = "tenant-rate"
	// policyAuth is the per-address budget of failed authentications
	// (decision 0042).
	policyAuth = "auth"
)

// admission counts the requests the API works on, in all and per tenant,
// and refuses one past either limit at once: a request never waits for a
// slot, so a flood costs its sender 429s, not everyone else's latency.
//
// A tenant may also be held to a rate (Config.TenantRate, a token bucket of
// Config.TenantBurst): the concurrency limits are work-conserving — one
// tenant within them may still take every core the others leave idle, and
// on a small machine that is all of them — while a rate bounds what one
// tenant takes whatever the others do (decision 0046).
type admission struct {
	max, perTenant int
	rate           float64 // requests per second per tenant; 0: no rate limit
	burst          int

	mu      sync.Mutex
	all     int
	tenants map[string]int
	// buckets holds a bucket per tenant seen; tenants are what tokens
	// name, so the map is as large as the tenants the API serves.
	buckets map[string]*rate.Limiter
}

func newAdmission(maxAll, perTenant int, perSecond float64, burst int) *admission {
	if perSecond > 0 && burst < 1 {
		burst = max(1, int(math.Ceil(perSecond)))
	}
	return &admission{max: maxAll, perTenant: perTenant, rate: perSecond, burst: burst,
		tenants: map[string]int{}, buckets: map[string]*rate.Limiter{}}
}

// allowRate takes one request from tenant's bucket; it reports false when
// the bucket is empty (always true without a rate limit).
func (a *admission) allowRate(tenant string) bool {
	if a.rate <= 0 {
		return true
	}
	a.mu.Lock()
	b, ok := a.buckets[tenant]
	if !ok {
		b = rate.NewLimiter(rate.Limit(a.rate), a.burst)
		a.buckets[tenant] = b
	}
	a.mu.Unlock()
	return b.Allow()
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
	p := fmt.Sprintf(`"%s";q=%d;qu="concurrent-requests", "%s";q=%d;qu="concurrent-requests"`,
		policyServer, a.max, policyTenant, a.perTenant)
	if a.rate > 0 {
		// A quota of burst requests over the window in which the bucket
		// refills it.
		p += fmt.Sprintf(`, "%s";q=%d;w=%d`, policyTenantRate, a.burst, a.rateWindow())
	}
	return p
}

// rateWindow is the seconds in which an empty bucket refills, at least 1.
func (a *admission) rateWindow() int {
	return max(1, int(math.Ceil(float64(a.burst)/a.rate)))
}

// rateRetryAfter is when an empty bucket holds a request again, in whole
// seconds, at least 1.
func (a *admission) rateRetryAfter() int { return max(1, int(math.Ceil(1/a.rate))) }

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
// past its tenant's rate (Config.TenantRate) or while the API works on
// Config.TenantConcurrency requests of its tenant.
func (s *server) admitTenant(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := info(r).tenant
		if !s.admit.allowRate(tenant) {
			s.rateLimitedAfter(w, r, policyTenantRate, s.admit.rateRetryAfter(), "this tenant has sent as many requests as its rate allows; nothing was executed: send the same request with the same key after Retry-After")
			return
		}
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
	s.rateLimitedAfter(w, r, policy, rateLimitedRetryAfter, detail)
}

// rateLimitedAfter is rateLimited with Retry-After's seconds given.
func (s *server) rateLimitedAfter(w http.ResponseWriter, r *http.Request, policy string, retryAfter int, detail string) {
	h := w.Header()
	h.Set("RateLimit-Policy", s.admit.policy())
	h.Set("RateLimit", `"`+policy+`";r=0;t=`+strconv.Itoa(retryAfter))
	p := problem.New(http.StatusTooManyRequests, contract.CodeRateLimited, detail)
	p.RetryAfter = retryAfter
	writeProblem(w, r, p)
}
