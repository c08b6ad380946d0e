package attachment_test

import (
	"testing"

	"github.com/quillhq/quill/internal/attachment"
)

// benchEachFixture runs body for each fixture of the worker benchmark,
// declared application/octet-stream, with the fixture's size as bytes per
// operation, and reports attachments/s besides ns/op.
func benchEachFixture(b *testing.B, body func(b *testing.B, in attachment.Input)) {
	for _, bc := range []struct {
		name string
		data []byte
	}{
		{"png64k", attachment.BenchFixturePNG64K()},
		{"text4k", attachment.BenchFixtureText4K()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			in := inputOf(bc.data, "application/octet-stream")
			b.SetBytes(int64(len(bc.data)))
			body(b, in)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "attachments/s")
		})
	}
}

// BenchmarkProcess is the raw processing rate the worker benchmark (make
// bench-worker) compares its pipeline with: the same fixtures, processed in
// memory with nothing around them.
func BenchmarkProcess(b *testing.B) {
	benchEachFixture(b, func(b *testing.B, in attachment.Input) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := attachment.Process(in, attachment.Limits{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkProcessParallel is the raw rate with every core busy (one
// goroutine per GOMAXPROCS), the like-for-like ceiling of a worker that
// processes several attachments at once.
func BenchmarkProcessParallel(b *testing.B) {
	benchEachFixture(b, func(b *testing.B, in attachment.Input) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := attachment.Process(in, attachment.Limits{}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
