#!/usr/bin/env bash
# bench-api.sh: `make bench-api` — load benchmark of the API's note create
# and update against the raw PostgreSQL ceiling of the same writes (see
# bench/README.md).
#
#   1. builds ./bin (api, loadgen), drops and recreates the database
#      quill_bench on the server of $DATABASE_URL (`api migrate`);
#   2. starts two `api serve` on free loopback ports (GOMAXPROCS unset), one
#      as by default and one with QUILL_WRITE_GROUP=false (a round trip per
#      create, decision 0103), creates a token for tenant bench, and warms
#      both (a short create run each, not measured);
#   3. for each concurrency: loadgen create (unique keys), the API's RSS,
#      loadgen replay (the same requests again); the same creates on the
#      API without the group, on emptied tables, before or after them in
#      turn (so that neither always runs first); then on emptied tables
#      loadgen update (one note per client, each client updating its own
#      under If-Match, unique keys);
#   4. pgbench on copies of the three tables, two forms of the same inserts:
#      one_by_one.sql (BEGIN, 3 INSERTs, COMMIT) and one_round_trip.sql (one
#      CTE statement), at the same concurrencies; and api_equivalent.sql,
#      every statement the API sends for a create, in its round trip; and
#      api_update_equivalent.sql, every statement of an update in its two
#      round trips, on one seeded note per client (api_update_seed.sql);
#   5. prints the table, target verdicts and CPU use per phase (sampled
#      inside each measured window from /proc), and writes
#      them to bench/results/api-latest.txt. The API is stopped on exit.
#
# Settings (environment): DATABASE_URL (only its server and credentials are
# used), BENCH_PROFILE=DIR (the API runs with QUILL_PPROF=true; a CPU profile
# of the create window at BENCH_PROFILE_CLIENTS (16) clients and a heap
# profile after it go to DIR), BENCH_CONCURRENCY ("1 16 64"), BENCH_DURATION (10, seconds),
# BENCH_WARMUP (2, seconds), BENCH_PGBENCH_MODE (prepared), BENCH_STRICT=1 to
# exit 1 when a target is missed, BENCH_WAIT_QUIET (0, seconds to wait for
# an otherwise idle machine), DATABASE_URL (its pool_max_conns sizes the API's pool; default 16),
# BENCH_API_GOGC (the API's GOGC; unset: Go's default, 100).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

CONCURRENCY=${BENCH_CONCURRENCY:-1 16 64}
DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-2}
PGBENCH_MODE=${BENCH_PGBENCH_MODE:-prepared}
RESULTS=bench/results/api-latest.txt
SQL_DIR=bench/pgbench

PROFILE=${BENCH_PROFILE:-}
PROFILE_CLIENTS=${BENCH_PROFILE_CLIENTS:-16}
posint BENCH_DURATION "$DURATION"
seconds BENCH_WARMUP "$WARMUP"
case $PGBENCH_MODE in simple | extended | prepared) ;; *) die "BENCH_PGBENCH_MODE must be simple, extended or prepared" ;; esac
for c in $CONCURRENCY; do posint "BENCH_CONCURRENCY's '$c'" "$c"; done

bench_db quill_bench
PGBENCH=$(pg_tool pgbench) || die "pgbench not found (PATH or /usr/lib/postgresql/*/bin); on Debian it comes with the postgresql-NN package"

work_dir quill-bench
build_bins ./cmd/api ./tools/loadgen
recreate_bench_db
psql_bench -f "$SQL_DIR/setup.sql"

# sample_window PHASE: waits a moment into the measured window, samples CPU
# use over most of it (ending well before the client does), and appends
# "phase client api pg other busy" (cores) to $WORK/cpu.
sample_window() {
	local delay window
	read -r delay window < <(awk -v d="$DURATION" 'BEGIN { s = (d >= 4 ? 1 : d / 4); print s, d - 2.5 * s }')
	sleep "$delay"
	cpu_window_start
	sleep "$window"
	cpu_window_end "$1" "client api pg"
}

# One tenant sends every request: its concurrency limit (default 32) would
# answer the 64 clients' excess with 429 and measure admission, not the
# write path. QUILL_TENANT_CONCURRENCY overrides it.
export QUILL_TENANT_CONCURRENCY=${QUILL_TENANT_CONCURRENCY:-256}
wait_quiet_start
if [[ -n $PROFILE ]]; then
	mkdir -p "$PROFILE"
	PROFILE=$(cd "$PROFILE" && pwd)
	command -v curl >/dev/null 2>&1 || die "BENCH_PROFILE needs curl"
	export QUILL_PPROF=true
