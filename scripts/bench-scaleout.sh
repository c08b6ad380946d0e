# shellcheck shell=bash
# shellcheck disable=SC2004,SC2034 # run standalone, shellcheck cannot see that the arrays are bench-relay.sh's associative ones and its globals its helpers read
# bench-scaleout.sh: the scale-out mode of `make bench-relay`
# (BENCH_RELAY_SCALEOUT=1; `BENCH_WORKER_SCALEOUT=1 make bench-worker` runs
# it too). Sourced by scripts/bench-relay.sh after its helpers (NATS,
# relays, raw and relay runs, CPU accounting), with the API started and the
# database recreated; see bench/README.md.
#
# On 2 cores one uncapped relay, PostgreSQL and nats-server fill the
# machine, so a second relay can only contend. Here every relay process is
# held to BENCH_RELAY_CAP cores and every worker to BENCH_WORKER_CAP (a
# cgroup CPU quota, lib.sh cap_start), small enough that PostgreSQL and NATS
# keep headroom, and the question becomes: do two capped processes do twice
# the work of one? A relay event costs PostgreSQL and nats-server about twice
# the relay's own CPU, so two relays at 0.15 leave them ~0.6 cores of the
# two; a PNG costs the database almost nothing next to its processing.
#
#   relay    1 capped relay, then 2, drain a fresh backlog of BENCH_EVENTS
#            from the outbox into a single nats-server (defaults), with a raw
#            ceiling run before them for reference (target: 2 ≥ 1.8 × 1);
#   worker   BENCH_WORKER_N notes with a BENCH_WORKER_FIXTURE attachment
#            created through the API and published by an uncapped relay,
#            which then stops; 1 capped worker, then 2, process them
#            (target: 2 ≥ 1.8 × 1);
#   cluster  three nats-server processes clustered on loopback, an R3
#            stream; raw R3 async publishing (relaybench raw --replicas 3)
#            before and after one uncapped relay draining BENCH_EVENTS
#            (target: relay ≥ 0.35 × raw R3).
#
# Settings: BENCH_RELAY_CAP (0.15 cores), BENCH_WORKER_CAP (0.25 cores),
# BENCH_SCALEOUT_PARTS ("relay worker
# cluster"), BENCH_WORKER_N (600), BENCH_WORKER_FIXTURE (png64k or
# text4k), and those of bench-relay.sh (BENCH_EVENTS, BENCH_NOTES,
# BENCH_RAW_RUNS for the cluster's raw runs, BENCH_WAIT_QUIET,
# BENCH_STRICT).

RELAY_CORES=${BENCH_RELAY_CAP:-0.15}
WORKER_CORES=${BENCH_WORKER_CAP:-0.25}
PARTS=${BENCH_SCALEOUT_PARTS:-relay worker cluster}
WORKER_N=${BENCH_WORKER_N:-600}
WORKER_FIXTURE=${BENCH_WORKER_FIXTURE:-png64k}
RESULTS=bench/results/scaleout-latest.txt
cores_arg() { [[ $2 =~ ^(0\.[0-9]*[1-9][0-9]*|1(\.0*)?)$ ]] || die "$1 must be a number of cores in (0, 1], got '$2'"; }
cores_arg BENCH_RELAY_CAP "$RELAY_CORES"
cores_arg BENCH_WORKER_CAP "$WORKER_CORES"
posint BENCH_WORKER_N "$WORKER_N"
case $WORKER_FIXTURE in png64k | text4k) ;; *) die "BENCH_WORKER_FIXTURE must be png64k or text4k, got '$WORKER_FIXTURE'" ;; esac
for p in $PARTS; do
	case $p in relay | worker | cluster) ;; *) die "BENCH_SCALEOUT_PARTS holds '$p'; use relay, worker and/or cluster" ;; esac
done
has_part() { [[ " $PARTS " == *" $1 "* ]]; }

