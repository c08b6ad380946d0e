#!/usr/bin/env bash
# make dev: run the whole system locally — PostgreSQL and NATS (started when
# none answers), migrations, a token for the tenant "demo", then the API, the
# relay, the attachment worker and the webhook dispatcher side by side. Their JSON logs are shown one
# readable line each (tools/devlog); QUILL_DEV_LOG=json shows the raw JSON.
# Ctrl-C stops them all; each finishes its in-flight work first. State lives
# in PostgreSQL and, when this script started NATS, in ./.data/nats, so a
# restart of make dev keeps every note, key and stream.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

bash scripts/ensure-postgres.sh
bash scripts/ensure-nats.sh
build_bins ./cmd/... ./tools/devlog

logs() {
	if [[ ${QUILL_DEV_LOG:-} == json ]]; then cat; else ./bin/devlog; fi
}
./bin/api migrate 2> >(logs >&2)

# The key that seals the webhook endpoints' secrets (the API seals, the
# dispatcher opens; docs/webhooks.md). Yours when QUILL_WEBHOOK_SECRET_KEY
# is set; otherwise one generated for this database on the first run and
# kept in the git-ignored .data/, so a restart opens the secrets sealed
# before it — and outside the database, so its copy still cannot sign
# (decision 0086).
if [[ -z ${QUILL_WEBHOOK_SECRET_KEY:-} ]]; then
	db_id=$(sed 's|^[a-z]*://||; s|^[^@]*@||; s|?.*||; s|[^A-Za-z0-9._-]|_|g' <<<"${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/quill?sslmode=disable}")
	key_file=.data/dev/webhook-secret-key.$db_id
	if [[ ! -s $key_file ]]; then
		mkdir -p .data/dev
		(umask 077 && head -c 32 /dev/urandom | base64 >"$key_file")
		log "generated a webhook secret key for $db_id in $key_file"
	fi
	QUILL_WEBHOOK_SECRET_KEY=$(<"$key_file")
fi
export QUILL_WEBHOOK_SECRET_KEY
# Development delivers to receivers on this machine (http://127.0.0.1:…),
# which production refuses.
export QUILL_WEBHOOK_ALLOW_PRIVATE=${QUILL_WEBHOOK_ALLOW_PRIVATE:-true}
token=$(./bin/api token create --tenant demo)
cat <<TXT

  Quill is starting.  API:   http://127.0.0.1:8080   (admin :9090)
                      console: http://127.0.0.1:9090/console/
                        (sign in with: ./bin/api token create --operator --name you)
                      relay: admin http://127.0.0.1:9091/metrics
                      attachment-worker: admin http://127.0.0.1:9092/metrics
                      webhook-dispatcher: admin http://127.0.0.1:9093/metrics
  Demo tenant token:  export QUILL_TOKEN=$token

  curl -s localhost:8080/v1/notes -H "Authorization: Bearer \$QUILL_TOKEN" \\
       -H 'Content-Type: application/json' -H 'Idempotency-Key: my-first-note' \\
       -d '{"title":"Hello"}'

TXT

pids=()
stop() {
	trap - INT TERM EXIT
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait || true
}
trap stop INT TERM EXIT

# The console is off by default; make dev turns it on (plain HTTP on
# :9090, for this machine only).
QUILL_CONSOLE=true ./bin/api serve 2> >(logs >&2) &
pids+=($!)
./bin/relay run 2> >(logs >&2) &
pids+=($!)
./bin/attachment-worker run 2> >(logs >&2) &
pids+=($!)
./bin/webhook-dispatcher run 2> >(logs >&2) &
pids+=($!)
# Stop everything as soon as one process exits.
wait -n
