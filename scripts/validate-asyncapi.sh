#!/usr/bin/env bash
# validate-asyncapi.sh: validate api/asyncapi.yaml with the AsyncAPI project's
# own parser (npm package @asyncapi/parser, which runs the AsyncAPI Spectral
# ruleset), its $refs to api/schemas/*.json resolved. Exits 1 on any
# diagnostic of severity error and prints the warnings; `make lint` runs it.
#
# The parser is installed once, with npm, into a cache directory outside the
# clone (ASYNCAPI_PARSER_DIR, default ~/.cache/quill/asyncapi-parser-<version>),
# so a fresh clone on the same machine validates offline. Needs node and npm
# (apt-get install -y nodejs npm); .ci/run installs them when missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

# The version is pinned: a new parser release may bring new rules, and a lint
# that changes verdict on its own is not a lint.
PARSER_VERSION=3.6.6
DOC=${1:-api/asyncapi.yaml}
DIR=${ASYNCAPI_PARSER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quill/asyncapi-parser-$PARSER_VERSION}

[[ -f $DOC ]] || die "no such document: $DOC"
command -v node >/dev/null 2>&1 || die "node is not installed (apt-get install -y nodejs npm); it runs the AsyncAPI parser"

installed() { [[ -f $DIR/node_modules/@asyncapi/parser/package.json ]]; }

if ! installed; then
	command -v npm >/dev/null 2>&1 || die "npm is not installed (apt-get install -y npm); it installs @asyncapi/parser@$PARSER_VERSION once"
	mkdir -p "$(dirname "$DIR")"
	# Installed into a temporary directory and moved into place, so an
	# interrupted install is never taken for a complete one.
	tmp=$(mktemp -d "$DIR.tmp.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	npmlog=$tmp.log
	log "installing @asyncapi/parser@$PARSER_VERSION into $DIR (once)"
	# --ignore-scripts: nothing the parser needs runs at install (a
	# dependency's postinstall only sends analytics).
	if ! npm install --prefix "$tmp" --no-audit --no-fund --no-save --ignore-scripts --loglevel=error \
		"@asyncapi/parser@$PARSER_VERSION" >"$npmlog" 2>&1; then
		reason=$(grep -m1 -iE 'npm (error|ERR!) (code|network|[a-z])' "$npmlog" || tail -n1 "$npmlog")
		rm -f "$npmlog"
		die "cannot install @asyncapi/parser@$PARSER_VERSION with npm (is the npm registry reachable?): ${reason:-npm failed}"
	fi
	rm -f "$npmlog"
	rm -rf "$DIR"
	mv "$tmp" "$DIR"
	trap - EXIT
	installed || die "npm reported success but $DIR/node_modules/@asyncapi/parser is missing"
fi

# fromFile gives the parser the document's path, against which it resolves
# relative $refs (schemas/<type>.json). Severity 0 is error, 1 warning, 2
# information, 3 hint.
NODE_PATH=$DIR/node_modules node - "$DOC" <<'EOF'
const { Parser, fromFile } = require('@asyncapi/parser');
const path = require('node:path');

const doc = path.resolve(process.argv[2]);
const names = ['error', 'warning', 'information', 'hint'];

(async () => {
  const { document, diagnostics } = await fromFile(new Parser(), doc).parse();
  let errors = 0;
  for (const d of diagnostics) {
    if (d.severity > 1) continue;
    if (d.severity === 0) errors++;
    const where = d.range ? `:${d.range.start.line + 1}` : '';
    const at = d.path && d.path.length ? ` at ${d.path.join('.')}` : '';
    console.error(`${path.relative(process.cwd(), d.source || doc)}${where}: ${names[d.severity]}: ${d.code}: ${d.message}${at}`);
  }
  if (errors > 0 || document === undefined) {
    console.error(`validate-asyncapi: ${errors} error(s) in ${process.argv[2]}`);
    process.exit(1);
  }
  console.error(`validate-asyncapi: ${process.argv[2]} is valid AsyncAPI ${document.version()} (${document.channels().length} channels, ${document.messages().length} messages)`);
})().catch((err) => {
  console.error(`validate-asyncapi: ${err && err.message ? err.message : err}`);
  process.exit(1);
});
EOF