cap_init
log "CPU cap: $RELAY_CORES cores per relay process, $WORKER_CORES per worker process, by $CAP_METHOD"
# worker is the last column, so relay_run's columns 4–6 stay relay, nats, pg.
ROLES="client api relay nats pg worker"
ROLE[$API_PID]=api
declare -A WORKER_RATE WORKER_DONE WORKER_METRICS WORKER_BATCH
WORKER_PIDS=()

# --- workers ------------------------------------------------------------------------
# start_workers N LABEL: N capped attachment-workers on the bench database
# and stream, sharing the durable consumer.
start_workers() {
	local i
	for ((i = 1; i <= $1; i++)); do
		cap_start "worker$i" "$WORKER_CORES" "$WORK/$2-worker$i.log" env DATABASE_URL="$BENCH_URL" NATS_URL="$NATS_URL" \
			QUILL_STREAM="$STREAM" QUILL_SUBJECT_PREFIX="$PREFIX" QUILL_ADMIN_ADDR=127.0.0.1:0 ./bin/attachment-worker run
		WORKER_PIDS+=("$CAPPED_PID")
		ROLE[$CAPPED_PID]=worker
		on_exit_stop "$CAPPED_PID"
	done
}
stop_workers() {
	stop_role worker "${WORKER_PIDS[@]}"
	WORKER_PIDS=()
}
# worker_metrics LABEL: "processed duplicates failed" summed over the
# workers' /metrics.
worker_metrics() {
	metrics_sum '$1 ~ /^quill_worker_messages_total\{/ {
			if ($1 ~ /result="processed"/) p += $2; else if ($1 ~ /result="duplicate"/) d += $2; else if ($1 ~ /result="(failed|dead_lettered)"/) f += $2 }
		END { printf "%d %d %d\n", p, d, f }' "$WORK/$1"-worker*.log
}

# worker_run N: a fresh backlog of WORKER_N attachments, drained by N capped
# workers. The rate is (attachments − 1) ÷ (last − first processed_at),
# the workers' own commit times: their start-up is outside it, as the
# relays' is outside the stream's span.
worker_run() {
	local n=$1 label="workers$1" j i left failed
	log "[workers] $n worker(s): $WORKER_N notes with a $WORKER_FIXTURE attachment through the API, published by one uncapped relay"
	relaybench reset --nats-url "$NATS_URL" --stream "$STREAM" >/dev/null
	psql_bench -c 'TRUNCATE notes, attachments, operations, outbox_events, quill_consumer_inbox, quill_consumer_dead_letters RESTART IDENTITY CASCADE'
	local cap=$RELAY_CAP
	RELAY_CAP=""
	start_relays 1 "$label-seed"
	RELAY_CAP=$cap
	./bin/loadgen --url "$API_URL" --token "$TOKEN" --mode seed --count "$WORKER_N" --attachment "$WORKER_FIXTURE" \
		--concurrency 8 --json >"$WORK/$label-seed.json" 2>"$WORK/$label-seed.err" ||
		die "loadgen seed failed: $(tail -3 "$WORK/$label-seed.err")"
	relaybench wait --nats-url "$NATS_URL" --database-url "$BENCH_URL" --stream "$STREAM" --count "$WORKER_N" --timeout 5m >/dev/null ||
		die "$label: the relay did not publish the $WORKER_N note.created events (logs in $WORK)"
	stop_relays
	psql_bench -c 'VACUUM ANALYZE attachments' -c CHECKPOINT
	quiet_phase
	log "[workers] $n worker(s): processing"
	cpu_window_start
	start_workers "$n" "$label"
	for ((i = 0; ; i++)); do
		read -r left failed < <(psql_bench -Atc "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed') FROM attachments" | tr '|' ' ')
		((left == 0)) && break
		((i < 6000)) || die "$label: $left attachments still pending after 10 minutes (logs in $WORK)"
		for p in "${WORKER_PIDS[@]}"; do kill -0 "$p" 2>/dev/null || die "$label: a worker exited (logs in $WORK)"; done
		sleep 0.1
	done
	cpu_window_end "$label" "$ROLES"
	WORKER_METRICS[$label]="$(worker_metrics "$label") $failed"
	THROTTLE[$label]=$(throttle_sum worker "$n")
	stop_workers
	j=$(psql_bench -Atc "SELECT count(*), extract(epoch FROM max(processed_at) - min(processed_at)) FROM attachments WHERE status = 'processed'" | tr '|' ' ')
	WORKER_DONE[$label]=${j%% *}
	WORKER_RATE[$label]=$(awk -v n="${j%% *}" -v s="${j##* }" 'BEGIN { if (s > 0) printf "%.1f", (n - 1) / s; else print "n/a" }')
	# The group commit's batches: attachment.processed events per transaction.
	WORKER_BATCH[$label]=$(psql_bench -Atc "SELECT round(count(*)::numeric / greatest(count(DISTINCT processed_at), 1), 1) FROM attachments WHERE status = 'processed'")
}

