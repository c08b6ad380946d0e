#!/usr/bin/env bash
# bench-relay.sh: `make bench-relay` — the relay's publish throughput against
# the raw JetStream ceiling, and the end-to-end latency commit → stream ack
# under API load (see bench/README.md).
#
#   1. builds ./bin/{api,relay,loadgen,relaybench} and (once) the
#      nats-server go.mod pins into .data/bin; drops and recreates the
#      database quill_bench_relay on the server of $DATABASE_URL (`api
#      migrate`);
#      starts `api serve` on free loopback ports and creates a token;
#   2. for each NATS mode (defaults; sync_interval: always) starts its own
#      nats-server on a free port with a fresh store directory, then:
#      a. seeds 100,000 pending events (relaybench seed), runs 1 relay until
#         all are published and marked; re-seeds, the same with 2 relays;
#      b. the raw ceiling, 3 times between those runs (before, between,
#         after): relaybench raw, the same number and size of messages into
#         the same kind of stream, async with message ids, pending acks
#         bounded like the relay's;
#      c. API + 1 relay while loadgen creates notes at a fixed rate (500/s):
#         per event, commit → stored in the stream and commit → marked;
#   3. prints the table, target verdicts and CPU use per phase, and writes
#      them to bench/results/relay-latest.txt. Everything it started is
#      stopped on exit.
#
# Settings (environment): DATABASE_URL (only its server and credentials are
# used), BENCH_EVENTS (100000), BENCH_NOTES (20000), BENCH_RAW_RUNS (3),
# BENCH_RATE (500, creates/s), BENCH_E2E_DURATION (20, seconds),
# BENCH_E2E_WARMUP (2, seconds), BENCH_E2E_CONCURRENCY (32, most creates in
# flight), BENCH_NATS_MODES ("default always"), BENCH_STRICT=1 to exit 1
# when a target is missed, BENCH_WAIT_QUIET (0, seconds to wait for an
# otherwise idle machine).
#
# BENCH_RELAY_SCALEOUT=1 runs the scale-out benchmark instead
# (scripts/bench-scaleout.sh, sourced after the helpers below): relays and
# workers each held to a CPU cap, 1 against 2, and the relay against a
# three-node NATS cluster with an R3 stream; written to
# bench/results/scaleout-latest.txt.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

EVENTS=${BENCH_EVENTS:-100000}
NOTES=${BENCH_NOTES:-20000}
RAW_RUNS=${BENCH_RAW_RUNS:-3}
RATE=${BENCH_RATE:-500}
E2E_DURATION=${BENCH_E2E_DURATION:-20}
E2E_WARMUP=${BENCH_E2E_WARMUP:-2}
E2E_CONCURRENCY=${BENCH_E2E_CONCURRENCY:-32}
MODES=${BENCH_NATS_MODES:-default always}
# The relay's batch, fixed (relay.DefaultBatch, decision 0076; it was
# QUILL_RELAY_BATCH): raw bounds its pending acks as the relay does, 2 × it.
RELAY_BATCH=256
STREAM=QUILL_BENCH
PREFIX=quillbench
TENANT=bench
RESULTS=bench/results/relay-latest.txt
SCALEOUT=${BENCH_RELAY_SCALEOUT:-0}
[[ $SCALEOUT == 0 || $SCALEOUT == 1 ]] || die "BENCH_RELAY_SCALEOUT must be 0 or 1, got '$SCALEOUT'"
# The roles of cpu_report's table (relay, nats and pg are its 4th to 6th
# columns: relay_run reads them).
ROLES="client api relay nats pg"
# RELAY_CAP: cores each relay is held to (scale-out mode; empty: none).
# RELAY_ENV: more environment for the relays (a cluster's settings).
RELAY_CAP=""
RELAY_ENV=()

posint BENCH_EVENTS "$EVENTS"
posint BENCH_NOTES "$NOTES"
posint BENCH_RAW_RUNS "$RAW_RUNS"
posint BENCH_RATE "$RATE"
posint BENCH_E2E_DURATION "$E2E_DURATION"
posint BENCH_E2E_CONCURRENCY "$E2E_CONCURRENCY"
seconds BENCH_E2E_WARMUP "$E2E_WARMUP"
((NOTES <= EVENTS)) || die "BENCH_NOTES ($NOTES) must not exceed BENCH_EVENTS ($EVENTS)"
for m in $MODES; do
	case $m in default | always) ;; *) die "BENCH_NATS_MODES holds '$m'; use default and/or always" ;; esac
