#!/usr/bin/env bash
# make bench-worker: attachments/s through the whole path (JetStream → worker
# → group commit → ack, BenchmarkPipeline, at the worker's default
# concurrency and batching) and, in the same run, two references for the same
# files:
#   - the store ceiling (BenchmarkStoreCeiling): the worker's own group-commit
#     transactions — lock, inbox, processing, result, outbox event, commit —
#     driven directly with full batches, without JetStream or the router:
#     what this database allows the pipeline;
#   - the raw processing rate (BenchmarkProcessParallel: every core busy,
#     nothing around the processing).
# It prints pipeline ÷ raw (target ≥ 0.7) and pipeline ÷ ceiling per
# fixture. QUILL_WORKER_CONCURRENCY and the benchmark's own
# BENCH_WORKER_BATCH_SIZE, BENCH_WORKER_COMMITTERS and BENCH_WORKER_BATCH_WAIT
# (the worker's constants BatchSize, Committers and BatchWait), when set,
# override the worker's defaults in both worker benchmarks; BENCH_WORKER_PNG_N and
# BENCH_WORKER_TEXT_N set the attachments per run. The relay is stopped once
# the note.created events are in the stream, so it does not publish the
# worker's attachment.processed events on the same cores during the
# measurement (make bench-relay measures that path). Per-event CPU is
# printed too: proc-µs/event is the test process (worker and in-process
# NATS), machine-µs/event every process (PostgreSQL included). Needs
# PostgreSQL (the tests' database); NATS runs in-process. The machine's load is printed: on shared
# cores compare the ratios of one run, not rates across runs.
#
# BENCH_WORKER_SCALEOUT=1 instead runs the worker part of the scale-out
# benchmark (scripts/bench-scaleout.sh, through bench-relay.sh): worker
# processes each held to a CPU cap, 2 against 1 (bench/README.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ ${BENCH_WORKER_SCALEOUT:-0} == 1 ]]; then
	BENCH_RELAY_SCALEOUT=1 BENCH_SCALEOUT_PARTS=${BENCH_SCALEOUT_PARTS:-worker} exec bash scripts/bench-relay.sh
fi
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
# Attachments per worker benchmark: a PNG costs ~6 ms of CPU, a text ~0.3 ms,
# so texts need more events for a run of a few seconds (the worker's start —
# consumer, subscriptions — is inside the timed part).
PNG_N=${BENCH_WORKER_PNG_N:-2000}
TEXT_N=${BENCH_WORKER_TEXT_N:-10000}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)"
"$GO" test -run '^$' -bench 'Pipeline/png|StoreCeiling/png' -benchtime "${PNG_N}x" ./internal/worker/ | tee -a "$out"
"$GO" test -run '^$' -bench 'Pipeline/text|StoreCeiling/text' -benchtime "${TEXT_N}x" ./internal/worker/ | tee -a "$out"
"$GO" test -run '^$' -bench 'Process' ./internal/attachment/ | tee -a "$out"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime)"

# Lines look like: BenchmarkPipeline/png64k-2  2000  7908361 ns/op  126.4 attachments/s  12.5 events/tx
metric() { awk -v name="$1" -v unit="$2" '$1 ~ "^"name"(-[0-9]+)?$" { for (i = 2; i < NF; i++) if ($(i+1) == unit) print $i }' "$out" | tail -n 1; }
echo
echo "fixture | pipeline /s | events/tx | store ceiling /s | raw (all cores) /s | raw (1 goroutine) /s | pipeline ÷ raw | pipeline ÷ ceiling"
for f in png64k text4k; do
	p=$(metric "BenchmarkPipeline/$f" attachments/s)
	b=$(metric "BenchmarkPipeline/$f" events/tx)
	c=$(metric "BenchmarkStoreCeiling/$f" attachments/s)
	rp=$(metric "BenchmarkProcessParallel/$f" attachments/s)
	r1=$(metric "BenchmarkProcess/$f" attachments/s)
	raw=$(ratio "$p" "$rp" 3)
	check ge "$raw" 0.7
	echo "$f | $p | $b | $c | $rp | $r1 | $raw ($VERDICT, target ≥ 0.7) | $(ratio "$p" "$c" 3)"
done