# --- a three-node cluster -------------------------------------------------------------
CLUSTER_PIDS=()
# free_port: a loopback TCP port nothing listens on (nor was handed out
# before in this run).
declare -A PORTS_TAKEN
free_port() {
	local p used
	used=$(ss -Htln 2>/dev/null | awk '{ n = split($4, a, ":"); print a[n] }')
	while :; do
		p=$((20000 + RANDOM % 40000))
		[[ -z ${PORTS_TAKEN[$p]:-} ]] && ! grep -qx "$p" <<<"$used" && break
	done
	PORTS_TAKEN[$p]=1
	echo "$p"
}
# start_cluster: three nats-server processes (n1..n3) on loopback, each
# with JetStream in a fresh store and routes to all three, from one
# generated config per node; sets NATS_URL to the comma-separated client
# URLs (what NATS_URL takes for a cluster).
start_cluster() {
	local i dir routes="" urls="" pid
	local -a cport rport
	for i in 1 2 3; do
		cport[i]=$(free_port)
		rport[i]=$(free_port)
		routes+="${routes:+, }\"nats-route://127.0.0.1:${rport[i]}\""
		urls+="${urls:+,}nats://127.0.0.1:${cport[i]}"
	done
	for i in 1 2 3; do
		dir="$WORK/cluster/n$i"
		mkdir -p "$dir/store"
		cat >"$dir/nats.conf" <<-EOF
			server_name: n$i
			host: 127.0.0.1
			port: ${cport[i]}
			jetstream { store_dir: "$dir/store" }
			cluster {
			  name: quill-bench
			  listen: 127.0.0.1:${rport[i]}
			  routes: [ $routes ]
			}
		EOF
		env -u GOMAXPROCS "$NATS_SERVER" -c "$dir/nats.conf" >"$dir/nats.log" 2>&1 &
		pid=$!
		CLUSTER_PIDS+=("$pid")
		ROLE[$pid]=nats
		on_exit_stop "$pid"
	done
	for i in 1 2 3; do
		wait_for_line "$WORK/cluster/n$i/nats.log" 'Server is ready' "${CLUSTER_PIDS[i - 1]}" 20 ||
			die "nats-server n$i did not start (see $WORK/cluster/n$i/nats.log)"
	done
	# JetStream answers only once every node knows the meta leader.
	for i in 1 2 3; do
		wait_for_line "$WORK/cluster/n$i/nats.log" 'new .*metadata leader' "${CLUSTER_PIDS[i - 1]}" 30 ||
			die "nats-server n$i found no JetStream meta leader (see $WORK/cluster/n$i/nats.log)"
	done
	NATS_URL=$urls
	log "NATS cluster quill-bench: n1..n3 (pids ${CLUSTER_PIDS[*]}) at $NATS_URL; configs in $WORK/cluster"
}
stop_cluster() {
	local p
	for p in "${CLUSTER_PIDS[@]}"; do
		stop_pid "$p"
		unset "ROLE[$p]"
	done
	CLUSTER_PIDS=()
}

