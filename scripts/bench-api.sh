#!/usr/bin/env bash
# bench-api.sh: `make bench-api` — load benchmark of the API's note create
# against the raw PostgreSQL ceiling of the same writes (see bench/README.md).
#
#   1. builds ./bin (api, loadgen), drops and recreates the database
#      quill_bench on the server of $DATABASE_URL (`api migrate`);
#   2. starts `api serve` on free loopback ports (GOMAXPROCS unset), creates a
#      token for tenant bench;
#   3. for each concurrency: loadgen create (unique keys), the API's RSS,
#      loadgen replay (the same requests again);
#   4. pgbench on copies of the three tables, two forms of the same inserts:
#      one_by_one.sql (BEGIN, 3 INSERTs, COMMIT) and one_round_trip.sql (one
#      CTE statement), at the same concurrencies; and api_equivalent.sql,
#      every statement the API sends for a create, in its round trips;
#   5. prints the table, target verdicts and CPU use per phase (sampled
#      inside each measured window from /proc), and writes
#      them to bench/results/api-latest.txt. The API is stopped on exit.
#
# Settings (environment): DATABASE_URL (only its server and credentials are
# used), BENCH_CONCURRENCY ("1 16 64"), BENCH_DURATION (10, seconds),
# BENCH_WARMUP (2, seconds), BENCH_PGBENCH_MODE (prepared), BENCH_STRICT=1 to
# exit 1 when a target is missed, BENCH_WAIT_QUIET (0, seconds to wait for
# an otherwise idle machine), QUILL_DB_MAX_CONNS (passed to the API).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/quill?sslmode=disable}
CONCURRENCY=${BENCH_CONCURRENCY:-1 16 64}
DURATION=${BENCH_DURATION:-10}
WARMUP=${BENCH_WARMUP:-2}
PGBENCH_MODE=${BENCH_PGBENCH_MODE:-prepared}
STRICT=${BENCH_STRICT:-0}
GO=${GO:-go}
BENCH_DB=quill_bench
RESULTS=bench/results/api-latest.txt
SQL_DIR=bench/pgbench

log() { printf 'bench-api: %s\n' "$*" >&2; }
die() {
	printf 'bench-api: ERROR: %s\n' "$*" >&2
	exit 1
}

[[ $DURATION =~ ^[1-9][0-9]*$ ]] || die "BENCH_DURATION must be whole seconds, got '$DURATION'"
[[ $WARMUP =~ ^[0-9]+$ ]] || die "BENCH_WARMUP must be whole seconds, got '$WARMUP'"
case $PGBENCH_MODE in simple | extended | prepared) ;; *) die "BENCH_PGBENCH_MODE must be simple, extended or prepared" ;; esac
for c in $CONCURRENCY; do [[ $c =~ ^[1-9][0-9]*$ ]] || die "BENCH_CONCURRENCY holds '$c', not a positive integer"; done

