#!/usr/bin/env bash
# ensure-nats.sh: make sure a NATS server with JetStream answers at the host
# and port of $NATS_URL (default nats://127.0.0.1:4222). Idempotent: when
# something already listens there it changes nothing.
#
# Otherwise it starts, in the background, with JetStream storing in ./.data/nats
# (so streams survive a restart) and logging to ./.data/nats.log:
#   1. the nats-server pinned in go.mod (a `tool` of this module), built with
#      go into ./.data/bin and kept there for the next run, else
#   2. nats-server from PATH (a machine without go).
# It prints one line saying what it did, then waits (30 s) for the port.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
WAIT_SECONDS=${ENSURE_NATS_TIMEOUT:-30}
DATA_DIR=$PWD/.data
STORE_DIR=$DATA_DIR/nats
LOG_FILE=$DATA_DIR/nats.log

# nats://[user[:pass]@]host[:port][,nats://...]: the first server's host and port.
url=${NATS_URL%%,*}
url=${url#*://}
url=${url##*@}
url=${url%%/*}
if [[ $url =~ ^\[([^]]+)\](:([0-9]+))?$ ]] || [[ $url =~ ^([^:]*)(:([0-9]+))?$ ]]; then
	HOST=${BASH_REMATCH[1]:-127.0.0.1}
	PORT=${BASH_REMATCH[3]:-4222}
else
	die "cannot parse host and port from NATS_URL=$NATS_URL"
fi
[[ $HOST == localhost ]] && HOST=127.0.0.1

listening() { tcp_open "$HOST" "$PORT"; }

if listening; then
	log "NATS already listening at $HOST:$PORT; nothing to do"
	exit 0
fi
case $HOST in
127.* | ::1) ;;
*) die "NATS at $HOST:$PORT (from NATS_URL) does not answer, and it is not a local address this script could start" ;;
esac

mkdir -p "$STORE_DIR"

if command -v "$GO" >/dev/null 2>&1; then
	# The version go.mod pins, so that dev, CI and the tests' in-process
	# server are the same nats-server; built in the foreground, so that
	# compiling does not eat the start-up wait.
	nats_server_bin
	SERVER=$NATS_SERVER
	if $NATS_SERVER_BUILT; then
		did="built nats-server $NATS_SERVER_VERSION (pinned in go.mod) into .data/bin and started it"
	else
		did="started .data/bin/nats-server $NATS_SERVER_VERSION (the module's tool)"
	fi
elif command -v nats-server >/dev/null 2>&1; then
	SERVER=$(command -v nats-server)
	did="started $SERVER (no go on PATH to build the pinned one)"
else
	die "nothing listens at $HOST:$PORT, and there is neither go (to build the nats-server pinned in go.mod) nor nats-server on PATH"
fi

# Detached from this shell (its own session, no stdin), so that it outlives
# the script and the CI step that ran it.
setsid "$SERVER" -js -sd "$STORE_DIR" -a "$HOST" -p "$PORT" >>"$LOG_FILE" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$DATA_DIR/nats.pid"

for ((i = 0; i < WAIT_SECONDS * 4; i++)); do
	if listening; then
		log "$did (pid $pid, JetStream in .data/nats, log .data/nats.log); NATS is ready at $HOST:$PORT"
		exit 0
	fi
	if ! kill -0 "$pid" 2>/dev/null; then
		die "$SERVER exited at start-up; last lines of .data/nats.log: $(tail -n 5 "$LOG_FILE" | tr '\n' ' ')"
	fi
	sleep 0.25
done
die "$did, but nothing listened at $HOST:$PORT within ${WAIT_SECONDS}s (see .data/nats.log)"