# cluster_relay_run: one uncapped relay drains a fresh backlog into the R3
# stream. The relay is started on an empty outbox and the stream is then
# set to R3 (relaybench stream --replicas 3), before the backlog is
# written: until QUILL_STREAM_REPLICAS is supported, a relay's start-up
# provisioning sets the stream's replicas to 1, and the report states the
# replicas the stream had after the run. So this backlog is analysed
# (ANALYZE) while the relay already drains it, not vacuumed before.
cluster_relay_run() {
	local label=cluster-relays1 j
	log "[cluster] 1 relay on the R3 stream: $EVENTS events over $NOTES notes"
	relaybench reset --nats-url "$NATS_URL" --stream "$STREAM" >/dev/null
	psql_bench -c 'TRUNCATE outbox_events RESTART IDENTITY' -c 'VACUUM ANALYZE outbox_pending' -c CHECKPOINT
	relaybench stream --nats-url "$NATS_URL" --stream "$STREAM" --subject-prefix "$PREFIX" --replicas 3 >/dev/null ||
		die "relaybench stream --replicas 3 failed: no JetStream meta leader?"
	quiet_phase
	cpu_window_start
	start_relays 1 "$label"
	wait_for_line "$WORK/$label-relay1.log" '"listener":"admin"' "${RELAY_PIDS[0]}" 20 ||
		die "$label: the relay did not start (see $WORK/$label-relay1.log)"
	CLUSTER_STREAM=$(relaybench stream --nats-url "$NATS_URL" --stream "$STREAM" --subject-prefix "$PREFIX" --replicas 3) ||
		die "relaybench stream --replicas 3 failed"
	SEED=$(relaybench seed --database-url "$BENCH_URL" --count "$EVENTS" --notes "$NOTES" --tenant "$TENANT") ||
		die "relaybench seed failed"
	psql_bench -c 'ANALYZE outbox_events' -c 'ANALYZE outbox_pending'
	j=$(relaybench wait --nats-url "$NATS_URL" --database-url "$BENCH_URL" --stream "$STREAM" --count "$EVENTS") ||
		die "$label: the relay did not publish the backlog (logs in $WORK)"
	relays_drained "$label" 1 "$j"
	CLUSTER_REPLICAS_AFTER=$(jget "$(jobj "$j" stream)" replicas)
}

# --- the runs ---------------------------------------------------------------------------
if has_part relay || has_part worker; then
	start_nats default
fi
if has_part relay; then
	RELAY_CAP=$RELAY_CORES
	raw_run default
	relay_run default 1
	relay_run default 2
	RELAY_CAP=""
fi
if has_part worker; then
	worker_run 1
	worker_run 2
fi
if has_part relay || has_part worker; then
	stop_nats default
fi
if has_part cluster; then
	start_cluster
	RAW_ARGS=(--replicas 3)
	RELAY_ENV=(QUILL_STREAM_REPLICAS=3)
	raw_run cluster
	cluster_relay_run
	while ((${RAW_DONE[cluster]} < RAW_RUNS)); do raw_run cluster; done
	RAW_ARGS=()
	RELAY_ENV=()
	stop_cluster
fi