done

bench_db quill_bench_relay
command -v curl >/dev/null 2>&1 || die "curl not found (it reads the relays' /metrics)"

work_dir quill-bench-relay
BINS=(./cmd/api ./cmd/relay ./tools/loadgen ./tools/relaybench)
if ((SCALEOUT)); then BINS+=(./cmd/attachment-worker); fi
build_bins "${BINS[@]}"
nats_server_bin
log "nats-server $NATS_SERVER_VERSION (from go.mod) in $NATS_SERVER"
recreate_bench_db

# With BENCH_WAIT_QUIET=N, every measured phase first waits (up to N s) for
# the machine to quiet down: a relay run lasts seconds, and other work that
# starts meanwhile skews it (it shows as "other" in the CPU table).
wait_quiet_start
BG_START=$BG
QUIET_NOTE=""
if ((WAIT_QUIET > 0)); then QUIET_NOTE=" (BENCH_WAIT_QUIET=$WAIT_QUIET: each phase first waited for fewer than $QUIET_LIMIT busy cores)"; fi
# quiet_phase: wait_quiet before a measured phase when asked to.
quiet_phase() { if ((WAIT_QUIET > 0)); then wait_quiet; fi; }

relaybench() { ./bin/relaybench "$@"; }
NATS_PID=""
RELAY_PIDS=()

# --- API ------------------------------------------------------------------------
start_api "$TENANT"

# --- NATS -------------------------------------------------------------------------
# start_nats MODE: a nats-server on a free loopback port, JetStream storing
# in a fresh directory; sets NATS_PID and NATS_URL.
start_nats() {
	local dir="$WORK/nats-$1" setting=""
	if [[ $1 == always ]]; then setting="sync_interval: always"; fi
	nats_start "$dir" "$setting"
	ROLE[$NATS_PID]=nats
	log "nats-server ($1) pid $NATS_PID at $NATS_URL, store $dir/store"
}
stop_nats() {
	stop_pid "$NATS_PID"
	unset "ROLE[$NATS_PID]"
	NATS_PID=""
	rm -rf "$WORK/nats-$1/store"
}

# --- relays -------------------------------------------------------------------------
# start_relays N LABEL: N relays on the bench database and stream; appends
# their pids to RELAY_PIDS.
start_relays() {
	local i pid cmd
	for ((i = 1; i <= $1; i++)); do
		cmd=(env DATABASE_URL="$BENCH_URL" NATS_URL="$NATS_URL" QUILL_STREAM="$STREAM"
			QUILL_SUBJECT_PREFIX="$PREFIX" QUILL_ADMIN_ADDR=127.0.0.1:0
			"${RELAY_ENV[@]}" ./bin/relay run)
		if [[ -n $RELAY_CAP ]]; then
			cap_start "relay$i" "$RELAY_CAP" "$WORK/$2-relay$i.log" "${cmd[@]}"
			pid=$CAPPED_PID
		else
			env -u GOMAXPROCS "${cmd[@]}" >"$WORK/$2-relay$i.out" 2>"$WORK/$2-relay$i.log" &
			pid=$!
		fi
		RELAY_PIDS+=("$pid")
		ROLE[$pid]=relay
		on_exit_stop "$pid"
	done
}
# relay_metrics LABEL: "published duplicates errors" summed over the relays'
# /metrics.
relay_metrics() {
	metrics_sum '$1 == "quill_relay_published_total" { p = $2 } $1 == "quill_relay_duplicates_total" { d = $2 }
		$1 == "quill_relay_publish_errors_total" { e = $2 } END { printf "%d %d %d\n", p, d, e }' "$WORK/$1"-relay*.log
}
stop_relays() {
	stop_role relay "${RELAY_PIDS[@]}"
	RELAY_PIDS=()
}

# --- phases ---------------------------------------------------------------------------
fresh_outbox() {
	psql_bench -c 'TRUNCATE outbox_events RESTART IDENTITY'
	SEED=$(relaybench seed --database-url "$BENCH_URL" --count "$EVENTS" --notes "$NOTES" --tenant "$TENANT") ||
		die "relaybench seed failed"
	# A backlog this size has been analysed by autovacuum long before a
	# relay drains it; without statistics the claim's plan is a guess.
	psql_bench -c 'VACUUM ANALYZE outbox_events' -c 'VACUUM ANALYZE outbox_pending' -c CHECKPOINT
}

