#!/usr/bin/env bash
# bench-hostile.sh: `make bench-hostile` — the overload benchmark of issue
# 13: a legitimate agent workload alone, then the same beside slowloris
# connections, bad tokens, a flooding tenant, image bombs, invented HTTP
# methods and one host's idle connections (issue 24), each attacker from a
# loopback address of its own, reported side by side (see bench/README.md).
#
#   1. builds ./bin (api, relay, attachment-worker, hostile) and (once) the
#      nats-server go.mod pins into .data/bin; drops and recreates the
#      database quill_bench_hostile on the server of $DATABASE_URL (`api
#      migrate`);
#   2. starts a nats-server on a free loopback port (fresh store), `api
#      serve`, one relay and one attachment worker (GOMAXPROCS unset), and
#      creates a token for each of the tenants legit, flood and bomber;
#   3. runs tools/hostile: the quiet phase, the hostile phase, the resend
#      of the creates left unanswered, the wait for the legitimate
#      attachments, the check of every legitimate key in PostgreSQL; it
#      reads the API's and the worker's peak RSS (VmHWM) per phase, counts
#      the series of the API's HTTP metrics on its admin /metrics at each
#      measured window's start and end, and probes its admin /healthz;
#   4. notes whether each process survived, stops the survivors (each must
#      exit 0 on SIGTERM), prints the report and writes it to
#      bench/results/hostile-latest.txt. Everything it started is stopped
#      on exit.
#
# Settings (environment), each validated:
#   BENCH_HOSTILE_DURATION (20)          measured seconds of each phase
#   BENCH_HOSTILE_WARMUP (3)             unmeasured seconds before each
#                                        phase's window (the attackers ramp up)
#   BENCH_HOSTILE_CLIENTS (16)           legitimate clients
#   BENCH_HOSTILE_LEGIT_TENANTS (16)     tenants the legitimate clients
#                                        belong to, in turn (1: one tenant,
#                                        "legit"; else legit-1 ... legit-N)
#   BENCH_HOSTILE_ATTACK_CORES (0.5)     CPU cap of the attackers' process,
#                                        cores (0: uncapped; an attacker's
#                                        own machines pay for its requests,
#                                        see bench/README.md)
#   BENCH_HOSTILE_THINK_MS (0)           each legitimate client's pause after
#                                        an answer (an agent's think time; 0:
#                                        back to back, saturating the machine)
#   BENCH_HOSTILE_RESEND_PERCENT (20)    legitimate operations that resend
#   BENCH_HOSTILE_ATTACH_PERCENT (50)    legitimate creates with a 64 KiB PNG
#   BENCH_HOSTILE_SLOWLORIS (200)        slowloris connections (0: none)
#   BENCH_HOSTILE_BAD_TOKEN_RATE (500)   bad-token requests per second (0: none)
#   BENCH_HOSTILE_FLOOD_FACTOR (10)      the flood's concurrency as a multiple
#                                        of QUILL_TENANT_CONCURRENCY (0: none)
#   BENCH_HOSTILE_FLOOD_PAUSE_MS (20)    a flooding client's wait after a
#                                        non-2xx (it ignores Retry-After)
#   BENCH_HOSTILE_BOMB_RATE (1)          image bombs per second, a decimal
#                                        such as 0.5 (0: none)
#   BENCH_HOSTILE_INVENTED_METHOD_RATE (200) requests per second with a
#                                        fresh invented method, no token
#                                        (0: none)
#   BENCH_HOSTILE_IDLE_CONNS (1100)      idle connections one host holds to
#                                        the API and to its admin server,
#                                        each (0: none)
#   BENCH_HOSTILE_TIMEOUT (10)           per-request timeout, seconds
#   BENCH_HOSTILE_RECOVER (30)           seconds to resend unanswered creates
#   BENCH_HOSTILE_DRAIN (30)             seconds to wait for the legitimate
#                                        attachments after the phases
#   QUILL_TENANT_RATE (100)              passed to the API: each tenant's
#                                        requests/s (0: no rate limit)
#   QUILL_TENANT_CONCURRENCY (32)        passed to the API; the flood is this ×
#                                        the factor
#   QUILL_WORKER_DECODE_MEMORY (268435456) passed to the worker; its RSS
#                                        target is this + 128 MiB
# and DATABASE_URL (only its server and credentials are used),
# BENCH_STRICT=1 to exit 1 when a target is missed, BENCH_WAIT_QUIET (0,
# seconds to wait for an otherwise idle machine). Any other QUILL_* setting
# in the environment reaches the processes as it is.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

