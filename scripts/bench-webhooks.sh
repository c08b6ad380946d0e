#!/usr/bin/env bash
# make bench-webhooks: webhook deliveries/s through the dispatcher against
# the same POSTs sent directly, in the same run, and the dispatcher's
# commit → delivered latency at a steady rate (bench/README.md, Webhooks).
#
# Starts nats-server and ./bin/webhook-dispatcher (its defaults, but
# QUILL_WEBHOOK_ALLOW_PRIVATE=true for the loopback receiver) on a fresh
# database quill_bench_webhooks, then runs tools/webhookbench: a receiver
# that verifies each signature, phase 1 direct POSTs, phase 2 a drain of
# events published onto the stream the dispatcher consumes, phase 3 a paced
# rate. Targets: dispatcher ÷ direct ≥ 0.5; p99 < 100 ms at 200 events/s.
#
#   BENCH_EVENTS      events of phases 1 and 2 (default 5000)
#   BENCH_DURATION    seconds of phase 3 (default 20)
#   BENCH_RATE        events/s of phase 3 (default 200)
#   BENCH_WAIT_QUIET  seconds to wait for an idle machine first (default 0)
#   BENCH_RECEIVER_DELAY  a Go duration the receiver takes to answer each POST,
#                     in both phases (default 0s: at once; 20ms is a remote
#                     endpoint's round trip)
#   BENCH_PROFILE     a directory: the dispatcher runs with QUILL_PPROF=true
#                     and a CPU profile of the drain is written there
#   BENCH_STRICT=1    exit 1 when a target is missed
# Any QUILL_WEBHOOK_* / QUILL_DISPATCH_* setting in the environment reaches
# the dispatcher.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

EVENTS=${BENCH_EVENTS:-5000}
DURATION=${BENCH_DURATION:-20}
RATE=${BENCH_RATE:-200}
posint BENCH_EVENTS "$EVENTS"
posint BENCH_DURATION "$DURATION"
posint BENCH_RATE "$RATE"

work_dir quill-bench-webhooks
bench_db quill_bench_webhooks
build_bins ./cmd/api ./cmd/webhook-dispatcher ./tools/webhookbench
recreate_bench_db
nats_server_bin
nats_start "$WORK/nats"

KEY=$(head -c 32 /dev/urandom | base64)
log "starting the webhook dispatcher (log: $WORK/dispatcher.log)"
env -u GOMAXPROCS DATABASE_URL="$BENCH_URL" NATS_URL="$NATS_URL" QUILL_WEBHOOK_SECRET_KEY="$KEY" \
	QUILL_WEBHOOK_ALLOW_PRIVATE=true ${BENCH_PROFILE:+QUILL_PPROF=true} \
	./bin/webhook-dispatcher run --admin-addr 127.0.0.1:0 >"$WORK/dispatcher.out" 2>"$WORK/dispatcher.log" &
DISPATCHER_PID=$!
on_exit_stop "$DISPATCHER_PID"
wait_for_line "$WORK/dispatcher.log" '"listener":"admin","addr":"' "$DISPATCHER_PID" 15 ||
	die "the dispatcher did not report its admin address: $(tail -3 "$WORK/dispatcher.log")"
METRICS="http://$(log_addr "$WORK/dispatcher.log" admin)/metrics"
CONC=${QUILL_WEBHOOK_ENDPOINT_CONCURRENCY:-8}

wait_quiet_start
load0=$(cut -d' ' -f1-3 /proc/loadavg)
json=$(./bin/webhookbench --database-url "$BENCH_URL" --nats-url "$NATS_URL" --secret-key "$KEY" \
	--metrics-url "$METRICS" ${BENCH_PROFILE:+--profile-dir "$BENCH_PROFILE"} \
	--events "$EVENTS" --concurrency "$CONC" --rate "$RATE" --duration "${DURATION}s" \
	--receiver-delay "${BENCH_RECEIVER_DELAY:-0s}" --json 2>"$WORK/webhookbench.log") ||
	die "webhookbench failed: $(tail -3 "$WORK/webhookbench.log")"
load1=$(cut -d' ' -f1-3 /proc/loadavg)
kill -0 "$DISPATCHER_PID" 2>/dev/null || die "the dispatcher exited during the run (see $WORK/dispatcher.log)"

direct=$(jget "$json" direct_per_s)
disp=$(jget "$json" dispatcher_per_s)
r=$(jget "$json" ratio)
p99=$(jget "$(jobj "$json" latency)" p99_ms)
check ge "$r" 0.5
vr=$VERDICT
check lt "$p99" 100
vp=$VERDICT
{
	echo "make bench-webhooks, $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "$(host_line)"
	echo "$(pg_line synchronous_commit shared_buffers)"
	echo "load average before $load0, after $load1; $BG of $NCPU cores busy before the start"
	echo
	printf 'phase 1 direct        %8.0f deliveries/s  (%s POSTs, %s senders, %s B bodies, the receiver answering after %s ms)\n' "$direct" "$EVENTS" "$CONC" "$(jget "$json" body_bytes)" "$(jget "$json" receiver_delay_ms)"
	printf 'phase 2 dispatcher    %8.0f deliveries/s  (events published at %.0f/s, drained)\n' "$disp" "$(jget "$json" publish_per_s)"
	echo "ratio dispatcher ÷ direct: $r ($vr, target ≥ 0.5)"
	lat=$(jobj "$json" latency)
	echo "phase 3 at $(jget "$json" paced_rate) events/s for $(jget "$json" duration_s) s: commit → delivered p50 $(jget "$lat" p50_ms) ms, p90 $(jget "$lat" p90_ms) ms, p99 $p99 ms ($vp, target < 100 ms), max $(jget "$lat" max_ms) ms"
	echo "quill_webhook_delivery_seconds over phase 3: $(jget "$json" histogram_count) observations, p99 in the bucket le=$(jget "$json" histogram_p99_le) s"
	echo "bad signatures $(jget "$json" bad_signatures), duplicate deliveries $(jget "$json" duplicates)"
} >"$WORK/report.txt"
stop_role dispatcher "$DISPATCHER_PID"
publish_report bench/results/webhooks-latest.txt