declare -A RAW_RATES RAW_CLIENT RAW_ERR RELAY_RATE RELAY_MARKED RELAY_METRICS RELAY_MSGS RELAY_CPU_US
declare -A E2E LG RAW_DONE THROTTLE
# throttle_sum PREFIX N: "periods throttled" summed over the capped groups
# PREFIX1..PREFIXN (cap_throttled).
throttle_sum() {
	local i p t tp=0 tt=0
	for ((i = 1; i <= $2; i++)); do
		read -r p t _ < <(cap_throttled "$1$i")
		[[ $p == - ]] && {
			echo "- -"
			return
		}
		tp=$((tp + p)) tt=$((tt + t))
	done
	echo "$tp $tt"
}
# raw_run MODE: one raw ceiling run; appends its rate to RAW_RATES[MODE].
# RAW_ARGS: more flags for relaybench raw (a cluster's --replicas).
RAW_ARGS=()
raw_run() {
	local mode=$1 i out pid j
	i=$((${RAW_DONE[$mode]:-0} + 1))
	RAW_DONE[$mode]=$i
	out="$WORK/$mode-raw$i"
	quiet_phase
	log "[$mode] raw JetStream ceiling, run $i of $RAW_RUNS ($EVENTS messages)"
	relaybench raw --nats-url "$NATS_URL" --stream "$STREAM" --subject-prefix "$PREFIX" --tenant "$TENANT" \
		--count "$EVENTS" --notes "$NOTES" --max-pending $((2 * RELAY_BATCH)) "${RAW_ARGS[@]}" >"$out.json" 2>"$out.err" &
	pid=$!
	ROLE[$pid]=client
	wait_for_line "$out.err" 'publishing' "$pid" 120 || true
	cpu_window_start
	wait "$pid" || die "relaybench raw failed: $(tail -3 "$out.err")"
	cpu_window_end
	unset "ROLE[$pid]"
	j=$(<"$out.json")
	RAW_RATES[$mode]="${RAW_RATES[$mode]:-} $(jget "$(jobj "$j" stream)" rate)"
	RAW_CLIENT[$mode]="${RAW_CLIENT[$mode]:-} $(jget "$j" client_rate)"
	RAW_ERR[$mode]=$((${RAW_ERR[$mode]:-0} + $(jget "$j" errors)))
	cpu_window_report "$mode-raw$i" "$ROLES" "$(jget "$j" cpu_cores)"
	relaybench reset --nats-url "$NATS_URL" --stream "$STREAM" >/dev/null
}

# relay_run MODE N: N relays drain a fresh backlog.
relay_run() {
	local mode=$1 n=$2 label="$1-relays$2" j
	log "[$mode] $n relay(s): seeding $EVENTS pending events over $NOTES notes"
	relaybench reset --nats-url "$NATS_URL" --stream "$STREAM" >/dev/null
	fresh_outbox
	quiet_phase
	log "[$mode] $n relay(s): publishing"
	cpu_window_start
	start_relays "$n" "$label"
	j=$(relaybench wait --nats-url "$NATS_URL" --database-url "$BENCH_URL" --stream "$STREAM" --count "$EVENTS") ||
		die "$label: the relays did not publish the backlog (logs in $WORK)"
	relays_drained "$label" "$n" "$j"
	echo "$j" >>"$WORK/relay-runs.jsonl"
}

# relays_drained LABEL N JSON: ends a run of N relays that drained a backlog
# of EVENTS (JSON: relaybench wait's answer) inside a CPU window
# (cpu_window_start): closes and reports the window, reads the relays'
# metrics (and, capped, their throttling), stops them and records the run
# under LABEL in RELAY_RATE, RELAY_MSGS, RELAY_MARKED, RELAY_METRICS and
# RELAY_CPU_US.
relays_drained() {
	local label=$1 n=$2 j=$3 sp pub dup err
	cpu_window_end "$label" "$ROLES"
	read -r pub dup err < <(relay_metrics "$label")
	if [[ -n $RELAY_CAP ]]; then THROTTLE[$label]=$(throttle_sum relay "$n"); fi
	stop_relays
	sp=$(jobj "$j" stream)
	RELAY_RATE[$label]=$(jget "$sp" rate)
	RELAY_MSGS[$label]=$(jget "$sp" messages)
	RELAY_MARKED[$label]=$(jget "$j" all_marked_s)
	RELAY_METRICS[$label]="$pub $dup $err"
	# CPU per event, µs: cores × window ÷ events, for relay, nats, postgres.
	RELAY_CPU_US[$label]=$(tail -1 "$WORK/cpu" | awk -v s="$WINDOW_S" -v n="$EVENTS" \
		'{ printf "%.0f %.0f %.0f", $4 * s / n * 1e6, $5 * s / n * 1e6, $6 * s / n * 1e6 }')
}

