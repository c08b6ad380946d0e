#!/usr/bin/env bash
# ensure-postgres.sh: make sure a PostgreSQL server answers at the host and
# port of $DATABASE_URL (default postgres://postgres@127.0.0.1:5432/quill),
# starting or installing one when it is local and not running. Idempotent:
# when PostgreSQL already answers it changes nothing.
#
# In order of preference, when nothing answers:
#   1. a Debian cluster is configured for the URL's port (/etc/postgresql/
#      VERSION/NAME): start it (as root or as the cluster's owner, as
#      pg_ctlcluster requires);
#   2. root, PostgreSQL not installed: apt-get install postgresql (its
#      cluster is used when it is on the URL's port);
#   (1 and 2 as root: make sure TCP connections from 127.0.0.1 and ::1 are
#    trusted, as on the project's machines, so the default URL works);
#   3. otherwise, from the machine's server binaries
#      (/usr/lib/postgresql/*/bin/initdb): a private cluster in
#      ./.data/postgres (trust auth, superuser postgres; as root it runs as
#      the postgres user), on the URL's host and port if the port is free
#      (TCP only, no socket). It keeps its data across restarts.
# It prints one line saying what it did, then waits (30 s) for pg_isready.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
REPO_ROOT=$PWD

DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/quill?sslmode=disable}
WAIT_SECONDS=${ENSURE_POSTGRES_TIMEOUT:-30}
PRIVATE_DIR=$REPO_ROOT/.data/postgres

