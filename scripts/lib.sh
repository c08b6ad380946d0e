# shellcheck shell=bash
# lib.sh: what Quill's scripts share. Sourced, after `cd` to the repository
# root, by scripts/*.sh:
#
#   source scripts/lib.sh
#
# Messages go to stderr, prefixed with the sourcing script's name. The
# benchmark helpers (work directory, database, API, NATS, CPU accounting,
# report) keep their state in the globals they name: WORK, OK, BENCH_DB,
# BENCH_URL, ADMIN_URL, API_PID, API_URL, TOKEN, NATS_PID, NATS_URL, ROLE,
# WINDOW_T0, WINDOW_S, BG, MISSED, VERDICT.
# shellcheck disable=SC2034 # those globals are read by the sourcing scripts

GO=${GO:-go}
LIB_PROG=$(basename "${BASH_SOURCE[1]:-$0}" .sh)

log() { printf '%s: %s\n' "$LIB_PROG" "$*" >&2; }
die() {
	printf '%s: ERROR: %s\n' "$LIB_PROG" "$*" >&2
	exit 1
}

# posint NAME VALUE: dies unless VALUE is a positive integer.
posint() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"; }
# seconds NAME VALUE: dies unless VALUE is whole seconds (0 allowed).
seconds() { [[ $2 =~ ^[0-9]+$ ]] || die "$1 must be whole seconds, got '$2'"; }

