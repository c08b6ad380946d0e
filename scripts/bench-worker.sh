#!/usr/bin/env bash
# make bench-worker: attachments/s through the whole path (JetStream → worker
# at concurrency 4 → commit → ack, BenchmarkPipeline) and, in the same run,
# the raw processing rate of the same files (BenchmarkProcessParallel: every
# core busy, nothing around the processing) — then the pipeline ÷ raw ratio
# per fixture (target ≥ 0.7). Needs PostgreSQL (the tests' database); NATS
# runs in-process.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GO=${GO:-go}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

$GO test -run '^$' -bench 'Pipeline' -benchtime 2000x ./internal/worker/ | tee -a "$out"
$GO test -run '^$' -bench 'Process' ./internal/attachment/ | tee -a "$out"

# Lines look like: BenchmarkPipeline/png64k-2  2000  7908361 ns/op  126.4 attachments/s
rate() { awk -v name="$1" '$1 ~ "^"name"(-[0-9]+)?$" { for (i = 2; i < NF; i++) if ($(i+1) == "attachments/s") print $i }' "$out" | tail -n 1; }
echo
echo "fixture | pipeline /s | raw (all cores) /s | raw (1 goroutine) /s | pipeline ÷ raw (all cores)"
for f in png64k text4k; do
	p=$(rate "BenchmarkPipeline/$f")
	rp=$(rate "BenchmarkProcessParallel/$f")
	r1=$(rate "BenchmarkProcess/$f")
	ratio=$(awk -v a="$p" -v b="$rp" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "n/a" }')
	verdict=$(awk -v r="$ratio" 'BEGIN { print (r + 0 >= 0.7) ? "met" : "MISSED" }')
	echo "$f | $p | $rp | $r1 | $ratio ($verdict, target ≥ 0.7)"
done