DURATION=${BENCH_HOSTILE_DURATION:-20}
WARMUP=${BENCH_HOSTILE_WARMUP:-3}
CLIENTS=${BENCH_HOSTILE_CLIENTS:-16}
LEGIT_TENANTS=${BENCH_HOSTILE_LEGIT_TENANTS:-16}
ATTACK_CORES=${BENCH_HOSTILE_ATTACK_CORES:-0.5}
THINK_MS=${BENCH_HOSTILE_THINK_MS:-0}
RESEND_PERCENT=${BENCH_HOSTILE_RESEND_PERCENT:-20}
ATTACH_PERCENT=${BENCH_HOSTILE_ATTACH_PERCENT:-50}
SLOWLORIS=${BENCH_HOSTILE_SLOWLORIS:-200}
BAD_TOKEN_RATE=${BENCH_HOSTILE_BAD_TOKEN_RATE:-500}
FLOOD_FACTOR=${BENCH_HOSTILE_FLOOD_FACTOR:-10}
FLOOD_PAUSE_MS=${BENCH_HOSTILE_FLOOD_PAUSE_MS:-20}
BOMB_RATE=${BENCH_HOSTILE_BOMB_RATE:-1}
INVENTED_RATE=${BENCH_HOSTILE_INVENTED_METHOD_RATE:-200}
IDLE_CONNS=${BENCH_HOSTILE_IDLE_CONNS:-1100}
TIMEOUT=${BENCH_HOSTILE_TIMEOUT:-10}
RECOVER=${BENCH_HOSTILE_RECOVER:-30}
DRAIN=${BENCH_HOSTILE_DRAIN:-30}
export QUILL_TENANT_CONCURRENCY=${QUILL_TENANT_CONCURRENCY:-32}
export QUILL_TENANT_RATE=${QUILL_TENANT_RATE:-100}
export QUILL_WORKER_DECODE_MEMORY=${QUILL_WORKER_DECODE_MEMORY:-268435456}
STREAM=QUILL_BENCH_HOSTILE
PREFIX=quillhostile
RESULTS=bench/results/hostile-latest.txt