# warn_lost_events: a WARNING for each relay run whose stream did not hold
# EVENTS messages.
warn_lost_events() {
	local l
	for l in "${!RELAY_MSGS[@]}"; do
		if [[ ${RELAY_MSGS[$l]} != "$EVENTS" ]]; then
			echo "  WARNING: $l: the stream holds ${RELAY_MSGS[$l]} messages, not $EVENTS — events lost or stored twice"
		fi
	done
}

# e2e_run MODE: API + 1 relay, loadgen at RATE creates/s.
e2e_run() {
	local mode=$1 label="$1-e2e" pid t_start t_from t_to n j
	log "[$mode] end to end: API + 1 relay, $RATE creates/s (${E2E_WARMUP}s warmup + ${E2E_DURATION}s)"
	relaybench reset --nats-url "$NATS_URL" --stream "$STREAM" >/dev/null
	# The published backlog of the last run stays, as the outbox retention
	# keeps published events for days; the API's own tables start empty.
	psql_bench -c 'TRUNCATE notes, attachments, operations' -c 'VACUUM ANALYZE outbox_events' -c 'VACUUM ANALYZE outbox_pending' -c CHECKPOINT
	quiet_phase
	start_relays 1 "$label"
	wait_for_line "$WORK/$label-relay1.log" '"listener":"admin"' "${RELAY_PIDS[0]}" 15 ||
		die "$label: the relay did not start (see $WORK/$label-relay1.log)"
	t_start=$(now_s)
	./bin/loadgen --url "$API_URL" --token "$TOKEN" --mode create --rate "$RATE" --concurrency "$E2E_CONCURRENCY" \
		--duration "${E2E_DURATION}s" --warmup "${E2E_WARMUP}s" --json >"$WORK/$label-loadgen.json" 2>"$WORK/$label-loadgen.err" &
	pid=$!
	ROLE[$pid]=client
	ROLE[$API_PID]=api
	wait_for_line "$WORK/$label-loadgen.err" 'measuring' "$pid" $((E2E_WARMUP + 30)) ||
		die "loadgen failed: $(tail -3 "$WORK/$label-loadgen.err")"
	t_from=$(now_s)
	# Sample inside the measured window: from 1 s in to 1.5 s before its end.
	sleep 1
	cpu_window_start
	sleep "$(awk -v d="$E2E_DURATION" 'BEGIN { print (d > 3 ? d - 2.5 : d / 2) }')"
	cpu_window_end "$label" "$ROLES"
	wait "$pid" || die "loadgen failed: $(tail -3 "$WORK/$label-loadgen.err")"
	t_to=$(now_s)
	unset "ROLE[$pid]" "ROLE[$API_PID]"
	LG[$mode]=$(<"$WORK/$label-loadgen.json")
	n=$(psql_bench -Atc "SELECT count(*) FROM outbox_events WHERE created_at >= to_timestamp($t_start)")
	relaybench wait --nats-url "$NATS_URL" --database-url "$BENCH_URL" --stream "$STREAM" --count "$n" --timeout 2m >/dev/null ||
		die "$label: the relay did not publish the $n events created (logs in $WORK)"
	j=$(relaybench latency --nats-url "$NATS_URL" --database-url "$BENCH_URL" --stream "$STREAM" --from "$t_from" --to "$t_to" \
		--api-log "$WORK/api.log") ||
		die "relaybench latency failed"
	E2E[$mode]=$j
	RELAY_METRICS[$label]=$(relay_metrics "$label")
	stop_relays
}

if ((SCALEOUT)); then
	# shellcheck source=scripts/bench-scaleout.sh
	source scripts/bench-scaleout.sh
	exit 0
fi

for mode in $MODES; do
	start_nats "$mode"
	raw_run "$mode"
	relay_run "$mode" 1
	if ((${RAW_DONE[$mode]} < RAW_RUNS)); then raw_run "$mode"; fi
	relay_run "$mode" 2
	while ((${RAW_DONE[$mode]} < RAW_RUNS)); do raw_run "$mode"; done
	e2e_run "$mode"
	stop_nats "$mode"
done

# --- report ---------------------------------------------------------------------
mode_name() { if [[ $1 == always ]]; then echo "sync always"; else echo "defaults"; fi; }