fi
# Two APIs side by side, one loaded at a time: the default (its creates
# several to a pipelined write by a db.Group, QUILL_WRITE_GROUP, decision
# 0103) and one sending each create's transaction in a round trip of its
# own. Their create runs alternate which goes first, on the same database,
# so that neither is always the colder.
QUILL_WRITE_GROUP=false start_api bench api-nogroup
NOGROUP_PID=$API_PID NOGROUP_URL=$API_URL NOGROUP_TOKEN=$TOKEN
start_api bench
GROUP_PID=$API_PID GROUP_URL=$API_URL GROUP_TOKEN=$TOKEN
# use_api group|nogroup: the API the next loadgen runs against, the one
# whose CPU is sampled as the api role.
use_api() {
	unset "ROLE[$GROUP_PID]" "ROLE[$NOGROUP_PID]"
	case $1 in
	group) API_PID=$GROUP_PID API_URL=$GROUP_URL TOKEN=$GROUP_TOKEN ;;
	nogroup) API_PID=$NOGROUP_PID API_URL=$NOGROUP_URL TOKEN=$NOGROUP_TOKEN ;;
	esac
	ROLE[$API_PID]=api
}
use_api group

# status_kib PID FIELD: a /proc/PID/status field in kB.
status_kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

fresh_api_tables() {
	psql_bench -c 'TRUNCATE notes, attachments, operations, outbox_events, outbox_pending RESTART IDENTITY' -c CHECKPOINT
}

# LGJ[MODE-cC]: loadgen's JSON result for MODE (create, replay, update) at C
# clients.
declare -A LGJ RSS HWM
# lg MODE C FIELD: a field of that result.
lg() { jget "${LGJ[$1-c$2]}" "$3"; }

# loadgen MODE CONCURRENCY [LABEL]: runs one loadgen, samples CPU inside
# its measured window, and keeps its result in LGJ under LABEL (default
# MODE).
loadgen() {
	local phase="${3:-$1}-c$2" pid
	./bin/loadgen --url "$API_URL" --token "$TOKEN" --mode "$1" --concurrency "$2" \
		--duration "${DURATION}s" --warmup "${WARMUP}s" --json >"$WORK/$phase.json" 2>"$WORK/$phase.err" &
	pid=$!
	ROLE[$pid]=client
	while kill -0 "$pid" 2>/dev/null && ! grep -qs 'measuring' "$WORK/$phase.err"; do
		sleep 0.05
	done
	local prof=""
	if [[ -n $PROFILE && $1 == create && $2 == "$PROFILE_CLIENTS" ]]; then
		# The profile covers the measured window but its last second, as
		# the CPU sample does.
		curl -sf -o "$PROFILE/cpu-create-c$2.pb.gz" \
			"http://$(log_addr "$WORK/api.log" admin)/debug/pprof/profile?seconds=$((DURATION > 2 ? DURATION - 1 : 1))" &
		prof=$!
	fi
	if kill -0 "$pid" 2>/dev/null; then
		sample_window "$phase"
	fi
	wait "$pid" || die "loadgen $phase failed: $(tail -3 "$WORK/$phase.err")"
	if [[ -n $prof ]]; then
		wait "$prof" || die "the CPU profile could not be fetched from the API's admin address"
		curl -sf -o "$PROFILE/allocs-create-c$2.pb.gz" "http://$(log_addr "$WORK/api.log" admin)/debug/pprof/allocs" ||
			die "the allocation profile could not be fetched"
		log "profiles of create at $2 clients in $PROFILE (go tool pprof -top bin/api $PROFILE/cpu-create-c$2.pb.gz)"
	fi
	unset "ROLE[$pid]"
	LGJ[$phase]=$(<"$WORK/$phase.json")
	echo "${LGJ[$phase]}" >>"$WORK/loadgen.jsonl"
}

# warm: a short create run on each API, not measured: the first run on
# a new database and a new process is the coldest.
for api in nogroup group; do
	fresh_api_tables
	log "warming the API ($api): creates, 4 clients, $((WARMUP + 1))s"
	use_api "$api"
	./bin/loadgen --url "$API_URL" --token "$TOKEN" --mode create --concurrency 4 \
		--duration 1s --warmup "${WARMUP}s" --json >/dev/null 2>"$WORK/warm-$api.err" ||
		die "warming the API ($api) failed: $(tail -3 "$WORK/warm-$api.err")"