# count NAME VALUE: dies unless VALUE is a whole number (0 allowed).
count() { [[ $2 =~ ^(0|[1-9][0-9]*)$ ]] || die "$1 must be a whole number, got '$2'"; }
# percent NAME VALUE: dies unless VALUE is a whole number from 0 to 100.
percent() {
	count "$1" "$2"
	(($2 <= 100)) || die "$1 must be a whole number from 0 to 100, got '$2'"
}
# rate NAME VALUE: dies unless VALUE is a non-negative decimal.
rate() { [[ $2 =~ ^(0|[1-9][0-9]*)(\.[0-9]+)?$|^0?\.[0-9]+$ ]] || die "$1 must be a non-negative number per second such as 0.5, got '$2'"; }
posint BENCH_HOSTILE_DURATION "$DURATION"
seconds BENCH_HOSTILE_WARMUP "$WARMUP"
posint BENCH_HOSTILE_CLIENTS "$CLIENTS"
posint BENCH_HOSTILE_LEGIT_TENANTS "$LEGIT_TENANTS"
((LEGIT_TENANTS <= CLIENTS)) || die "BENCH_HOSTILE_LEGIT_TENANTS ($LEGIT_TENANTS) must not exceed BENCH_HOSTILE_CLIENTS ($CLIENTS): each tenant needs a client"
rate BENCH_HOSTILE_ATTACK_CORES "$ATTACK_CORES"
count BENCH_HOSTILE_THINK_MS "$THINK_MS"
percent BENCH_HOSTILE_RESEND_PERCENT "$RESEND_PERCENT"
percent BENCH_HOSTILE_ATTACH_PERCENT "$ATTACH_PERCENT"
count BENCH_HOSTILE_SLOWLORIS "$SLOWLORIS"
rate BENCH_HOSTILE_BAD_TOKEN_RATE "$BAD_TOKEN_RATE"
count BENCH_HOSTILE_FLOOD_FACTOR "$FLOOD_FACTOR"
count BENCH_HOSTILE_FLOOD_PAUSE_MS "$FLOOD_PAUSE_MS"
rate BENCH_HOSTILE_BOMB_RATE "$BOMB_RATE"
rate BENCH_HOSTILE_INVENTED_METHOD_RATE "$INVENTED_RATE"
count BENCH_HOSTILE_IDLE_CONNS "$IDLE_CONNS"
((IDLE_CONNS <= 20000)) || die "BENCH_HOSTILE_IDLE_CONNS must be at most 20000, got '$IDLE_CONNS'"
posint BENCH_HOSTILE_TIMEOUT "$TIMEOUT"
seconds BENCH_HOSTILE_RECOVER "$RECOVER"
seconds BENCH_HOSTILE_DRAIN "$DRAIN"
posint QUILL_TENANT_CONCURRENCY "$QUILL_TENANT_CONCURRENCY"
rate QUILL_TENANT_RATE "$QUILL_TENANT_RATE"
posint QUILL_WORKER_DECODE_MEMORY "$QUILL_WORKER_DECODE_MEMORY"

# The attackers' process holds 2 × BENCH_HOSTILE_IDLE_CONNS idle
# connections besides the others' hundreds, and the API up to
# QUILL_MAX_CONNECTIONS on each of its two servers: raise the soft limit
# on open files towards the hard one when it is lower than that.
NEED_FDS=$((2 * IDLE_CONNS + SLOWLORIS + 4096))
if [[ $(ulimit -n) != unlimited ]] && (($(ulimit -n) < NEED_FDS)); then
	ulimit -n "$NEED_FDS" 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
	[[ $(ulimit -n) == unlimited ]] || (($(ulimit -n) >= NEED_FDS)) ||
		die "the limit on open files is $(ulimit -n) (hard $(ulimit -Hn)), the run needs $NEED_FDS: lower BENCH_HOSTILE_IDLE_CONNS or raise it (ulimit -n)"
fi

bench_db quill_bench_hostile
work_dir quill-bench-hostile
build_bins ./cmd/api ./cmd/relay ./cmd/attachment-worker ./tools/hostile
nats_server_bin
log "nats-server $NATS_SERVER_VERSION (from go.mod) in $NATS_SERVER"
recreate_bench_db

# reads_setting BINARY SUBCOMMAND VARIABLE: the program's --help names
# VARIABLE, so it reads it (a build before issue 13's limits does not).
# (The help is read whole first: grep -q stopping early would kill the
# writer with SIGPIPE, which pipefail reports as "not read".)
reads_setting() {
	local help
	help=$("$1" "$2" --help 2>&1) || true
	[[ $help == *"($3,"* ]]
}
# setting_note BINARY SUBCOMMAND VARIABLE: "VARIABLE=value" (or its
# default) and whether the program reads it.
setting_note() {
	local v=${!3:-default}
	if reads_setting "$@"; then echo "$3=$v"; else echo "$3=$v (not read by this build)"; fi
}

# --- NATS, API, relay, worker ---------------------------------------------------------
log "starting nats-server"
nats_start "$WORK/nats"

