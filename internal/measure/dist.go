package measure

import (
	"math"
	"slices"
	"time"
)

// Dist is a latency distribution in milliseconds (rounded to µs), as the
// tools print it in their JSON results.
type Dist struct {
	N    int     `json:"n"`
	Min  float64 `json:"min_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

// Summarize sorts d in place and returns its distribution; the zero Dist
// when d is empty. Every sample is kept, so the percentiles are exact.
func Summarize(d []time.Duration) Dist {
	if len(d) == 0 {
		return Dist{}
	}
	slices.Sort(d)
	var sum time.Duration
	for _, v := range d {
		sum += v
	}
	return Dist{N: len(d), Min: Ms(d[0]), P50: Ms(Percentile(d, 50)), P90: Ms(Percentile(d, 90)),
		P99: Ms(Percentile(d, 99)), P999: Ms(Percentile(d, 99.9)), Max: Ms(d[len(d)-1]),
		Mean: Ms(sum / time.Duration(len(d)))}
}

// Percentile returns the nearest-rank p-th percentile (0 < p ≤ 100) of
// sorted, which must not be empty.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Ms returns d in milliseconds, rounded to three places (µs).
func Ms(d time.Duration) float64 { return Round(float64(d)/float64(time.Millisecond), 3) }

// Round rounds v to places decimal places.
func Round(v float64, places int) float64 {
	p := math.Pow(10, float64(places))
	return math.Round(v*p) / p
}
