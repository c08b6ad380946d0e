#!/usr/bin/env bash
# ensure-pgbouncer.sh: make sure the pgbouncer binary is installed, for the
# tests that run the API and the worker through PgBouncer in transaction
# pooling mode (internal/dbtest starts one per test on a free loopback port;
# nothing here starts a server). Idempotent: when pgbouncer is on PATH (or in
# /usr/sbin) it changes nothing.
#
# As root it installs Debian's pgbouncer package with apt-get (the package's
# own service is not used and not started by the tests); otherwise it says
# how to install it and fails, since the tests need it under CI=true (and
# skip without it otherwise).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

pgbouncer_bin() { command -v pgbouncer 2>/dev/null || { [[ -x /usr/sbin/pgbouncer ]] && echo /usr/sbin/pgbouncer; }; }

if bin=$(pgbouncer_bin); then
	log "$("$bin" --version | head -1) already installed at $bin; nothing to do"
	exit 0
fi

[[ $(id -u) == 0 ]] ||
	die "pgbouncer is not installed; install it as root (apt-get install -y pgbouncer), then run this again"

command -v apt-get >/dev/null 2>&1 ||
	die "pgbouncer is not installed and there is no apt-get; install PgBouncer (1.18 or later) from your system's packages"

log "pgbouncer is not installed; installing Debian's pgbouncer package"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq pgbouncer >/dev/null
bin=$(pgbouncer_bin) || die "apt-get installed pgbouncer but no pgbouncer binary is on PATH or in /usr/sbin"
log "installed $("$bin" --version | head -1) at $bin"