done

# group_creates C: the default API's creates at C clients and their replays.
group_creates() {
	use_api group
	fresh_api_tables
	log "API create, $1 clients (${WARMUP}s warmup + ${DURATION}s)"
	loadgen create "$1"
	RSS[$1]=$(status_kib "$API_PID" VmRSS)
	HWM[$1]=$(status_kib "$API_PID" VmHWM)
	log "API replay, $1 clients"
	loadgen replay "$1"
}

# nogroup_creates C: the same creates on the API without the write group.
nogroup_creates() {
	use_api nogroup
	fresh_api_tables
	log "API create without the write group, $1 clients (${WARMUP}s warmup + ${DURATION}s)"
	loadgen create "$1" create_nogroup
}

turn=0
for c in $CONCURRENCY; do
	if ((turn++ % 2 == 0)); then
		nogroup_creates "$c"
		group_creates "$c"
	else
		group_creates "$c"
		nogroup_creates "$c"
	fi
	# From emptied tables, as pgbench's update runs start.
	use_api group
	fresh_api_tables
	log "API update, $c clients, one note each (${WARMUP}s warmup + ${DURATION}s)"
	loadgen update "$c"
done
kill "$NOGROUP_PID" 2>/dev/null
wait "$NOGROUP_PID" 2>/dev/null
unset "ROLE[$NOGROUP_PID]"

# --- pgbench --------------------------------------------------------------------
# PG_TPS, PG_LAT, PG_FAIL[SCRIPT-cC]: a pgbench run's tx/s, average latency
# (ms) and failed transactions.
declare -A PG_TPS PG_LAT PG_FAIL
# pgbench_run SCRIPT CONCURRENCY: one pgbench run on emptied tables (for
# api_update_equivalent, seeded with one note per client), CPU sampled
# inside it.
pgbench_run() {
	local phase="$1-c$2" out="$WORK/pgbench-$1-c$2.txt" pid tps
	psql_bench -f "$SQL_DIR/truncate.sql"
	if [[ $1 == api_update_equivalent ]]; then
		psql_bench -v clients="$2" -f "$SQL_DIR/api_update_seed.sql"
	fi
	psql_bench -c CHECKPOINT
	"$PGBENCH" -n -f "$SQL_DIR/$1.sql" -c "$2" -j "$2" -T "$DURATION" -M "$PGBENCH_MODE" "$BENCH_URL" >"$out" 2>&1 &
	pid=$!
	ROLE[$pid]=client
	sample_window "$phase"
	wait "$pid" || die "pgbench $1 -c $2 failed: $(tail -5 "$out")"
	unset "ROLE[$pid]"
	tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$out" | tail -1)
	[[ -n $tps ]] || die "no tps in pgbench output ($out)"
	PG_TPS[$phase]=$(awk -v t="$tps" 'BEGIN { printf "%.1f", t }')
	PG_LAT[$phase]=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$out" | tail -1)
	PG_FAIL[$phase]=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$out" | tail -1)
	PG_FAIL[$phase]=${PG_FAIL[$phase]:-0}
}
for c in $CONCURRENCY; do
	log "pgbench one_by_one, $c clients (${DURATION}s, -M $PGBENCH_MODE)"
	pgbench_run one_by_one "$c"
	log "pgbench one_round_trip, $c clients"
	pgbench_run one_round_trip "$c"
	if [[ $PGBENCH_MODE != simple ]]; then # pipelines need the extended protocol
		log "pgbench api_equivalent, $c clients"
		pgbench_run api_equivalent "$c"
		log "pgbench api_update_equivalent, $c clients"
		pgbench_run api_update_equivalent "$c"
	fi
done