# --- PostgreSQL URLs and tools --------------------------------------------------
# with_db URL DB: URL with its database replaced (postgres[ql]:// URLs only).
with_db() {
	local url=$1 db=$2 scheme rest query=""
	[[ $url == postgres://* || $url == postgresql://* ]] ||
		die "DATABASE_URL must be a postgres:// URL (got a keyword/value string?)"
	scheme=${url%%://*}
	rest=${url#*://}
	if [[ $rest == *\?* ]]; then
		query="?${rest#*\?}"
		rest=${rest%%\?*}
	fi
	printf '%s://%s/%s%s' "$scheme" "${rest%%/*}" "$db" "$query"
}
ADMIN_URL=$(with_db "$DATABASE_URL" postgres)
BENCH_URL=$(with_db "$DATABASE_URL" "$BENCH_DB")

# pg_tool NAME: NAME from PATH, else from the newest /usr/lib/postgresql/*/bin.
pg_tool() {
	if command -v "$1" >/dev/null 2>&1; then
		command -v "$1"
		return 0
	fi
	local found
	found=$(printf '%s\n' /usr/lib/postgresql/*/bin/"$1" | sort -V | tail -1)
	[[ -n $found && -x $found ]] || return 1
	echo "$found"
}
PSQL=$(pg_tool psql) || die "psql not found (PATH or /usr/lib/postgresql/*/bin); install the PostgreSQL client"
PGBENCH=$(pg_tool pgbench) || die "pgbench not found (PATH or /usr/lib/postgresql/*/bin); on Debian it comes with the postgresql-NN package"

psql_admin() { PGOPTIONS='-c client_min_messages=warning' "$PSQL" -X -q -v ON_ERROR_STOP=1 "$ADMIN_URL" "$@"; }
psql_bench() { PGOPTIONS='-c client_min_messages=warning' "$PSQL" -X -q -v ON_ERROR_STOP=1 "$BENCH_URL" "$@"; }

# --- work directory and cleanup -------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/quill-bench.XXXXXX")
API_PID=""
OK=false
cleanup() {
	if [[ -n $API_PID ]] && kill -0 "$API_PID" 2>/dev/null; then
		kill -TERM "$API_PID" 2>/dev/null || true
		wait "$API_PID" 2>/dev/null || true
	fi
	if $OK; then
		rm -rf "$WORK"
	else
		log "logs kept in $WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- build, database ------------------------------------------------------------
log "building ./bin"
"$GO" build -o bin/ ./cmd/api ./tools/loadgen

psql_admin -c 'SELECT 1' >/dev/null 2>"$WORK/psql.err" ||
	die "cannot connect to $ADMIN_URL: $(cat "$WORK/psql.err") (is PostgreSQL running? try: bash scripts/ensure-postgres.sh)"
log "recreating database $BENCH_DB"
psql_admin -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)"
DATABASE_URL=$BENCH_URL ./bin/api migrate 2>>"$WORK/api-cli.log" || die "api migrate failed (see $WORK/api-cli.log)"
psql_bench -f "$SQL_DIR/setup.sql"

# --- CPU accounting ---------------------------------------------------------------
# While each load runs, two snapshots inside its measured window give the
# cores used by: the client (loadgen or pgbench), the API, PostgreSQL (the
# backends of $BENCH_DB plus the postmaster and its background processes:
# WAL writer, checkpointer, ...), and the whole machine (/proc/stat). "other"
# is the rest: the kernel's loopback networking and interrupts, and whatever
# else runs on the machine (a noisy neighbour shows up there).
NCPU=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
now_s() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

# cpu_snapshot CLIENT_PID: "pid class ticks" for every process of interest,
# then "sys busy total" (all CPUs, clock ticks).
cpu_snapshot() {
	local client=$1 d pid stat comm cmd class
	local -a f
	for d in /proc/[0-9]*; do
		pid=${d#/proc/}
		read -r stat 2>/dev/null <"$d/stat" || continue # gone meanwhile
		comm=${stat#* (}
		comm=${comm%%) *}
		read -r -a f <<<"${stat##*) }"
		if [[ $pid == "$client" ]]; then
			class=client
		elif [[ $pid == "$API_PID" ]]; then
			class=api
		elif [[ $comm == postgres ]]; then
			# The process title (postgres: ... DB HOST(PORT) state) is the
			# first NUL-terminated string of cmdline.
			cmd=""
			IFS= read -r -d '' cmd 2>/dev/null <"$d/cmdline" || [[ -n $cmd ]] || continue
			if [[ $cmd != *" $BENCH_DB "* && ($cmd == *"("[0-9]*")"* || $cmd == *"[local]"*) ]]; then
				continue # a backend of another database: not ours
			fi
			class=pg
		else
			continue
		fi
		echo "$pid $class $((f[11] + f[12]))"
	done
	awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print "sys", t - $5 - $6, t; exit }' /proc/stat
}

# sample_window PHASE CLIENT_PID: waits a moment into the measured window,
# samples CPU use over most of it (ending well before the client does), and
# appends
# "phase client api postgres other busy" (cores) to $WORK/cpu.
sample_window() {
	local delay window t0 t1
	read -r delay window < <(awk -v d="$DURATION" 'BEGIN { s = (d >= 4 ? 1 : d / 4); print s, d - 2.5 * s }')
	sleep "$delay"
	t0=$(now_s)
	cpu_snapshot "$2" >"$WORK/snap0"
	sleep "$window"
	t1=$(now_s)
	cpu_snapshot "$2" >"$WORK/snap1"
	awk -v phase="$1" -v s="$(elapsed "$t0" "$t1")" -v hz="$CLK_TCK" -v n="$NCPU" '
		FNR == NR { if ($1 == "sys") { b0 = $2; t0 = $3 } else t[$1] = $3; next }
		$1 == "sys" { busy = ($2 - b0) / ($3 - t0) * n; next }
		{ d[$2] += $3 - (($1 in t) ? t[$1] : 0) }
		$2 == "client" { seen = 1 }
		END {
			if (!seen) { printf "%s n/a n/a n/a n/a %.2f\n", phase, busy; exit }
			c = d["client"] / hz / s; a = d["api"] / hz / s; p = d["pg"] / hz / s
			o = busy - c - a - p; if (o < 0) o = 0
			printf "%s %.2f %.2f %.2f %.2f %.2f\n", phase, c, a, p, o, busy
		}' "$WORK/snap0" "$WORK/snap1" >>"$WORK/cpu"
}

# --- a quiet machine? --------------------------------------------------------------
# Every number here is a share of the same few CPUs: anything else running
# (a build, tests) lowers both sides unevenly. Measure the load before
# starting; BENCH_WAIT_QUIET=N waits up to N seconds for it to drop.
sys_busy() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat; }
background_cores() {
	local b0 t0 b1 t1
	read -r b0 t0 < <(sys_busy)
	sleep 2
	read -r b1 t1 < <(sys_busy)
	awk -v b=$((b1 - b0)) -v t=$((t1 - t0)) -v n="$NCPU" 'BEGIN { printf "%.2f", (t > 0 ? b / t * n : 0) }'
}
QUIET_LIMIT=0.25
WAIT_QUIET=${BENCH_WAIT_QUIET:-0}
waited=0
BG=$(background_cores)
while awk -v b="$BG" -v l="$QUIET_LIMIT" 'BEGIN { exit !(b > l) }' && ((waited < WAIT_QUIET)); do
	log "the machine is busy ($BG cores in use); waiting for it to quiet down (${waited}s of ${WAIT_QUIET}s)"
	sleep 3
	waited=$((waited + 5))
	BG=$(background_cores)
done
if awk -v b="$BG" -v l="$QUIET_LIMIT" 'BEGIN { exit !(b > l) }'; then
	log "WARNING: $BG of $NCPU cores were busy before the benchmark started; results will be low and noisy"
fi

# --- API ------------------------------------------------------------------------
log "starting the API (log: $WORK/api.log)"
env -u GOMAXPROCS DATABASE_URL="$BENCH_URL" ./bin/api serve --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
	>"$WORK/api.out" 2>"$WORK/api.log" &
API_PID=$!
API_ADDR=""
for _ in $(seq 1 150); do
	kill -0 "$API_PID" 2>/dev/null || die "the API exited at startup: $(tail -3 "$WORK/api.log")"
	API_ADDR=$(grep -o '"listener":"api","addr":"[^"]*"' "$WORK/api.log" | head -1 | sed 's/.*"addr":"//; s/"$//' || true)
	[[ -n $API_ADDR ]] && break
	sleep 0.1
done
[[ -n $API_ADDR ]] || die "the API did not report its listening address within 15s (see $WORK/api.log)"
API_URL="http://$API_ADDR"
TOKEN=$(DATABASE_URL=$BENCH_URL ./bin/api token create --tenant bench 2>>"$WORK/api-cli.log") ||
	die "api token create failed (see $WORK/api-cli.log)"
log "API pid $API_PID at $API_URL"

# jget JSON FIELD: a scalar field of loadgen's flat JSON object.
jget() { sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$1"; }
# status_kib PID FIELD: a /proc/PID/status field in kB.
status_kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

fresh_api_tables() {
	psql_bench -c 'TRUNCATE notes, attachments, operations, outbox_events, outbox_pending RESTART IDENTITY' -c CHECKPOINT
}

# loadgen MODE CONCURRENCY: runs one loadgen, samples CPU inside its measured
# window, and sets LG (its JSON result).
loadgen() {
	local phase="$1-c$2" pid
	./bin/loadgen --url "$API_URL" --token "$TOKEN" --mode "$1" --concurrency "$2" \
		--duration "${DURATION}s" --warmup "${WARMUP}s" --json >"$WORK/$phase.json" 2>"$WORK/$phase.err" &
	pid=$!
	while kill -0 "$pid" 2>/dev/null && ! grep -qs 'measuring' "$WORK/$phase.err"; do
		sleep 0.05
	done
	if kill -0 "$pid" 2>/dev/null; then
		sample_window "$phase" "$pid"
	fi
	wait "$pid" || die "loadgen $phase failed: $(tail -3 "$WORK/$phase.err")"
	LG=$(<"$WORK/$phase.json")
	echo "$LG" >>"$WORK/loadgen.jsonl"
}

declare -A CREATE_OPS CREATE_P50 CREATE_P99 CREATE_ERR RSS HWM REPLAY_OPS REPLAY_P99 REPLAY_ERR LG_CREATE LG_REPLAY
declare -A OBO_TPS OBO_LAT RT_TPS RT_LAT OBO_FAIL RT_FAIL EQ_TPS EQ_LAT EQ_FAIL
for c in $CONCURRENCY; do
	fresh_api_tables
	log "API create, $c clients (${WARMUP}s warmup + ${DURATION}s)"
	loadgen create "$c"
	CREATE_OPS[$c]=$(jget "$LG" ops_per_sec)
	CREATE_P50[$c]=$(jget "$LG" p50_ms)
	CREATE_P99[$c]=$(jget "$LG" p99_ms)
	CREATE_ERR[$c]=$(jget "$LG" errors)
	LG_CREATE[$c]=$(jget "$LG" cpu_cores)
	RSS[$c]=$(status_kib "$API_PID" VmRSS)
	HWM[$c]=$(status_kib "$API_PID" VmHWM)

	log "API replay, $c clients"
	loadgen replay "$c"
	REPLAY_OPS[$c]=$(jget "$LG" ops_per_sec)
	REPLAY_P99[$c]=$(jget "$LG" p99_ms)
	REPLAY_ERR[$c]=$(jget "$LG" errors)
	LG_REPLAY[$c]=$(jget "$LG" cpu_cores)
done

# --- pgbench --------------------------------------------------------------------
# pgbench_run SCRIPT CONCURRENCY: one pgbench run on emptied tables; sets
# PG_TPS, PG_LAT, PG_FAIL and samples CPU inside the run.
pgbench_run() {
	local script=$1 c=$2 out="$WORK/pgbench-$1-c$2.txt" pid
	psql_bench -f "$SQL_DIR/truncate.sql" -c CHECKPOINT
	"$PGBENCH" -n -f "$SQL_DIR/$script.sql" -c "$c" -j "$c" -T "$DURATION" -M "$PGBENCH_MODE" "$BENCH_URL" >"$out" 2>&1 &
	pid=$!
	sample_window "$script-c$c" "$pid"
	wait "$pid" || die "pgbench $script -c $c failed: $(tail -5 "$out")"
	PG_TPS=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$out" | tail -1)
	PG_LAT=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$out" | tail -1)
	PG_FAIL=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$out" | tail -1)
	[[ -n $PG_TPS ]] || die "no tps in pgbench output ($out)"
	PG_TPS=$(awk -v t="$PG_TPS" 'BEGIN { printf "%.1f", t }')
}
for c in $CONCURRENCY; do
	log "pgbench one_by_one, $c clients (${DURATION}s, -M $PGBENCH_MODE)"
	pgbench_run one_by_one "$c"
	OBO_TPS[$c]=$PG_TPS OBO_LAT[$c]=$PG_LAT OBO_FAIL[$c]=${PG_FAIL:-0}
	log "pgbench one_round_trip, $c clients"
	pgbench_run one_round_trip "$c"
	RT_TPS[$c]=$PG_TPS RT_LAT[$c]=$PG_LAT RT_FAIL[$c]=${PG_FAIL:-0}
	if [[ $PGBENCH_MODE != simple ]]; then # pipelines need the extended protocol
		log "pgbench api_equivalent, $c clients"
		pgbench_run api_equivalent "$c"
		EQ_TPS[$c]=$PG_TPS EQ_LAT[$c]=$PG_LAT EQ_FAIL[$c]=${PG_FAIL:-0}
	fi
done

# --- report ---------------------------------------------------------------------
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

PG_VERSION=$(psql_bench -Atc 'SHOW server_version')
PG_SETTINGS=$(psql_bench -Atc "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings
	WHERE name IN ('synchronous_commit', 'fsync', 'wal_sync_method', 'shared_buffers', 'max_connections', 'commit_delay')")
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[[ -z $(git status --porcelain 2>/dev/null) ]] || REV="$REV (+ uncommitted changes)"

MISSED=0
# check TEST ARGS...: sets VERDICT to met or MISSED (and counts misses).
check() {
	if "$@"; then VERDICT=met; else
		VERDICT=MISSED
		MISSED=$((MISSED + 1))
	fi
}

{
	echo "Quill bench-api — $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "commit $REV; $("$GO" version | cut -d' ' -f3-); $NCPU CPUs ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || echo unknown)), $(($(awk '/^MemTotal/ { print $2 }' /proc/meminfo) / 1024)) MiB"
	echo "PostgreSQL $PG_VERSION at ${BENCH_URL%%\?*} ($PG_SETTINGS)"
	echo "API: GOMAXPROCS unset, pool QUILL_DB_MAX_CONNS=${QUILL_DB_MAX_CONNS:-16 (default)}, log level ${QUILL_LOG_LEVEL:-info}; loadgen: ${WARMUP}s warmup + ${DURATION}s per run, one keep-alive connection per client"
	echo "pgbench: -n -c C -j C -T $DURATION -M $PGBENCH_MODE (the API's pgx default also runs cached prepared statements; simple and extended re-parse every statement); tables truncated and CHECKPOINT before every run, API's and pgbench's alike"
	echo "loadgen, API and PostgreSQL share the $NCPU CPUs; before the start, $BG cores were busy with other work"
	echo
	printf '%-7s | %9s | %7s | %7s | %-15s | %11s | %5s | %10s | %5s | %9s | %7s\n' \
		clients creates/s "p50 ms" "p99 ms" "RSS/HWM MiB" "1-by-1 tx/s" ratio "1-RT tx/s" ratio replays/s "rep/cre"
	printf '%s\n' "--------+-----------+---------+---------+-----------------+-------------+-------+------------+-------+-----------+--------"
	for c in $CONCURRENCY; do
		printf '%-7s | %9s | %7s | %7s | %-15s | %11s | %5s | %10s | %5s | %9s | %7s\n' \
			"$c" "${CREATE_OPS[$c]}" "${CREATE_P50[$c]}" "${CREATE_P99[$c]}" "$(mib "${RSS[$c]}")/$(mib "${HWM[$c]}")" \
			"${OBO_TPS[$c]}" "$(ratio "${CREATE_OPS[$c]}" "${OBO_TPS[$c]}")" \
			"${RT_TPS[$c]}" "$(ratio "${CREATE_OPS[$c]}" "${RT_TPS[$c]}")" \
			"${REPLAY_OPS[$c]}" "$(ratio "${REPLAY_OPS[$c]}" "${CREATE_OPS[$c]}")"
	done
	echo
	echo "ratio = API creates/s ÷ pgbench tx/s of the same writes at the same concurrency; rep/cre = replays/s ÷ creates/s."
	echo
	if [[ $PGBENCH_MODE != simple ]]; then
		echo "The API's own statements without the API (api_equivalent.sql: BEGIN + claim (advisory lock, record read, flag);"
		echo "3 guarded inserts + COMMIT — one round trip, pipelined as pgx sends it; the token is cached, NOTIFY follows the commit):"
		for c in $CONCURRENCY; do
			printf '  %2s clients: %8s tx/s, latency avg %s ms; API creates/s ÷ this = %s\n' \
				"$c" "${EQ_TPS[$c]}" "${EQ_LAT[$c]}" "$(ratio "${CREATE_OPS[$c]}" "${EQ_TPS[$c]}")"
		done
		echo
	fi
	echo "Targets:"
	for c in $CONCURRENCY; do
		case $c in
		1) want=0.85 ;;
		16) want=0.7 ;;
		*) want="" ;;
		esac
		r=$(ratio "${CREATE_OPS[$c]}" "${OBO_TPS[$c]}")
		if [[ -n $want ]]; then
			check ge "$r" "$want"
			printf '  %2s clients: creates/s ≥ %s × one-by-one ceiling: %s (%s)\n' "$c" "$want" "$r" "$VERDICT"
		fi
		check lt "${CREATE_P99[$c]}" 50
		printf '  %2s clients: create p99 < 50 ms: %s ms (%s)\n' "$c" "${CREATE_P99[$c]}" "$VERDICT"
		r=$(ratio "${REPLAY_OPS[$c]}" "${CREATE_OPS[$c]}")
		check ge "$r" 2
		printf '  %2s clients: replays/s ≥ 2 × creates/s: %s (%s)\n' "$c" "$r" "$VERDICT"
	done
	echo
	echo "Errors (non-2xx, transport, wrong replay flag) and latency details:"
	for c in $CONCURRENCY; do
		printf '  %2s clients: create errors %s; replay errors %s, replay p99 %s ms; pgbench failed tx (1-by-1/1-RT/api-eq) %s/%s/%s; pgbench latency avg (1-by-1/1-RT) %s/%s ms\n' \
			"$c" "${CREATE_ERR[$c]}" "${REPLAY_ERR[$c]}" "${REPLAY_P99[$c]}" "${OBO_FAIL[$c]}" "${RT_FAIL[$c]}" "${EQ_FAIL[$c]:--}" "${OBO_LAT[$c]}" "${RT_LAT[$c]}"
	done
	echo
	echo "CPU, cores used inside each measured window (of $NCPU): client = loadgen or pgbench;"
	echo "postgres = $BENCH_DB's backends + PostgreSQL's background processes; other = busy − the rest"
	echo "(kernel loopback networking and interrupts, anything else running on the machine)"
	printf '  %-18s | %6s | %5s | %8s | %5s | %5s\n' phase client api postgres other busy
	while read -r phase client api pg other busy; do
		printf '  %-18s | %6s | %5s | %8s | %5s | %5s\n' "$phase" "$client" "$api" "$pg" "$other" "$busy"
	done <"$WORK/cpu"
	noisy=$(awk '$5 == "n/a" || $5 > 0.35 { printf "%s%s", (n++ ? ", " : ""), $1 }' "$WORK/cpu")
	if [[ -n $noisy ]]; then
		echo "  WARNING: more than 0.35 cores went to other work during: $noisy — a busy machine; compare with care"
	fi
	echo "  loadgen's own account (getrusage-like, /proc/self/stat over its whole measured window):"
	for c in $CONCURRENCY; do
		printf '    %2s clients: create %s cores, replay %s cores\n' "$c" "${LG_CREATE[$c]}" "${LG_REPLAY[$c]}"
	done
} >"$WORK/report.txt"

mkdir -p "$(dirname "$RESULTS")"
cp "$WORK/report.txt" "$RESULTS"
cat "$RESULTS"
echo
log "written to $RESULTS"
OK=true
if [[ $STRICT == 1 ]] && ((MISSED > 0)); then
	exit 1
fi
