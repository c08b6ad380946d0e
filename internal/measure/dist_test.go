package measure

import (
	"fmt"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	t.Parallel()
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	s := Summarize(d)
	if s.N != 100 || s.P50 != 50 || s.P99 != 99 || s.Max != 100 || s.Min != 1 {
		t.Fatalf("Summarize = %+v", s)
	}
	if s := Summarize(nil); s != (Dist{}) {
		t.Fatalf("Summarize(nil) = %+v, want the zero Dist", s)
	}
}

func ExampleSummarize() {
	lat := []time.Duration{3 * time.Millisecond, 1 * time.Millisecond, 2500 * time.Microsecond, 10 * time.Millisecond}
	s := Summarize(lat)
	fmt.Printf("n %d, p50 %v ms, p99 %v ms, mean %v ms\n", s.N, s.P50, s.P99, s.Mean)
	// Output: n 4, p50 2.5 ms, p99 10 ms, mean 4.125 ms
}