# tcp_open HOST PORT: something accepts TCP connections there.
tcp_open() {
	[[ $1 == /* ]] && return 1
	# shellcheck disable=SC2016 # expanded by the inner bash
	timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" >/dev/null 2>&1
}

# build_bins PACKAGE...: go build the packages into ./bin, with the version
# Go records from the checkout (-buildvcs=auto: a GOFLAGS=-buildvcs=false in
# the environment would otherwise leave them "(devel)").
build_bins() {
	log "building $* into ./bin"
	"$GO" build -buildvcs=auto -o bin/ "$@" || die "go build $* failed"
}

# nats_server_bin: sets NATS_SERVER to .data/bin/nats-server, the
# nats-server go.mod pins (a tool of this module), building it when it is
# missing or of another version, NATS_SERVER_VERSION to its version and
# NATS_SERVER_BUILT to true when it was built now. The same server for dev,
# CI, the benchmarks and the tests' in-process one.
nats_server_bin() {
	NATS_SERVER_VERSION=$("$GO" list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2) ||
		die "go list -m github.com/nats-io/nats-server/v2 failed"
	NATS_SERVER=$PWD/.data/bin/nats-server
	NATS_SERVER_BUILT=false
	if [[ -x $NATS_SERVER && -f $NATS_SERVER.version && $(<"$NATS_SERVER.version") == "$NATS_SERVER_VERSION" ]]; then
		return 0
	fi
	mkdir -p "$(dirname "$NATS_SERVER")"
	"$GO" build -o "$NATS_SERVER" github.com/nats-io/nats-server/v2 ||
		die "go build github.com/nats-io/nats-server/v2 ($NATS_SERVER_VERSION, from go.mod) failed"
	echo "$NATS_SERVER_VERSION" >"$NATS_SERVER.version"
	NATS_SERVER_BUILT=true
}

# nats_start DIR [JETSTREAM_SETTING]: NATS_SERVER (nats_server_bin) on a free
# loopback port (GOMAXPROCS unset), JetStream storing in a fresh DIR/store,
# with JETSTREAM_SETTING (such as "sync_interval: always") when given; its
# config and log in DIR; stopped on exit. Sets NATS_PID and NATS_URL.
nats_start() {
	local dir=$1
	mkdir -p "$dir/store"
	printf 'host: 127.0.0.1\nport: -1\njetstream { store_dir: "%s"%s }\n' "$dir/store" "${2:+, $2}" >"$dir/nats.conf"
	env -u GOMAXPROCS "$NATS_SERVER" -c "$dir/nats.conf" >"$dir/nats.log" 2>&1 &
	NATS_PID=$!
	on_exit_stop "$NATS_PID"
	wait_for_line "$dir/nats.log" 'Server is ready' "$NATS_PID" 15 || die "nats-server did not start (see $dir/nats.log)"
	NATS_URL="nats://$(sed -n 's/.*Listening for client connections on \([0-9.]*:[0-9]*\).*/\1/p' "$dir/nats.log" | head -1)"
	[[ $NATS_URL != nats:// ]] || die "no client port in $dir/nats.log"
}

# --- processes ----------------------------------------------------------------
# LIB_PIDS: the processes stop_all (the EXIT trap of work_dir) stops.
LIB_PIDS=()

# on_exit_stop PID...: stop these processes when the script exits.
on_exit_stop() { LIB_PIDS+=("$@"); }

# stop_pid PID: SIGTERM, then wait for it; forgets it for stop_all.
stop_pid() {
	local p rest=()
	[[ -n $1 ]] || return 0
	if kill -0 "$1" 2>/dev/null; then
		kill -TERM "$1" 2>/dev/null || true
		wait "$1" 2>/dev/null || true
	fi
	for p in "${LIB_PIDS[@]}"; do [[ $p == "$1" ]] || rest+=("$p"); done
	LIB_PIDS=("${rest[@]}")
}

# stop_role WHAT PID...: SIGTERM to each, wait, forget it (stop_all and
# ROLE); dies naming WHAT when one did not exit 0, as a daemon must on
# SIGTERM.
stop_role() {
	local what=$1 p rc=0
	shift
	for p in "$@"; do
		kill -TERM "$p" 2>/dev/null || true
		wait "$p" || rc=$?
		stop_pid "$p"
		unset "ROLE[$p]"
	done
	((rc == 0)) || die "a $what exited with status $rc on SIGTERM (logs in $WORK)"
}

# stop_all: stops every process of on_exit_stop, the last started first.
stop_all() {
	local i
	for ((i = ${#LIB_PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${LIB_PIDS[i]}"; done
}

# wait_for_line FILE PATTERN PID SECONDS: until grep finds PATTERN in FILE;
# fails when PID exits or time runs out.
wait_for_line() {
	local i
	for ((i = 0; i < $4 * 50; i++)); do
		grep -qs -- "$2" "$1" && return 0
		kill -0 "$3" 2>/dev/null || return 1
		sleep 0.02
	done
	return 1
}

# log_addr FILE LISTENER: the address a Quill program's JSON log says its
# LISTENER (api, admin) listens on; the programs run on port 0, so the
# kernel picks a free port and the log names it.
log_addr() { grep -o "\"listener\":\"$2\",\"addr\":\"[^\"]*\"" "$1" | head -1 | sed 's/.*"addr":"//; s/"$//'; }

# metrics_sum AWK LOG...: the three whole numbers AWK prints from the
# /metrics of each daemon whose JSON log is a LOG (at the admin address the
# log names; a log without one, or a scrape that fails, is skipped), summed:
# "a b c".
metrics_sum() {
	local prog=$1 f addr m a b c sa=0 sb=0 sc=0
	shift
	for f in "$@"; do
		addr=$(log_addr "$f" admin)
		[[ -n $addr ]] || continue
		m=$(curl -fsS "http://$addr/metrics") || continue
		read -r a b c < <(awk "$prog" <<<"$m")
		sa=$((sa + a)) sb=$((sb + b)) sc=$((sc + c))
	done
	echo "$sa $sb $sc"
}

# work_dir PREFIX: sets WORK to a fresh temporary directory and OK=false;
# on exit the processes of on_exit_stop are stopped and WORK is removed
# when OK is true (the run succeeded), kept for its logs otherwise.
work_dir() {
	WORK=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
	OK=false
	trap lib_cleanup EXIT
	trap 'exit 130' INT TERM
}
lib_cleanup() {
	stop_all
	cap_cleanup
	if $OK; then
		rm -rf "$WORK"
	else
		log "logs kept in $WORK"
	fi
}

# --- CPU caps ---------------------------------------------------------------------
# A capped process runs in a control group of its own whose CPU bandwidth is
# CORES × the period (100 ms): the kernel lets it run at most that long per
# period, however idle the machine is. cap_init picks the mechanism once:
#   cgroup1  the cpu controller of cgroup v1 mounted read-write at
#            /sys/fs/cgroup/cpu: a directory quill-bench-NAME with
#            cpu.cfs_period_us and cpu.cfs_quota_us;
#   cgroup2  a unified hierarchy at /sys/fs/cgroup whose root offers the cpu
#            controller: a directory quill-bench-NAME with cpu.max;
#   systemd  systemd-run --scope -p CPUQuota=P% (a transient scope).
# Every group it made is removed on exit (lib_cleanup), after its processes
# were stopped. CAP_METHOD names the mechanism, CAP_DIRS the groups.
CAP_METHOD=""
CAP_PERIOD_US=100000
CAP_DIRS=()
CAP_V1=/sys/fs/cgroup/cpu
CAP_V2=/sys/fs/cgroup

# cap_init: sets CAP_METHOD, or dies naming what is missing.
cap_init() {
	if [[ -w $CAP_V1/cgroup.procs && -f $CAP_V1/cpu.cfs_quota_us ]]; then
		CAP_METHOD=cgroup1
	elif [[ -f $CAP_V2/cgroup.controllers && -w $CAP_V2/cgroup.procs ]] && grep -qw cpu "$CAP_V2/cgroup.controllers"; then
		CAP_METHOD=cgroup2
		# Children get the cpu controller only if the root hands it down.
		grep -qw cpu "$CAP_V2/cgroup.subtree_control" 2>/dev/null || echo +cpu >"$CAP_V2/cgroup.subtree_control" ||
			die "cannot enable the cpu controller in $CAP_V2/cgroup.subtree_control"
	elif command -v systemd-run >/dev/null 2>&1 && systemd-run --scope --quiet -p CPUQuota=50% true >/dev/null 2>&1; then
		CAP_METHOD=systemd
	else
		die "no way to cap a process's CPU: need write access to $CAP_V1 (cgroup v1 cpu), a cgroup v2 root at $CAP_V2 with the cpu controller, or systemd-run --scope (run as root)"
	fi
}

# cap_quota_us CORES: the quota per period for CORES (e.g. 0.25).
cap_quota_us() { awk -v c="$1" -v p="$CAP_PERIOD_US" 'BEGIN { printf "%d", c * p }'; }

# cap_dir NAME: the group of NAME under the chosen mechanism.
cap_dir() {
	case $CAP_METHOD in
	cgroup1) echo "$CAP_V1/quill-bench-$1" ;;
	cgroup2) echo "$CAP_V2/quill-bench-$1" ;;
	esac
}

# cap_start NAME CORES LOG CMD...: runs CMD in the background, its output
# to LOG.out and LOG (stderr), inside a fresh group NAME held to CORES
# cores; sets CAPPED_PID (CMD's pid: the shell that joins the group execs
# it, so the process is in the group from its first instruction).
cap_start() {
	local name=$1 cores=$2 logf=$3
	shift 3
	cap_wrapper "$name" "$cores" "${WORK:?cap_start needs WORK}/cap-$name.sh"
	"$WORK/cap-$name.sh" "$@" >"$logf.out" 2>"$logf" &
	CAPPED_PID=$!
}

# cap_wrapper NAME CORES FILE: writes FILE, an executable that runs its
# arguments (exec, GOMAXPROCS unset) inside a fresh group NAME held to
# CORES cores: for cap_start, and for a program that starts the capped
# process itself (tools/hostile --attack-wrap). The group is removed on
# exit (lib_cleanup).
cap_wrapper() {
	local name=$1 cores=$2 file=$3 dir quota
	quota=$(cap_quota_us "$cores")
	((quota >= 1000)) || die "a CPU cap of $cores cores is below the kernel's 1 ms minimum quota"
	case $CAP_METHOD in
	cgroup1 | cgroup2)
		dir=$(cap_dir "$name")
		cap_remove "$dir"
		mkdir "$dir" || die "mkdir $dir failed"
		CAP_DIRS+=("$dir")
		if [[ $CAP_METHOD == cgroup1 ]]; then
			echo "$CAP_PERIOD_US" >"$dir/cpu.cfs_period_us" && echo "$quota" >"$dir/cpu.cfs_quota_us"
		else
			echo "$quota $CAP_PERIOD_US" >"$dir/cpu.max"
		fi || die "cannot set the CPU quota of $dir"
		printf '#!/usr/bin/env bash\necho $$ >%q/cgroup.procs && exec env -u GOMAXPROCS "$@"\n' "$dir" >"$file"
		;;
	systemd)
		printf '#!/usr/bin/env bash\nexec env -u GOMAXPROCS systemd-run --scope --quiet --unit quill-bench-%s-$$ -p CPUQuota=%s%% -- "$@"\n' \
			"$name" "$(awk -v c="$cores" 'BEGIN { printf "%d", c * 100 }')" >"$file"
		;;
	*) die "cap_wrapper before cap_init" ;;
	esac
	chmod +x "$file"
}

# cap_throttled NAME: "periods throttled throttled_s" of group NAME so far
# (cgroup v1 cpu.stat or v2 cpu.stat); "- - -" under systemd.
cap_throttled() {
	local dir
	dir=$(cap_dir "$1")
	if [[ -z $dir || ! -f $dir/cpu.stat ]]; then
		echo "- - -"
		return
	fi
	awk '$1 == "nr_periods" { p = $2 } $1 == "nr_throttled" { t = $2 }
		$1 == "throttled_time" { s = $2 / 1e9 } $1 == "throttled_usec" { s = $2 / 1e6 }
		END { printf "%d %d %.2f\n", p, t, s }' "$dir/cpu.stat"
}

# cap_remove DIR: removes a group; any process still in it (the caller
# stopped them all) is moved to the root group first.
cap_remove() {
	local root p i
	[[ -d $1 ]] || return 0
	root=$(dirname "$1")
	for ((i = 0; i < 50; i++)); do
		rmdir "$1" 2>/dev/null && return 0
		while read -r p; do echo "$p" >"$root/cgroup.procs" 2>/dev/null || true; done <"$1/cgroup.procs"
		sleep 0.1
	done
	log "WARNING: could not remove $1"
}

# cap_cleanup: removes every group cap_start made.
cap_cleanup() {
	local d
	for d in "${CAP_DIRS[@]}"; do cap_remove "$d"; done
	CAP_DIRS=()
}

# --- PostgreSQL -----------------------------------------------------------------
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

# pg_server_tool NAME: NAME from the newest /usr/lib/postgresql/*/bin.
pg_server_tool() {
	local found
	found=$(printf '%s\n' /usr/lib/postgresql/*/bin/"$1" | sort -V | tail -1)
	[[ -n $found && -x $found ]] || return 1
	echo "$found"
}

# pg_tool NAME: NAME from PATH, else from the newest /usr/lib/postgresql/*/bin.
pg_tool() { command -v "$1" 2>/dev/null || pg_server_tool "$1"; }

# bench_db DB: the benchmark's database DB on the server of DATABASE_URL
# (only its server and credentials are used): sets BENCH_DB, BENCH_URL,
# ADMIN_URL (the server's postgres database) and PSQL.
bench_db() {
	DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/quill?sslmode=disable}
	BENCH_DB=$1
	ADMIN_URL=$(with_db "$DATABASE_URL" postgres)
	BENCH_URL=$(with_db "$DATABASE_URL" "$BENCH_DB")
	PSQL=$(pg_tool psql) || die "psql not found (PATH or /usr/lib/postgresql/*/bin); install the PostgreSQL client"
}
psql_admin() { PGOPTIONS='-c client_min_messages=warning' "$PSQL" -X -q -v ON_ERROR_STOP=1 "$ADMIN_URL" "$@"; }
psql_bench() { PGOPTIONS='-c client_min_messages=warning' "$PSQL" -X -q -v ON_ERROR_STOP=1 "$BENCH_URL" "$@"; }

# recreate_bench_db: drops BENCH_DB and creates it again with ./bin/api
# migrate.
recreate_bench_db() {
	psql_admin -c 'SELECT 1' >/dev/null 2>"$WORK/psql.err" ||
		die "cannot connect to $ADMIN_URL: $(cat "$WORK/psql.err") (is PostgreSQL running? try: bash scripts/ensure-postgres.sh)"
	log "recreating database $BENCH_DB"
	psql_admin -c "DROP DATABASE IF EXISTS $BENCH_DB WITH (FORCE)"
	DATABASE_URL=$BENCH_URL ./bin/api migrate 2>>"$WORK/api-cli.log" || die "api migrate failed (see $WORK/api-cli.log)"
}

# start_api TENANT [NAME]: ./bin/api serve on BENCH_URL, on free loopback
# ports (GOMAXPROCS unset), and a token for TENANT: sets API_PID, API_URL,
# TOKEN. Its log is $WORK/NAME.log (NAME: api), so that two APIs can run
# side by side.
start_api() {
	local name=${2:-api}
	log "starting the API (log: $WORK/$name.log)"
	env -u GOMAXPROCS ${BENCH_API_GOGC:+GOGC=$BENCH_API_GOGC} DATABASE_URL="$BENCH_URL" ./bin/api serve --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
		>"$WORK/$name.out" 2>"$WORK/$name.log" &
	API_PID=$!
	on_exit_stop "$API_PID"
	wait_for_line "$WORK/$name.log" '"listener":"api","addr":"' "$API_PID" 15 ||
		die "the API did not report its listening address: $(tail -3 "$WORK/$name.log")"
	API_URL="http://$(log_addr "$WORK/$name.log" api)"
	TOKEN=$(DATABASE_URL=$BENCH_URL ./bin/api token create --tenant "$1" 2>>"$WORK/api-cli.log") ||
		die "api token create failed (see $WORK/api-cli.log)"
	log "API pid $API_PID at $API_URL"
}

# --- CPU accounting ---------------------------------------------------------------
# Two snapshots bracket a measured window and give the cores used by each
# role of ROLE (the processes the script started: client, api, relay,
# nats, ...), by PostgreSQL (BENCH_DB's backends plus the postmaster and its
# background processes: WAL writer, checkpointer, autovacuum, ...) and by
# the whole machine (/proc/stat). "other" is the rest: the kernel's loopback
# networking and interrupts, and whatever else runs on the machine (a noisy
# neighbour shows up there).
NCPU=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)
CLK_TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
now_s() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

# ROLE[pid]: the role of each process of interest the script started.
declare -A ROLE

# cpu_snapshot: "pid role ticks" for every process of interest (PostgreSQL's
# as pg), then "sys busy total" (all CPUs, clock ticks).
cpu_snapshot() {
	local d pid stat comm cmd class
	local -a f
	for d in /proc/[0-9]*; do
		pid=${d#/proc/}
		read -r stat 2>/dev/null <"$d/stat" || continue # gone meanwhile
		comm=${stat#* (}
		comm=${comm%%) *}
		read -r -a f <<<"${stat##*) }"
		class=${ROLE[$pid]:-}
		if [[ -z $class && $comm == postgres ]]; then
			# The process title (postgres: ... DB HOST(PORT) state) is the
			# first NUL-terminated string of cmdline.
			cmd=""
			IFS= read -r -d '' cmd 2>/dev/null <"$d/cmdline" || [[ -n $cmd ]] || continue
			if [[ $cmd != *" $BENCH_DB "* && ($cmd == *"("[0-9]*")"* || $cmd == *"[local]"*) ]]; then
				continue # a backend of another database: not ours
			fi
			class=pg
		fi
		[[ -n $class ]] || continue
		echo "$pid $class $((f[11] + f[12]))"
	done
	awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print "sys", t - $5 - $6, t; exit }' /proc/stat
}

# cpu_report PHASE SNAP0 SNAP1 SECONDS "ROLE..." [CLIENT_CORES]: appends
# "phase ROLE... other busy" (cores; "-" for a role with no process) to
# $WORK/cpu. A process missing from SNAP0 started inside the window
# (counted from 0); CLIENT_CORES, when given, replaces the client's share (a
# client that has exited by SNAP1 reports its own).
cpu_report() {
	awk -v phase="$1" -v s="$4" -v roles="$5" -v hz="$CLK_TCK" -v n="$NCPU" -v cc="${6:-}" '
		FNR == NR { if ($1 == "sys") { b0 = $2; t0 = $3 } else t[$1] = $3; next }
		$1 == "sys" { busy = ($2 - b0) / ($3 - t0) * n; next }
		{ d[$2] += $3 - (($1 in t) ? t[$1] : 0); seen[$2] = 1 }
		function cores(c) { return (c == "client" && cc != "") ? cc : d[c] / hz / s }
		END {
			k = split(roles, r, " ")
			o = busy
			line = phase
			for (i = 1; i <= k; i++) {
				o -= cores(r[i])
				line = line " " ((r[i] in seen || (r[i] == "client" && cc != "")) ? sprintf("%.2f", cores(r[i])) : "-")
			}
			if (o < 0) o = 0
			printf "%s %.2f %.2f\n", line, o, busy
		}' "$2" "$3" >>"$WORK/cpu"
}

# cpu_window_start: opens a measured window: WINDOW_T0, its start, and the
# snapshot $WORK/snap0.
cpu_window_start() {
	WINDOW_T0=$(now_s)
	snapshot_now >"$WORK/snap0"
}
# snapshot_now: cpu_snapshot, raised above the load it measures when the
# script may (root): at 64 busy clients a snapshot at equal priority took
# longer than the window's margin, and the closing one found pgbench and its
# backends already gone (reported as 0 cores).
snapshot_now() {
	if ((EUID == 0)); then renice -n -10 -p $$ >/dev/null 2>&1 || true; fi
	cpu_snapshot
	if ((EUID == 0)); then renice -n 0 -p $$ >/dev/null 2>&1 || true; fi
}
# cpu_window_end [PHASE "ROLE..." [CLIENT_CORES]]: closes it: the snapshot
# $WORK/snap1 and WINDOW_S, its length in seconds; with PHASE, then
# cpu_window_report.
cpu_window_end() {
	local t1
	t1=$(now_s)
	snapshot_now >"$WORK/snap1"
	WINDOW_S=$(elapsed "$WINDOW_T0" "$t1")
	if (($# > 0)); then cpu_window_report "$@"; fi
}
# cpu_window_report PHASE "ROLE..." [CLIENT_CORES]: cpu_report of the last
# window.
cpu_window_report() { cpu_report "$1" "$WORK/snap0" "$WORK/snap1" "$WINDOW_S" "$2" "${3:-}"; }

# cpu_table PHASE_WIDTH COLUMN...: prints $WORK/cpu, cpu_report's lines, as a
# table indented by two spaces under a row of names: "phase", left-aligned
# in PHASE_WIDTH, then the COLUMNs (the roles, other and busy), each
# right-aligned in its name's width, at least 5.
cpu_table() {
	local fmt="  %-$1s" c
	local -a f
	shift
	for c in "$@"; do fmt+=" | %$((${#c} > 5 ? ${#c} : 5))s"; done
	fmt+='\n'
	# shellcheck disable=SC2059 # the format is built above
	printf "$fmt" phase "$@"
	# shellcheck disable=SC2059
	while read -r -a f; do printf "$fmt" "${f[@]}"; done <"$WORK/cpu"
}
# cpu_warn_busy: a WARNING naming the phases of $WORK/cpu in which more than
# 0.35 cores went to other work (its next-to-last column), if any.
cpu_warn_busy() {
	local noisy
	noisy=$(awk '$(NF - 1) > 0.35 { printf "%s%s", (n++ ? ", " : ""), $1 }' "$WORK/cpu")
	if [[ -n $noisy ]]; then
		echo "  WARNING: more than 0.35 cores went to other work during: $noisy — a busy machine; compare with care"
	fi
}

# --- a quiet machine? --------------------------------------------------------------
# Every number is a share of the same few CPUs: anything else running (a
# build, tests) lowers both sides of a ratio unevenly. BENCH_WAIT_QUIET=N
# waits up to N seconds for the load to fall under QUIET_LIMIT cores.
QUIET_LIMIT=0.25
WAIT_QUIET=${BENCH_WAIT_QUIET:-0}
seconds BENCH_WAIT_QUIET "$WAIT_QUIET"
sys_busy() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat; }
# background_cores: the cores busy over the next two seconds.
background_cores() {
	local b0 t0 b1 t1
	read -r b0 t0 < <(sys_busy)
	sleep 2
	read -r b1 t1 < <(sys_busy)
	awk -v b=$((b1 - b0)) -v t=$((t1 - t0)) -v n="$NCPU" 'BEGIN { printf "%.2f", (t > 0 ? b / t * n : 0) }'
}
busy() { awk -v b="$BG" -v l="$QUIET_LIMIT" 'BEGIN { exit !(b > l) }'; }
# wait_quiet: sets BG to the cores busy now, after waiting for at most
# WAIT_QUIET seconds for it to fall under QUIET_LIMIT.
wait_quiet() {
	local waited=0
	BG=$(background_cores)
	while busy && ((waited < WAIT_QUIET)); do
		log "the machine is busy ($BG cores in use); waiting for it to quiet down (${waited}s of ${WAIT_QUIET}s)"
		sleep 3
		waited=$((waited + 5))
		BG=$(background_cores)
	done
}
# wait_quiet_start: wait_quiet before the benchmark, with a warning when the
# machine stayed busy.
wait_quiet_start() {
	wait_quiet
	if busy; then
		log "WARNING: $BG of $NCPU cores were busy before the benchmark started; results will be low and noisy"
	fi
}

# --- results ------------------------------------------------------------------------
# jget JSON FIELD: the first scalar FIELD in a JSON object (the tools'
# output names are unique enough; nested objects are searched too, so ask
# for a name that occurs once).
jget() { sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$1" | head -1; }
# jobj JSON NAME: the flat nested object NAME of a JSON object.
jobj() { sed -n "s/.*\"$2\":\({[^{}]*}\).*/\1/p" <<<"$1" | head -1; }

# median "V...": the median of the numbers in a space-separated list (of an
# even count, the mean of the middle two, to one decimal).
median() { tr ' ' '\n' <<<"$1" | awk 'NF' | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# int V: V rounded to a whole number.
int() { awk -v v="$1" 'BEGIN { printf "%.0f\n", v }'; }
# ratio A B [DECIMALS]: A ÷ B (2 decimals by default), n/a when B is not
# positive.
ratio() { awk -v a="$1" -v b="$2" -v p="${3:-2}" 'BEGIN { if (b > 0) printf("%." p "f", a / b); else print "n/a" }'; }
# ge, gt, lt A B: numeric comparisons; n/a and empty count as 0 (compared
# as strings, n/a would pass ge against any number).
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 >= b + 0) }'; }
gt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 > b + 0) }'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }

MISSED=0
# check TEST ARGS...: sets VERDICT to met or MISSED (and counts misses).
check() {
	if "$@"; then VERDICT=met; else
		VERDICT=MISSED
		MISSED=$((MISSED + 1))
	fi
}

# host_line: the commit, Go, CPUs and memory a report was measured with.
host_line() {
	local rev
	rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
	[[ -z $(git status --porcelain 2>/dev/null) ]] || rev="$rev (+ uncommitted changes)"
	echo "commit $rev; $("$GO" version | cut -d' ' -f3-); $NCPU CPUs ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || echo unknown)), $(($(awk '/^MemTotal/ { print $2 }' /proc/meminfo) / 1024)) MiB"
}

# pg_line SETTING...: PostgreSQL's version, the benchmark database and the
# settings named.
pg_line() {
	local names
	names=$(printf "'%s'," "$@")
	echo "PostgreSQL $(psql_bench -Atc 'SHOW server_version') at ${BENCH_URL%%\?*} ($(psql_bench -Atc "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings WHERE name IN (${names%,})"))"
}

# publish_report RESULTS: copies $WORK/report.txt to RESULTS and prints it;
# marks the run a success (OK=true) and, with BENCH_STRICT=1, exits 1 when a
# target was missed.
publish_report() {
	mkdir -p "$(dirname "$1")"
	cp "$WORK/report.txt" "$1"
	cat "$1"
	echo
	log "written to $1"
	OK=true
	if [[ ${BENCH_STRICT:-0} == 1 ]] && ((MISSED > 0)); then
		exit 1
	fi
}