# --- report -----------------------------------------------------------------------------
# phase_cpu PHASE COLUMN: a phase's cores in a column of $WORK/cpu (2 client,
# 3 api, 4 relay, 5 nats, 6 pg, 7 worker, 8 other, 9 busy).
phase_cpu() { awk -v p="$1" -v c="$2" '$1 == p { print $c }' "$WORK/cpu"; }
# cap_line LABEL ROLE_COLUMN N CAP: "cores used (per process) of the cap;
# throttled periods".
cap_line() {
	local cores per tp tt cap=$4
	cores=$(phase_cpu "$1" "$2")
	per=$(awk -v c="$cores" -v n="$3" 'BEGIN { printf "%.3f", c / n }')
	read -r tp tt <<<"${THROTTLE[$1]:-- -}"
	printf '%s cores in all, %s per process (cap %s); throttled in %s of %s periods' "$cores" "$per" "$cap" "$tt" "$tp"
}
case $CAP_METHOD in
cgroup1) CAP_HOW="cgroup v1 cpu controller: one group per process under $CAP_V1 (quill-bench-relayN, quill-bench-workerN), cpu.cfs_period_us=$CAP_PERIOD_US, cpu.cfs_quota_us=$(cap_quota_us "$RELAY_CORES") (relays) / $(cap_quota_us "$WORKER_CORES") (workers); the process joins its group (cgroup.procs) before it execs; groups removed on exit" ;;
cgroup2) CAP_HOW="cgroup v2: one group per process under $CAP_V2 (quill-bench-relayN, quill-bench-workerN), cpu.max \"QUOTA $CAP_PERIOD_US\" with QUOTA $(cap_quota_us "$RELAY_CORES") (relays) / $(cap_quota_us "$WORKER_CORES") (workers); the process joins its group before it execs; groups removed on exit" ;;
systemd) CAP_HOW="systemd-run --scope -p CPUQuota=P% per process" ;;
esac