# --- the handler against its floor (issue 29) -----------------------------------
# BenchmarkCreateHandler (a create through the whole handler, no network) and
# BenchmarkCreateFloor (exactly the statements a create sends, recorded from
# that handler, through pgx alone), interleaved one run each per round, so
# that a change in the machine's load falls on both; the ratio of their
# medians' CPU per create is the issue's figure. The raw lines go to
# bench/results/api-floor-latest.txt for benchstat.
FLOOR_ROUNDS=${BENCH_FLOOR_ROUNDS:-5}
posint BENCH_FLOOR_ROUNDS "$FLOOR_ROUNDS"
log "handler vs floor: $FLOOR_ROUNDS interleaved rounds of BenchmarkCreateHandler and BenchmarkCreateFloor"
"$GO" test -c -o "$WORK/httpapi.test" ./internal/httpapi || die "go test -c ./internal/httpapi failed"
: >"$WORK/floor.txt"
for ((i = 1; i <= FLOOR_ROUNDS; i++)); do
	for b in Handler Floor; do
		(cd internal/httpapi && "$WORK/httpapi.test" -test.run '^$' -test.bench "^BenchmarkCreate$b\$" -test.benchtime 3000x -test.count 1) \
			>>"$WORK/floor.txt" 2>&1 || die "BenchmarkCreate$b failed: $(tail -3 "$WORK/floor.txt")"
	done
