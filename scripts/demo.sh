#!/usr/bin/env bash
# make demo: the article's story against the running system (start it with
# make dev in another terminal). Uses QUILL_TOKEN when set, otherwise creates
# a token for the tenant "demo" with api token create (same DATABASE_URL as
# make dev).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

build_bins ./cmd/api ./tools/demo
if [[ -z ${QUILL_TOKEN:-} ]]; then
	QUILL_TOKEN=$(./bin/api token create --tenant demo)
	export QUILL_TOKEN
fi
exec ./bin/demo "$@"