{
	echo "Quill bench-relay — $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	host_line
	pg_line synchronous_commit fsync shared_buffers autovacuum
	echo "nats-server $NATS_SERVER_VERSION (built from go.mod) on a free loopback port, fresh file store; 'sync always' = jetstream { sync_interval: always }"
	echo "stream as the relay provisions it: file storage, Duplicates 10m, MaxAge 168h, subjects $PREFIX.>; deleted before every run"
	echo "relay: its fixed batch of $RELAY_BATCH events, so up to $((2 * RELAY_BATCH)) pending acks; raw: the same message ids, headers, sizes and pending bound"
	echo "backlog: $(jget "$SEED" events) pending events over $NOTES notes, payload avg $(jget "$SEED" payload_avg_bytes) B (the API's CloudEvents JSON of a note), random note order; VACUUM ANALYZE + CHECKPOINT before each run"
	echo "relays, nats-server, PostgreSQL, API and clients share the $NCPU CPUs (GOMAXPROCS unset); before the start, $BG_START cores were busy with other work$QUIET_NOTE"
	echo
	echo "Publish throughput, events/s from the first to the last message stored (the stream's own timestamps):"
	printf '%-11s | %9s | %-26s | %9s | %5s | %10s | %5s | %7s\n' "NATS" "raw /s" "raw runs /s" "1 relay/s" ratio "2 relays/s" ratio "2 vs 1"
	printf '%s\n' "------------+-----------+----------------------------+-----------+-------+------------+-------+--------"
	for mode in $MODES; do
		raw=$(median "${RAW_RATES[$mode]}")
		r1=${RELAY_RATE[$mode-relays1]} r2=${RELAY_RATE[$mode-relays2]}
		runs=$(for v in ${RAW_RATES[$mode]}; do int "$v"; done | paste -sd' ')
		printf '%-11s | %9s | %-26s | %9s | %5s | %10s | %5s | %6s\n' "$(mode_name "$mode")" "$(int "$raw")" "$runs" \
			"$(int "$r1")" "$(ratio "$r1" "$raw")" "$(int "$r2")" "$(ratio "$r2" "$raw")" "$(ratio "$r2" "$r1")x"
	done
	echo
	echo "raw /s = median of the raw runs; ratio = relay ÷ raw; 2 vs 1 = 2 relays ÷ 1 relay."
	echo
	echo "End to end at $RATE creates/s (API + 1 relay; ${E2E_WARMUP}s warmup, ${E2E_DURATION}s measured), commit → stored in ms,"
	echo "bracketed: 'BEGIN→' counts from before the transaction (≥ the truth), 'answer→' from the API's answer (≤ the truth):"
	printf '%-11s | %9s | %10s | %6s | %10s | %7s | %7s | %11s | %7s | %10s\n' "NATS" creates/s "create p99" events "BEGIN→ p50" p99 max "answer→ p50" p99 "marked p99"
	printf '%s\n' "------------+-----------+------------+--------+------------+---------+---------+-------------+---------+-----------"
	for mode in $MODES; do
		j=${E2E[$mode]} st=$(jobj "${E2E[$mode]}" store) an=$(jobj "${E2E[$mode]}" answered) mk=$(jobj "${E2E[$mode]}" mark)
		printf '%-11s | %9s | %10s | %6s | %10s | %7s | %7s | %11s | %7s | %10s\n' "$(mode_name "$mode")" \
			"$(jget "${LG[$mode]}" ops_per_sec)" "$(jget "${LG[$mode]}" p99_ms)" "$(jget "$j" events)" \
			"$(jget "$st" p50_ms)" "$(jget "$st" p99_ms)" "$(jget "$st" max_ms)" "$(jget "$an" p50_ms)" "$(jget "$an" p99_ms)" "$(jget "$mk" p99_ms)"
	done
	echo
	echo "Per event, by event id: stored = the message's store timestamp in the stream (JetStream acknowledges right"
	echo "after storing; after the fsync with sync always). BEGIN→ = stored − the event's CloudEvents time (= created_at),"
	echo "the API's clock when it planned the transaction, before BEGIN: commit → stored plus the transaction itself."
	echo "answer→ = stored − the time the API logged its 201 (after the commit): commit → stored minus the answer's delay."
	echo "marked = published_at − created_at: now() of the relay's mark, after the whole batch's acks (≥ commit → ack)."
	echo
	echo "Targets:"
	for mode in $MODES; do
		raw=$(median "${RAW_RATES[$mode]}")
		r1=$(ratio "${RELAY_RATE[$mode-relays1]}" "$raw") r2=$(ratio "${RELAY_RATE[$mode-relays2]}" "$raw")
		if [[ $mode == default ]]; then
			check ge "$r1" 0.35
			printf '  %-11s 1 relay ≥ 0.35 × raw: %s (%s)\n' "$(mode_name "$mode"):" "$r1" "$VERDICT"
			check gt "${RELAY_RATE[$mode-relays2]}" "${RELAY_RATE[$mode-relays1]}"
			printf '  %-11s 2 relays > 1 relay: %s × raw vs %s (%s)\n' "$(mode_name "$mode"):" "$r2" "$r1" "$VERDICT"
		else
			check ge "$r1" 0.8
			printf '  %-11s 1 relay ≥ 0.8 × raw: %s (%s)\n' "$(mode_name "$mode"):" "$r1" "$VERDICT"
			check ge "$r2" 0.8
			printf '  %-11s 2 relays ≥ 0.8 × raw: %s (%s)\n' "$(mode_name "$mode"):" "$r2" "$VERDICT"
		fi
		hi=$(jget "$(jobj "${E2E[$mode]}" store)" p99_ms) lo=$(jget "$(jobj "${E2E[$mode]}" answered)" p99_ms)
		check lt "$hi" 50
		if [[ $VERDICT == MISSED ]] && lt "${lo:-0}" 50; then VERDICT="MISSED: not shown — only the lower bound is under 50 ms"; fi
		printf '  %-11s commit → ack p99 < 50 ms: between %s and %s ms (%s)\n' "$(mode_name "$mode"):" "${lo:-?}" "$hi" "$VERDICT"
	done
	echo
	echo "Checks and details:"
	for mode in $MODES; do
		for n in 1 2; do
			l="$mode-relays$n"
			read -r pub dup err <<<"${RELAY_METRICS[$l]}"
			read -r ur un up <<<"${RELAY_CPU_US[$l]}"
			printf '  %-11s %d relay(s): stream holds %s messages; relays published %s (duplicates %s, errors %s); all marked after %ss; CPU µs/event: relay %s, nats %s, postgres %s\n' \
				"$(mode_name "$mode"):" "$n" "${RELAY_MSGS[$l]}" "$pub" "$dup" "$err" "${RELAY_MARKED[$l]}" "$ur" "$un" "$up"
		done
		printf '  %-11s raw: client-side rates (first publish → last ack) %s /s; errors %s\n' "$(mode_name "$mode"):" \
			"$(for v in ${RAW_CLIENT[$mode]}; do int "$v"; done | paste -sd' ')" "${RAW_ERR[$mode]}"
		j=${E2E[$mode]}
		read -r pub dup err <<<"${RELAY_METRICS[$mode-e2e]}"
		printf '  %-11s end to end: loadgen %s ok, %s errors, create p50 %s ms, latest start %s ms late; events unpublished %s, missing from the stream %s, CloudEvents time ≠ created_at %s; → stored p90 %s, p99.9 %s ms; relay duplicates %s, errors %s\n' \
			"$(mode_name "$mode"):" "$(jget "${LG[$mode]}" ok)" "$(jget "${LG[$mode]}" errors)" "$(jget "${LG[$mode]}" p50_ms)" \
			"$(jget "${LG[$mode]}" max_send_lag_ms)" "$(jget "$j" unpublished)" "$(jget "$j" not_in_stream)" "$(jget "$j" ce_time_ne_created_at)" \
			"$(jget "$(jobj "$j" store)" p90_ms)" "$(jget "$(jobj "$j" store)" p999_ms)" "$dup" "$err"
	done
	echo
	echo "CPU, cores used inside each measured window (of $NCPU): client = relaybench raw (its own account) or loadgen;"
	echo "postgres = $BENCH_DB's backends + PostgreSQL's background processes (autovacuum too); other = busy − the rest"
	echo "(kernel loopback networking and interrupts, anything else running on the machine)"
	cpu_table 16 client api relay nats postgres other busy
	warn_lost_events
	for mode in $MODES; do
		if ((${RAW_ERR[$mode]} > 0)); then
			echo "  WARNING: $(mode_name "$mode"): ${RAW_ERR[$mode]} raw publishes failed or were not acknowledged within 10 s (see relaybench's first_error) — a stalled disk?"
		fi
	done
	cpu_warn_busy
} >"$WORK/report.txt"

publish_report "$RESULTS"
