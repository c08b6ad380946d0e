#!/usr/bin/env bash
# ensure-playwright.sh: make sure the operator console's browser tests can
# run — Debian's Chromium and the npm package playwright-core (the
# Playwright library without its bundled browsers) — and print the
# node_modules directory to give node as NODE_PATH.
#
# playwright-core is installed once, with npm, into a cache directory outside
# the clone (PLAYWRIGHT_DIR, default ~/.cache/quill/playwright-core-<version>).
# Chromium is installed with apt-get when missing and run as root; otherwise
# the script says what to install and exits 1. e2e/console_test.go runs it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

# Pinned: the browser tests' behaviour must not change with a release.
VERSION=1.65.1
DIR=${PLAYWRIGHT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quill/playwright-core-$VERSION}

if ! command -v chromium >/dev/null 2>&1; then
	[[ $(id -u) == 0 ]] || die "chromium is not installed (apt-get install -y chromium); the console's browser tests drive it"
	log "installing Debian's chromium (once)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 ||
		{ DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } ||
		die "apt-get could not install chromium"
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	[[ $(id -u) == 0 ]] || die "node and npm are not installed (apt-get install -y nodejs npm); they run Playwright"
	log "installing node and npm (once)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null 2>&1 || die "apt-get could not install nodejs and npm"
fi

installed() { [[ -f $DIR/node_modules/playwright-core/package.json ]]; }
if ! installed; then
	mkdir -p "$(dirname "$DIR")"
	# Into a temporary directory, then moved: an interrupted install is
	# never taken for a complete one.
	tmp=$(mktemp -d "$DIR.tmp.XXXXXX")
	trap 'rm -rf "$tmp" "$tmp.log"' EXIT
	log "installing playwright-core@$VERSION into $DIR (once)"
	if ! PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$tmp" --no-audit --no-fund --no-save --ignore-scripts --loglevel=error \
		"playwright-core@$VERSION" >"$tmp.log" 2>&1; then
		reason=$(grep -m1 -iE 'npm (error|ERR!) (code|network|[a-z])' "$tmp.log" || tail -n1 "$tmp.log")
		die "cannot install playwright-core@$VERSION with npm (is the npm registry reachable?): ${reason:-npm failed}"
	fi
	rm -rf "$DIR"
	mv "$tmp" "$DIR"
	trap - EXIT
	installed || die "npm reported success but $DIR/node_modules/playwright-core is missing"
fi
echo "$DIR/node_modules"
