package auth

import (
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/quillhq/quill/internal/lru"
)

// AddressBudget is decision 0042's budget of failures per client address,
// for callers that check a secret of their own (the console's sign-in): a
// token bucket per address (an IPv6 address's /64), least recently used
// out past 10,000 addresses. An attempt takes a failure's worth before it
// runs, so that concurrent attempts cannot all pass a bucket with one
// left, and gives it back when it did not fail. It is safe for concurrent
// use.
type AddressBudget struct {
	perSecond float64
	burst     int

	mu       sync.Mutex
	limiters *lru.Cache[string, *rate.Limiter]
}

// NewAddressBudget returns a budget of burst failures per address, refilled
// at perSecond.
func NewAddressBudget(perSecond float64, burst int) *AddressBudget {
	return &AddressBudget{perSecond: perSecond, burst: max(burst, 1),
		limiters: lru.New[string, *rate.Limiter](maxAddresses)}
}

// Take takes one failure's worth from addr's bucket (addr an IP address,
// or host:port) at now, ahead of an attempt, and returns the function that
// gives it back, to be called when the attempt did not fail. Errors: a
// *RateLimitedError (wrapping ErrRateLimited) when the bucket is empty:
// the attempt must not run.
func (b *AddressBudget) Take(addr string, now time.Time) (giveBack func(), err error) {
	key := addressKey(addr)
	b.mu.Lock()
	defer b.mu.Unlock()
	lim, ok := b.limiters.Get(key)
	if !ok {
		lim = rate.NewLimiter(rate.Limit(b.perSecond), b.burst)
		b.limiters.Put(key, lim)
	}
	r := lim.ReserveN(now, 1)
	if !r.OK() || r.DelayFrom(now) > 0 {
		r.CancelAt(now)
		return nil, limitedAt(lim, now)
	}
	return func() { r.CancelAt(now) }, nil
}

// limitedAt is the RateLimitedError of lim at now: Retry-After is when the
// bucket holds one token again, in whole seconds, at least one.
func limitedAt(lim *rate.Limiter, now time.Time) error {
	missing := 1 - lim.TokensAt(now)
	wait := time.Duration(missing / float64(lim.Limit()) * float64(time.Second))
	return &RateLimitedError{RetryAfter: max(time.Second, wait.Round(time.Second))}
}
