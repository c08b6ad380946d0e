package metrics

import "github.com/prometheus/client_golang/prometheus"

// NewDecodeMemory registers on reg the worker's gauge
// quill_worker_decode_memory_bytes, at 0: the decode weight of the images
// admitted under QUILL_WORKER_DECODE_MEMORY right now (worker.WithDecodeMemoryGauge).
func NewDecodeMemory(reg prometheus.Registerer) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quill_worker_decode_memory_bytes",
		Help: "Decode memory admitted now: the weights (width × height × bytes per pixel, from the header, and the decoder's and scaler's buffers) of the images being decoded, under QUILL_WORKER_DECODE_MEMORY.",
	})
	reg.MustRegister(g)
	return g
}
