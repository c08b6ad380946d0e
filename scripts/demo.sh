#!/usr/bin/env bash
# make demo: the article's story against the running system (start it with
# make dev in another terminal), then a webhook delivered to a receiver on
# this machine that verifies it with the Standard Webhooks project's npm
# package (e2e/webhookreceiver/demo.mjs). Uses QUILL_TOKEN when set,
# otherwise creates a token for the tenant "demo" with api token create
# (same DATABASE_URL as make dev). The webhook part needs node and npm;
# QUILL_DEMO_WEBHOOKS=false skips it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

build_bins ./cmd/api ./tools/demo
if [[ -z ${QUILL_TOKEN:-} ]]; then
	QUILL_TOKEN=$(./bin/api token create --tenant demo)
	export QUILL_TOKEN
fi
./bin/demo "$@"

[[ ${QUILL_DEMO_WEBHOOKS:-true} == true ]] || exit 0
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 ||
	die "the webhook part needs node and npm (apt-get install -y nodejs npm), or set QUILL_DEMO_WEBHOOKS=false"

# The receiver's packages, installed as internal/webhooktest installs them:
# npm ci when node_modules does not match package-lock.json (the stamp is
# the lock's SHA-256, written last).
receiver=e2e/webhookreceiver
stamp=$receiver/node_modules/.quill-lock-sha256
want=$(sha256sum "$receiver/package-lock.json" | cut -d' ' -f1)
if [[ ! -f $stamp || $(<"$stamp") != "$want" ]]; then
	log "installing the webhook receiver's packages (npm ci in $receiver)"
	(cd "$receiver" && npm ci --no-audit --no-fund --ignore-scripts --prefer-offline --loglevel=error) >&2 ||
		die "npm ci in $receiver failed (is the npm registry reachable, or npm's cache filled?)"
	echo "$want" >"$stamp"
fi
echo
exec node "$receiver/demo.mjs"