token() { DATABASE_URL=$BENCH_URL ./bin/api token create --tenant "$1" 2>>"$WORK/api-cli.log" || die "api token create --tenant $1 failed (see $WORK/api-cli.log)"; }
if ((LEGIT_TENANTS == 1)); then
	start_api legit
	LEGIT_TOKENS=$TOKEN LEGIT_NAMES=legit
else
	start_api legit-1
	LEGIT_TOKENS=$TOKEN LEGIT_NAMES=legit-1
	for ((i = 2; i <= LEGIT_TENANTS; i++)); do
		LEGIT_TOKENS+=",$(token "legit-$i")" LEGIT_NAMES+=",legit-$i"
	done
fi
API_ADMIN_URL="http://$(log_addr "$WORK/api.log" admin)"
[[ $API_ADMIN_URL != http:// ]] || die "the API did not report its admin address: $(tail -3 "$WORK/api.log")"
FLOOD_TOKEN=$(token flood)
BOMB_TOKEN=$(token bomber)

# daemon NAME CMD...: starts a Quill daemon on the bench database and
# stream, its log $WORK/NAME.log; sets DAEMON_PID.
daemon() {
	local name=$1
	shift
	env -u GOMAXPROCS DATABASE_URL="$BENCH_URL" NATS_URL="$NATS_URL" QUILL_STREAM="$STREAM" QUILL_SUBJECT_PREFIX="$PREFIX" \
		QUILL_ADMIN_ADDR=127.0.0.1:0 "$@" >"$WORK/$name.out" 2>"$WORK/$name.log" &
	DAEMON_PID=$!
	on_exit_stop "$DAEMON_PID"
	wait_for_line "$WORK/$name.log" '"listener":"admin","addr":"' "$DAEMON_PID" 30 ||
		die "the $name did not report its admin address: $(tail -3 "$WORK/$name.log")"
}
log "starting the relay and the attachment worker"
daemon relay ./bin/relay run
RELAY_PID=$DAEMON_PID
daemon worker ./bin/attachment-worker run
WORKER_PID=$DAEMON_PID

API_NOTE="pid $API_PID, admin $API_ADMIN_URL, $(setting_note ./bin/api serve QUILL_TENANT_CONCURRENCY), $(setting_note ./bin/api serve QUILL_TENANT_RATE), $(setting_note ./bin/api serve QUILL_MAX_CONCURRENCY), $(setting_note ./bin/api serve QUILL_READ_TIMEOUT), $(setting_note ./bin/api serve QUILL_MAX_CONNECTIONS), $(setting_note ./bin/api serve QUILL_TRUSTED_PROXIES)"
WORKER_NOTE="pid $WORKER_PID, $(setting_note ./bin/attachment-worker run QUILL_WORKER_DECODE_MEMORY), $(setting_note ./bin/attachment-worker run QUILL_MAX_PIXELS)"

# The attackers run in a process of their own (tools/hostile starts it),
# held to ATTACK_CORES: an attacker's requests cost its own machines, and
# on one machine of two cores an uncapped one takes from the API the CPU it
# spends making them.
ATTACK_WRAP="" ATTACK_NOTE="a process of their own, uncapped (BENCH_HOSTILE_ATTACK_CORES=0)"
if [[ $ATTACK_CORES != 0 && $ATTACK_CORES != 0.0 ]]; then
	cap_init
	cap_wrapper hostile-attack "$ATTACK_CORES" "$WORK/attack-cap.sh"
	ATTACK_WRAP=$WORK/attack-cap.sh
	ATTACK_NOTE="a process of their own held to $ATTACK_CORES cores ($CAP_METHOD CPU quota; BENCH_HOSTILE_ATTACK_CORES)"
fi

# --- the benchmark --------------------------------------------------------------------
wait_quiet_start
share() { awk -v p="$1" 'BEGIN { printf "%.2f", p / 100 }'; }
log "running tools/hostile: 2 × (${WARMUP}s + ${DURATION}s), then up to ${RECOVER}s of resends and ${DRAIN}s for attachments"
rc=0
./bin/hostile --url "$API_URL" --admin-url "$API_ADMIN_URL" --database-url "$BENCH_URL" \
	--token "$LEGIT_TOKENS" --flood-token "$FLOOD_TOKEN" --bomb-token "$BOMB_TOKEN" \
	--legit-tenant "$LEGIT_NAMES" --flood-tenant flood --bomb-tenant bomber \
	--api-pid "$API_PID" --worker-pid "$WORKER_PID" \
	--cpu-pid api="$API_PID" --cpu-pid relay="$RELAY_PID" --cpu-pid worker="$WORKER_PID" --cpu-pid nats="$NATS_PID" \
	--attack-wrap "$ATTACK_WRAP" --attack-note "$ATTACK_NOTE" \
	--duration "${DURATION}s" --warmup "${WARMUP}s" --timeout "${TIMEOUT}s" --recover "${RECOVER}s" --drain "${DRAIN}s" \
	--legit-clients "$CLIENTS" --legit-think "${THINK_MS}ms" --resend-share "$(share "$RESEND_PERCENT")" --attach-share "$(share "$ATTACH_PERCENT")" \
	--slowloris "$SLOWLORIS" --bad-token-rate "$BAD_TOKEN_RATE" --bomb-rate "$BOMB_RATE" \
	--invented-method-rate "$INVENTED_RATE" --idle-conns "$IDLE_CONNS" \
	--tenant-concurrency "$QUILL_TENANT_CONCURRENCY" --flood-factor "$FLOOD_FACTOR" --flood-pause "${FLOOD_PAUSE_MS}ms" \
	--decode-budget "$QUILL_WORKER_DECODE_MEMORY" --api-note "$API_NOTE" --worker-note "$WORKER_NOTE" \
	>"$WORK/hostile.txt" 2> >(tee "$WORK/hostile.err" >&2) || rc=$?
((rc == 0)) || die "tools/hostile failed (status $rc): $(tail -3 "$WORK/hostile.err")"
MISSED=$(sed -n 's/^targets missed: \([0-9]*\) of .*/\1/p' "$WORK/hostile.txt")
count "the report's targets missed" "$MISSED"

# survived NAME PID: appends "NAME running" or how it ended to STATE; a
# daemon that exited is forgotten, so the stop at exit does not wait for it.
STATE=""
survived() {
	local st=0
	if kill -0 "$2" 2>/dev/null; then
		STATE+="${STATE:+, }$1 running"
		return
	fi
	wait "$2" || st=$?
	stop_pid "$2"
	STATE+="${STATE:+, }$1 EXITED (status $st; log $WORK/$1.log)"
}
survived api "$API_PID"
survived relay "$RELAY_PID"
survived worker "$WORKER_PID"
check test "$STATE" = "api running, relay running, worker running"
# The survivors are stopped now: a daemon must exit 0 on SIGTERM, even
# after this (stop_role dies naming it otherwise, the logs kept).
for p in "$WORKER_PID" "$RELAY_PID" "$API_PID"; do
	if kill -0 "$p" 2>/dev/null; then stop_role "daemon (api, relay or worker)" "$p"; fi
done
STATE+="; each running one exited 0 on SIGTERM"
TOTAL=$(sed -n 's/^targets missed: [0-9]* of \([0-9]*\)$/\1/p' "$WORK/hostile.txt")

{
	echo "Quill bench-hostile — $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	host_line
	pg_line max_connections shared_buffers synchronous_commit
	echo "nats-server $NATS_SERVER_VERSION, fresh file store; the API (pool 16 unless DATABASE_URL names pool_max_conns), one relay, one worker, the tool, PostgreSQL and NATS share the $NCPU CPUs; before the start, $BG cores were busy with other work"
	echo
	cat "$WORK/hostile.txt"
	echo "processes after the run: $STATE — target all running: $VERDICT"
	echo "targets missed overall: $MISSED of $((TOTAL + 1))"
} >"$WORK/report.txt"

publish_report "$RESULTS"