# --- host, port and user from DATABASE_URL -----------------------------------
# postgres[ql]://[user[:password]@][host][:port][/db][?params]
parse_url() {
	local rest=${DATABASE_URL#*://}
	rest=${rest%%[/?]*} # authority: [userinfo@]host[:port]
	local userinfo=""
	if [[ $rest == *@* ]]; then
		userinfo=${rest%@*}
		rest=${rest##*@}
	fi
	PG_USER=${userinfo%%:*}
	PG_USER=${PG_USER:-postgres}
	if [[ $rest =~ ^\[([^]]+)\](:([0-9]+))?$ ]]; then # [ipv6]:port
		PG_HOST=${BASH_REMATCH[1]}
		PG_PORT=${BASH_REMATCH[3]}
	elif [[ $rest =~ ^([^:]*)(:([0-9]+))?$ ]]; then
		PG_HOST=${BASH_REMATCH[1]}
		PG_PORT=${BASH_REMATCH[3]}
	else
		die "cannot parse host and port from DATABASE_URL"
	fi
	PG_HOST=${PG_HOST:-127.0.0.1}
	PG_PORT=${PG_PORT:-5432}
	# A multi-host URL (h1:p1,h2:p2): use the first one.
	PG_HOST=${PG_HOST%%,*}
}
parse_url

is_local_host() {
	case $PG_HOST in
	127.* | localhost | ::1 | /*) return 0 ;;
	*) return 1 ;;
	esac
}

# The host to connect to locally (a socket directory is used as is).
connect_host() {
	case $PG_HOST in
	localhost) echo 127.0.0.1 ;;
	*) echo "$PG_HOST" ;;
	esac
}

# pg_isready, from PATH or from the newest installed server version; looked
# up when needed, as it may come with the package this script installs.
PG_ISREADY=""

# 0 = accepting connections, 1 = rejecting (e.g. starting up), 2 = no answer.
pg_status() {
	if [[ -n $PG_ISREADY ]] || PG_ISREADY=$(pg_tool pg_isready); then
		local rc=0
		"$PG_ISREADY" -q -h "$(connect_host)" -p "$PG_PORT" -U "$PG_USER" -t 3 || rc=$?
		return "$rc"
	fi
	# No client at all: a TCP answer is the best we can tell.
	if tcp_open "$(connect_host)" "$PG_PORT"; then return 0; fi
	return 2
}

wait_ready() {
	local i
	for ((i = 0; i < WAIT_SECONDS * 2; i++)); do
		if pg_status; then return 0; fi
		sleep 0.5
	done
	return 1
}

finish() { # message
	if wait_ready; then
		log "$1; PostgreSQL is ready at $PG_HOST:$PG_PORT"
		exit 0
	fi
	die "$1, but PostgreSQL did not accept connections at $PG_HOST:$PG_PORT within ${WAIT_SECONDS}s${2:+ (see $2)}"
}

# --- already running? -----------------------------------------------------------
rc=0
pg_status || rc=$?
if ((rc == 0)); then
	log "PostgreSQL already running at $PG_HOST:$PG_PORT; nothing to do"
	exit 0
fi
if ((rc == 1)); then
	# Answers but is not accepting yet (starting up, or recovering).
	finish "PostgreSQL at $PG_HOST:$PG_PORT is starting; waited for it"
fi
if ! is_local_host; then
	die "PostgreSQL at $PG_HOST:$PG_PORT (from DATABASE_URL) does not answer, and it is not a local address this script could start"
fi

IS_ROOT=false
[[ $(id -u) == 0 ]] && IS_ROOT=true

# Debian clusters as "VERSION NAME PORT", from pg_lsclusters or /etc/postgresql.
debian_clusters() {
	if command -v pg_lsclusters >/dev/null 2>&1; then
		pg_lsclusters --no-header 2>/dev/null | awk '{print $1, $2, $3}'
		return 0
	fi
	local conf ver name port
	for conf in /etc/postgresql/*/*/postgresql.conf; do
		[[ -f $conf ]] || continue
		ver=$(basename "$(dirname "$(dirname "$conf")")")
		name=$(basename "$(dirname "$conf")")
		port=$(sed -n 's/^[[:space:]]*port[[:space:]]*=[[:space:]]*\([0-9]\+\).*/\1/p' "$conf" | tail -1)
		echo "$ver $name ${port:-5432}"
	done
}

# The cluster to start: the Debian cluster configured for our port, if any.
pick_cluster() {
	local clusters
	clusters=$(debian_clusters)
	[[ -n $clusters ]] || return 1
	local line
	line=$(awk -v p="$PG_PORT" '$3 == p {print; exit}' <<<"$clusters")
	[[ -n $line ]] || return 1
	read -r CL_VER CL_NAME CL_PORT <<<"$line"
}

# Trust TCP connections from the loopback addresses (first match wins in
# pg_hba.conf, so the lines go on top). Marked, so it is done once.
HBA_MARK="# quill scripts/ensure-postgres.sh: trust loopback TCP"
ensure_trust() { # version name
	local hba=/etc/postgresql/$1/$2/pg_hba.conf
	[[ -f $hba ]] || return 1
	grep -qF "$HBA_MARK" "$hba" && return 1
	local tmp
	tmp=$(mktemp)
	{
		echo "$HBA_MARK"
		echo "host    all             all             127.0.0.1/32            trust"
		echo "host    all             all             ::1/128                 trust"
		echo
		cat "$hba"
	} >"$tmp"
	cat "$tmp" >"$hba" # keeps the file's owner and mode
	rm -f "$tmp"
	return 0
}

# Can we log in over TCP? (Needs psql; assume yes without it.)
can_login() {
	local psql
	psql=$(command -v psql 2>/dev/null || true)
	[[ -n $psql ]] || return 0
	PGCONNECT_TIMEOUT=3 "$psql" -w -h "$(connect_host)" -p "$PG_PORT" -U "$PG_USER" -d postgres \
		-tAc 'select 1' >/dev/null 2>&1
}

start_debian_cluster() { # what-we-did
	local did=$1 rc=0
	[[ $CL_PORT == "$PG_PORT" ]] ||
		log "warning: cluster $CL_VER/$CL_NAME is configured for port $CL_PORT, not $PG_PORT"
	pg_status || rc=$?
	if ((rc == 2)); then
		if pg_ctlcluster "$CL_VER" "$CL_NAME" status >/dev/null 2>&1; then
			die "Debian cluster $CL_VER/$CL_NAME is running (port $CL_PORT) but does not answer at $PG_HOST:$PG_PORT; check port and listen_addresses in /etc/postgresql/$CL_VER/$CL_NAME/postgresql.conf, or DATABASE_URL"
		fi
		pg_ctlcluster --skip-systemctl-redirect "$CL_VER" "$CL_NAME" start >/dev/null 2>&1 ||
			die "pg_ctlcluster could not start cluster $CL_VER/$CL_NAME (see /var/log/postgresql/postgresql-$CL_VER-$CL_NAME.log)"
	fi
	if ! wait_ready; then
		die "$did, but PostgreSQL did not accept connections at $PG_HOST:$PG_PORT within ${WAIT_SECONDS}s (see /var/log/postgresql/postgresql-$CL_VER-$CL_NAME.log)"
	fi
	# A fresh Debian cluster authenticates TCP with scram: the project's
	# default URL has no password, so trust the loopback addresses.
	if ! can_login && ensure_trust "$CL_VER" "$CL_NAME"; then
		pg_ctlcluster --skip-systemctl-redirect "$CL_VER" "$CL_NAME" reload >/dev/null
		did="$did, trusted loopback TCP in pg_hba.conf"
	fi
	finish "$did"
}

# --- 1. a Debian cluster exists -------------------------------------------------
if $IS_ROOT && pick_cluster; then
	start_debian_cluster "started Debian cluster $CL_VER/$CL_NAME"
fi

# Not root, but the owner of a Debian cluster (the postgres user): start it.
if ! $IS_ROOT && pick_cluster && [[ -O /var/lib/postgresql/$CL_VER/$CL_NAME ]]; then
	start_debian_cluster "started Debian cluster $CL_VER/$CL_NAME"
fi

# --- 2. nothing installed, root: install it -----------------------------------
initdb_bin() { pg_server_tool initdb; }

if $IS_ROOT && [[ -z $(initdb_bin) ]]; then
	log "PostgreSQL is not installed; installing Debian's postgresql package"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null
	apt-get install -y -qq postgresql >/dev/null
	[[ -n $(initdb_bin) ]] || die "apt-get installed postgresql but no initdb is in /usr/lib/postgresql/*/bin"
	# The package creates and starts a cluster on 5432: if that is our
	# port, it is the one to use.
	if pick_cluster; then
		start_debian_cluster "installed postgresql and started cluster $CL_VER/$CL_NAME"
	fi
fi

# --- 3. a private cluster in ./.data/postgres -----------------------------------
# The server refuses to run as root: as root, the cluster belongs to the
# postgres user the package created.
INITDB=$(initdb_bin) ||
	die "nothing answers at $PG_HOST:$PG_PORT and PostgreSQL is not installed; as root this script installs it (apt-get install postgresql)"
BINDIR=$(dirname "$INITDB")

if tcp_open "$(connect_host)" "$PG_PORT"; then
	die "port $PG_PORT on $PG_HOST is taken by something that is not a ready PostgreSQL; free it or set DATABASE_URL"
fi
if [[ $PG_HOST == /* ]]; then
	die "DATABASE_URL names a socket directory ($PG_HOST); a private cluster listens on 127.0.0.1, so use host 127.0.0.1"
fi

AS=()
mkdir -p "$PRIVATE_DIR"
touch "$REPO_ROOT/.data/postgres.log"
if $IS_ROOT; then
	id -u postgres >/dev/null 2>&1 ||
		die "running as root, and there is no postgres user to own a private cluster (apt-get install postgresql creates it)"
	chown postgres: "$PRIVATE_DIR" "$REPO_ROOT/.data/postgres.log"
	chmod 0700 "$PRIVATE_DIR"
	runuser -u postgres -- test -w "$PRIVATE_DIR" ||
		die "the postgres user cannot reach $PRIVATE_DIR (a parent directory is closed to it); start a PostgreSQL yourself and set DATABASE_URL"
	AS=(runuser -u postgres --)
fi

did=""
if [[ ! -f $PRIVATE_DIR/PG_VERSION ]]; then
	"${AS[@]}" "$INITDB" -D "$PRIVATE_DIR" --auth=trust -U postgres -E UTF8 --locale=C.UTF-8 >"$REPO_ROOT/.data/initdb.log" 2>&1 ||
		"${AS[@]}" "$INITDB" -D "$PRIVATE_DIR" --auth=trust -U postgres -E UTF8 --no-locale >"$REPO_ROOT/.data/initdb.log" 2>&1 ||
		die "initdb failed (see .data/initdb.log)"
	did="created a private cluster in .data/postgres and "
fi
[[ $PG_USER == postgres ]] ||
	log "warning: the private cluster's superuser is postgres; DATABASE_URL uses $PG_USER"

listen=$(connect_host)
"${AS[@]}" "$BINDIR/pg_ctl" -D "$PRIVATE_DIR" -l "$REPO_ROOT/.data/postgres.log" -w -t "$WAIT_SECONDS" \
	-o "-p $PG_PORT -c listen_addresses=$listen -c unix_socket_directories=''" \
	start >/dev/null 2>&1 || die "pg_ctl could not start the private cluster (see .data/postgres.log)"
finish "${did}started it with $BINDIR/postgres on $listen:$PG_PORT" ".data/postgres.log"