done
cp "$WORK/floor.txt" bench/results/api-floor-latest.txt
# floor_median NAME UNIT: the median of NAME's UNIT column over the rounds.
floor_median() {
	awk -v n="BenchmarkCreate$1-" -v u="$2" 'index($1, n) == 1 { for (i = 2; i < NF; i++) if ($(i + 1) == u) print $i }' "$WORK/floor.txt" |
		sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
H_CPU=$(floor_median Handler cpu-µs/op)
F_CPU=$(floor_median Floor cpu-µs/op)
H_ALLOCS=$(floor_median Handler allocs/op)
F_ALLOCS=$(floor_median Floor allocs/op)

# --- report ---------------------------------------------------------------------
creates() { lg create "$1" ops_per_sec; }
replays() { lg replay "$1" ops_per_sec; }
updates() { lg update "$1" ops_per_sec; }
# update_kinds C: " (KIND=N,...)", the update run's error kinds, or nothing
# (jget would stop at the first comma).
update_kinds() { sed -n 's/.*"error_kinds":"\([^"][^"]*\)".*/ (\1)/p' <<<"${LGJ[update-c$1]}"; }
# per_op PHASE COLUMN OPS: µs of COLUMN's cores (2 client, 3 api, 4
# postgres) in PHASE's CPU window per operation at OPS/s ("-" without).
per_op() { awk -v p="$1" -v k="$2" -v r="$3" '$1 == p && r > 0 && $k != "-" { printf "%.0f", $k / r * 1e6; f = 1 } END { if (!f) print "-" }' "$WORK/cpu"; }
{
	echo "Quill bench-api — $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	host_line
	pg_line synchronous_commit fsync wal_sync_method shared_buffers max_connections commit_delay
	echo "API: GOMAXPROCS unset, GOGC ${BENCH_API_GOGC:-unset (100)}, pool 16 unless DATABASE_URL names pool_max_conns, QUILL_TENANT_CONCURRENCY=$QUILL_TENANT_CONCURRENCY (one tenant), log level ${QUILL_LOG_LEVEL:-info}; loadgen: ${WARMUP}s warmup + ${DURATION}s per run, one keep-alive connection per client"
	echo "pgbench: -n -c C -j C -T $DURATION -M $PGBENCH_MODE (the API's pgx default also runs cached prepared statements; simple and extended re-parse every statement); tables truncated and CHECKPOINT before every run, API's and pgbench's alike"
	echo "loadgen, API and PostgreSQL share the $NCPU CPUs; before the start, $BG cores were busy with other work"
	echo
	printf '%-7s | %9s | %7s | %7s | %-15s | %11s | %5s | %10s | %5s | %9s | %7s\n' \
		clients creates/s "p50 ms" "p99 ms" "RSS/HWM MiB" "1-by-1 tx/s" ratio "1-RT tx/s" ratio replays/s "rep/cre"
	printf '%s\n' "--------+-----------+---------+---------+-----------------+-------------+-------+------------+-------+-----------+--------"
	for c in $CONCURRENCY; do
		printf '%-7s | %9s | %7s | %7s | %-15s | %11s | %5s | %10s | %5s | %9s | %7s\n' \
			"$c" "$(creates "$c")" "$(lg create "$c" p50_ms)" "$(lg create "$c" p99_ms)" "$(mib "${RSS[$c]}")/$(mib "${HWM[$c]}")" \
			"${PG_TPS[one_by_one-c$c]}" "$(ratio "$(creates "$c")" "${PG_TPS[one_by_one-c$c]}")" \
			"${PG_TPS[one_round_trip-c$c]}" "$(ratio "$(creates "$c")" "${PG_TPS[one_round_trip-c$c]}")" \
			"$(replays "$c")" "$(ratio "$(replays "$c")" "$(creates "$c")")"
	done
	echo
	echo "ratio = API creates/s ÷ pgbench tx/s of the same writes at the same concurrency; rep/cre = replays/s ÷ creates/s."
	echo
	echo "Creates with the write group (the table above, the default) and without it (QUILL_WRITE_GROUP=false, a round trip per create; decision 0103), two APIs side by side whose runs alternate which goes first:"
	for c in $CONCURRENCY; do
		printf '  %2s clients: grouped %s creates/s, p99 %s ms, API %s µs/create; one by one %s creates/s, p99 %s ms, API %s µs/create; grouped ÷ one by one %s\n' "$c" \
			"$(creates "$c")" "$(lg create "$c" p99_ms)" "$(per_op "create-c$c" 3 "$(creates "$c")")" \
			"$(lg create_nogroup "$c" ops_per_sec)" "$(lg create_nogroup "$c" p99_ms)" "$(per_op "create_nogroup-c$c" 3 "$(lg create_nogroup "$c" ops_per_sec)")" \
			"$(ratio "$(creates "$c")" "$(lg create_nogroup "$c" ops_per_sec)")"
	done
	echo
	if [[ $PGBENCH_MODE != simple ]]; then
		echo "The API's own statements without the API (api_equivalent.sql: BEGIN, the lock_timeout, one statement that claims"
		echo "(advisory lock, record read) and inserts note, event and record, COMMIT — one round trip, pipelined as pgx sends it;"
		echo "the token is cached, NOTIFY follows the commit):"
		for c in $CONCURRENCY; do
			printf '  %2s clients: %8s tx/s, latency avg %s ms; API creates/s ÷ this = %s\n' \
				"$c" "${PG_TPS[api_equivalent-c$c]}" "${PG_LAT[api_equivalent-c$c]}" "$(ratio "$(creates "$c")" "${PG_TPS[api_equivalent-c$c]}")"
		done
		echo
	fi
	echo "Updates (PATCH /v1/notes/{id} under If-Match, a new key each; one note per client, created before the window,"
	echo "each client updating its own and following the ETag, so no update waits for another's row lock):"
	# (printf pads bytes: a header with µ, two bytes, gets one more.)
	printf '  %-7s | %9s | %7s | %7s | %4s | %6s | %11s | %5s | %11s | %10s | %17s\n' \
		clients updates/s "p50 ms" "p99 ms" 412s errors "api-eq tx/s" ratio "API µs/upd" "PG µs/upd" "pgbench PG µs/tx"
	printf '  %s\n' "--------+-----------+---------+---------+------+--------+-------------+-------+------------+-----------+-----------------"
	for c in $CONCURRENCY; do
		printf '  %-7s | %9s | %7s | %7s | %4s | %6s | %11s | %5s | %10s | %9s | %16s\n' \
			"$c" "$(updates "$c")" "$(lg update "$c" p50_ms)" "$(lg update "$c" p99_ms)" \
			"$(lg update "$c" precondition_failed)" "$(lg update "$c" errors)" \
			"${PG_TPS[api_update_equivalent-c$c]:--}" "$(ratio "$(updates "$c")" "${PG_TPS[api_update_equivalent-c$c]:-0}")" \
			"$(per_op "update-c$c" 3 "$(updates "$c")")" "$(per_op "update-c$c" 4 "$(updates "$c")")" \
			"$(per_op "api_update_equivalent-c$c" 4 "${PG_TPS[api_update_equivalent-c$c]:-0}")"
	done
	echo "  api-eq = api_update_equivalent.sql: BEGIN + lock_timeout + the lock read (note and attachment, FOR UPDATE OF n);"
	echo "  the claim with the record's and the note.updated event's inserts, the guarded UPDATE, COMMIT — the API's two"
	echo "  round trips, on pgbench -M $PGBENCH_MODE (n/a with simple: pipelines); ratio = API updates/s ÷ api-eq tx/s;"
	echo "  µs/upd = cores in the window ÷ updates/s (API: the API process; PG: PostgreSQL, in the API's run and in pgbench's)."
	echo
	echo "Targets:"
	for c in $CONCURRENCY; do
		case $c in
		1) want=0.85 ;;
		16) want=0.7 ;;
		*) want="" ;;
		esac
		r=$(ratio "$(creates "$c")" "${PG_TPS[one_by_one-c$c]}")
		if [[ -n $want ]]; then
			check ge "$r" "$want"
			printf '  %2s clients: creates/s ≥ %s × one-by-one ceiling: %s (%s)\n' "$c" "$want" "$r" "$VERDICT"
		fi
		check lt "$(lg create "$c" p99_ms)" 50
		printf '  %2s clients: create p99 < 50 ms: %s ms (%s)\n' "$c" "$(lg create "$c" p99_ms)" "$VERDICT"
		r=$(ratio "$(replays "$c")" "$(creates "$c")")
		check ge "$r" 2
		printf '  %2s clients: replays/s ≥ 2 × creates/s: %s (%s)\n' "$c" "$r" "$VERDICT"
		# Each client updates only its own note, following the ETag the
		# API answered: a 412 would be the API refusing an update made
		# against the version it had just answered.
		check ge 0 "$(lg update "$c" precondition_failed)"
		printf '  %2s clients: update 412s = 0 (each client owns its note): %s (%s)\n' "$c" "$(lg update "$c" precondition_failed)" "$VERDICT"
	done
	echo
	echo "Errors (non-2xx, transport, wrong replay flag; an update's non-200 or ETag not the next version) and latency details:"
	for c in $CONCURRENCY; do
		printf '  %2s clients: create errors %s; replay errors %s, replay p99 %s ms; update errors %s%s; pgbench failed tx (1-by-1/1-RT/api-eq/api-upd-eq) %s/%s/%s/%s; pgbench latency avg (1-by-1/1-RT/api-upd-eq) %s/%s/%s ms\n' \
			"$c" "$(lg create "$c" errors)" "$(lg replay "$c" errors)" "$(lg replay "$c" p99_ms)" \
			"$(lg update "$c" errors)" "$(update_kinds "$c")" \
			"${PG_FAIL[one_by_one-c$c]}" "${PG_FAIL[one_round_trip-c$c]}" "${PG_FAIL[api_equivalent-c$c]:--}" "${PG_FAIL[api_update_equivalent-c$c]:--}" \
			"${PG_LAT[one_by_one-c$c]}" "${PG_LAT[one_round_trip-c$c]}" "${PG_LAT[api_update_equivalent-c$c]:--}"
	done
	echo
	echo "CPU, cores used inside each measured window (of $NCPU): client = loadgen or pgbench;"
	echo "postgres = $BENCH_DB's backends + PostgreSQL's background processes; other = busy − the rest"
	echo "(kernel loopback networking and interrupts, anything else running on the machine)"
	cpu_table 25 client api postgres other busy
	cpu_warn_busy
	echo "  the API's CPU per operation (its cores in the window ÷ operations/s):"
	for c in $CONCURRENCY; do
		printf '    %2s clients: create %s µs, replay %s µs, update %s µs\n' "$c" \
			"$(per_op "create-c$c" 3 "$(creates "$c")")" "$(per_op "replay-c$c" 3 "$(replays "$c")")" "$(per_op "update-c$c" 3 "$(updates "$c")")"
	done
	echo "  loadgen's own account (getrusage-like, /proc/self/stat over its whole measured window):"
	for c in $CONCURRENCY; do
		printf '    %2s clients: create %s cores, replay %s cores, update %s cores\n' "$c" "$(lg create "$c" cpu_cores)" "$(lg replay "$c" cpu_cores)" "$(lg update "$c" cpu_cores)"
	done
	echo
	echo "The handler against its floor ($FLOOR_ROUNDS interleaved rounds, 3000 creates each, medians; raw: bench/results/api-floor-latest.txt):"
	r=$(ratio "$H_CPU" "$F_CPU")
	check le "$r" 1.3
	printf '  BenchmarkCreateHandler %s cpu-µs/op, %s allocs/op; BenchmarkCreateFloor (the same statements through pgx alone) %s cpu-µs/op, %s allocs/op\n' "$H_CPU" "$H_ALLOCS" "$F_CPU" "$F_ALLOCS"
	printf '  handler ÷ floor CPU per create ≤ 1.3: %s (%s)\n' "$r" "$VERDICT"
	check lt "$H_ALLOCS" 120
	printf '  handler allocations per create < 120: %s (%s)\n' "$H_ALLOCS" "$VERDICT"
} >"$WORK/report.txt"

publish_report "$RESULTS"