{
	echo "Quill bench-relay scale-out (BENCH_RELAY_SCALEOUT=1) — $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	host_line
	pg_line synchronous_commit fsync shared_buffers autovacuum
	echo "nats-server $NATS_SERVER_VERSION (built from go.mod), fresh file stores; single server at its defaults; cluster: 3 processes on loopback, routes between all, JetStream on each"
	echo "CPU cap: $RELAY_CORES cores per relay process, $WORKER_CORES per worker process, by $CAP_HOW"
	echo "uncapped: PostgreSQL, nats-server, the API, the clients, the relay that publishes the workers' backlog and the relay of the cluster run"
	echo "relay: its fixed batch of $RELAY_BATCH events; before the start, $BG_START of $NCPU cores were busy with other work$QUIET_NOTE; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo
	echo "Targets:"
	if has_part relay; then
		raw=$(median "${RAW_RATES[default]}")
		r1=${RELAY_RATE[default-relays1]} r2=${RELAY_RATE[default-relays2]} x=$(ratio "${RELAY_RATE[default-relays2]}" "${RELAY_RATE[default-relays1]}")
		check ge "$x" 1.8
		printf '  2 capped relays ≥ 1.8 × 1 capped relay: %s/s vs %s/s = %s× (%s)\n' "$(int "$r2")" "$(int "$r1")" "$x" "$VERDICT"
	fi
	if has_part worker; then
		w1=${WORKER_RATE[workers1]} w2=${WORKER_RATE[workers2]} x=$(ratio "${WORKER_RATE[workers2]}" "${WORKER_RATE[workers1]}")
		check ge "$x" 1.8
		printf '  2 capped workers ≥ 1.8 × 1 capped worker (%s): %s/s vs %s/s = %s× (%s)\n' "$WORKER_FIXTURE" "$w2" "$w1" "$x" "$VERDICT"
	fi
	if has_part cluster; then
		craw=$(median "${RAW_RATES[cluster]}")
		cr=${RELAY_RATE[cluster-relays1]} x=$(ratio "${RELAY_RATE[cluster-relays1]}" "$craw")
		check ge "$x" 0.35
		[[ $CLUSTER_REPLICAS_AFTER == 3 ]] || VERDICT="$VERDICT — but the stream had $CLUSTER_REPLICAS_AFTER replica(s) after the run, so this is not an R3 figure"
		printf '  1 relay on an R3 stream ≥ 0.35 × raw R3 async publishing: %s/s vs %s/s = %s× (%s)\n' "$(int "$cr")" "$(int "$craw")" "$x" "$VERDICT"
	fi
	echo
	if has_part relay; then
		echo "Relays, each held to $RELAY_CORES cores, draining $(jget "$SEED" events) events over $NOTES notes into one nats-server (events/s, first to last stored):"
		printf '  raw (uncapped client, for reference) %s/s; 1 relay %s/s (%s × raw); 2 relays %s/s (%s × raw)\n' "$(int "$raw")" "$(int "$r1")" \
			"$(ratio "$r1" "$raw")" "$(int "$r2")" "$(ratio "$r2" "$raw")"
		for n in 1 2; do
			l="default-relays$n"
			read -r pub dup err <<<"${RELAY_METRICS[$l]}"
			read -r ur un up <<<"${RELAY_CPU_US[$l]}"
			printf '  %d relay(s): %s; stream holds %s; published %s (duplicates %s, errors %s); all marked after %ss; CPU µs/event: relay %s, nats %s, postgres %s\n' \
				"$n" "$(cap_line "$l" 4 "$n" "$RELAY_CORES")" "${RELAY_MSGS[$l]}" "$pub" "$dup" "$err" "${RELAY_MARKED[$l]}" "$ur" "$un" "$up"
		done
		echo
	fi
	if has_part worker; then
		echo "Workers, each held to $WORKER_CORES cores, processing $WORKER_N $WORKER_FIXTURE attachments (one durable consumer; attachments/s, first to last processed_at):"
		for n in 1 2; do
			l="workers$n"
			read -r pr du fa fdb <<<"${WORKER_METRICS[$l]}"
			printf '  %d worker(s): %s/s; %s; processed %s of %s (metrics: processed %s, duplicates %s, failed %s); %s events per transaction\n' \
				"$n" "${WORKER_RATE[$l]}" "$(cap_line "$l" 7 "$n" "$WORKER_CORES")" "${WORKER_DONE[$l]}" "$WORKER_N" "$pr" "$du" "$((fa + fdb))" "${WORKER_BATCH[$l]}"
		done
		echo
	fi
	if has_part cluster; then
		echo "Three-node cluster, R3 stream (file storage, Duplicates 10m, MaxAge 168h), relay uncapped, NATS_URL = the three client URLs:"
		printf '  raw R3 runs %s/s (median %s); 1 relay %s/s; stream after the run: %s replica(s), %s messages; set to R3 after the relay started: %s\n' \
			"$(for v in ${RAW_RATES[cluster]}; do int "$v"; done | paste -sd' ')" "$(int "$craw")" "$(int "$cr")" "$CLUSTER_REPLICAS_AFTER" \
			"${RELAY_MSGS[cluster-relays1]}" "$CLUSTER_STREAM"
		read -r pub dup err <<<"${RELAY_METRICS[cluster-relays1]}"
		printf '  relay published %s (duplicates %s, errors %s); all marked after %ss; raw errors %s\n' "$pub" "$dup" "$err" \
			"${RELAY_MARKED[cluster-relays1]}" "${RAW_ERR[cluster]}"
		echo "  (started on an empty outbox, the stream then set to R3, then the backlog written and ANALYZEd while the relay drained it; the CPU window includes that COPY)"
		echo
	fi
	echo "CPU, cores used inside each measured window (of $NCPU): client = relaybench raw (its own account); nats = every"
	echo "nats-server process; postgres = $BENCH_DB's backends + background processes; other = busy − the rest (kernel"
	echo "loopback networking, the scripts' polling, anything else running on the machine)"
	cpu_table 16 client api relay nats postgres worker other busy
	warn_lost_events
	for l in "${!WORKER_DONE[@]}"; do
		if [[ ${WORKER_DONE[$l]} != "$WORKER_N" ]]; then
			echo "  WARNING: $l: ${WORKER_DONE[$l]} attachments processed, not $WORKER_N"
		fi
	done
	cpu_warn_busy
} >"$WORK/report.txt"

publish_report "$RESULTS"
