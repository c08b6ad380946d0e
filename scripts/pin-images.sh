#!/usr/bin/env bash
# pin-images.sh: the base and third-party images are pinned by digest
# (decision 0101): `name:tag@sha256:<64 hex>` in every Dockerfile* FROM and
# in compose.yaml's `image:` lines, the tag kept for the reader, the digest
# the image Docker pulls. This script re-resolves each pinned tag to the
# digest its registry names today and rewrites the pin; it needs a registry,
# reached through `crane digest` when crane is installed, else
# `docker buildx imagetools inspect --format '{{json .Manifest}}'` (the
# manifest list's or OCI index's digest, the same for every platform).
#
#   scripts/pin-images.sh                       rewrite every pin to today's digest
#   scripts/pin-images.sh --check               verify them: exit 1 if one differs
#   scripts/pin-images.sh nats:2.12-alpine
#                                               also pin these references where
#                                               they appear unpinned
#   --root DIR                                  the tree to work on (default: the
#                                               repository's root)
#
# It prints one line per reference: the tag, the pinned digest and the
# registry's. Exit status: 0 done (or, with --check, every pin current),
# 1 a pin differs (--check), 2 a usage or resolution error (nothing written).
set -euo pipefail

usage() {
	sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

check=0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extra=()
while (($#)); do
	case $1 in
	--check) check=1 ;;
	--root)
		[[ $# -ge 2 ]] || { echo "pin-images: --root needs a directory" >&2; exit 2; }
		root=$2
		shift
		;;
	-h | --help) usage; exit 0 ;;
	-*) echo "pin-images: unknown option $1" >&2; usage >&2; exit 2 ;;
	*) extra+=("$1") ;;
	esac
	shift
done

cd "$root"
shopt -s nullglob
files=(Dockerfile* compose.yaml)
shopt -u nullglob
if ((${#files[@]} == 0)); then
	echo "pin-images: no Dockerfile* or compose.yaml in $root" >&2
	exit 2
fi

# resolve REF prints the digest (sha256:…) the registry names for REF.
resolve() {
	local ref=$1 out
	if command -v crane >/dev/null 2>&1; then
		out=$(crane digest "$ref") || return 1
	elif docker buildx version >/dev/null 2>&1; then
		out=$(docker buildx imagetools inspect --format '{{json .Manifest}}' "$ref") || return 1
		if command -v jq >/dev/null 2>&1; then
			out=$(jq -r .digest <<<"$out")
		else
			# The document's own digest comes before its manifests' digests.
			out=$(grep -o '"digest": *"sha256:[0-9a-f]\{64\}"' <<<"$out" | head -n1 | grep -o 'sha256:[0-9a-f]\{64\}')
		fi
	else
		echo "pin-images: neither crane nor docker buildx is installed" >&2
		return 1
	fi
	if [[ ! $out =~ ^sha256:[0-9a-f]{64}$ ]]; then
		echo "pin-images: $ref resolved to '$out', not a sha256 digest" >&2
		return 1
	fi
	printf '%s\n' "$out"
}

# sed_in_place ARGS... FILE: sed -i as both GNU's and BSD's sed take it.
sed_in_place() {
	local file=${*: -1}
	sed -i.pin-images~ "$@" && rm -f "$file.pin-images~"
}

# Every pinned reference in the files, once each: tag@digest.
mapfile -t pinned < <(grep -ohE '[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9_][A-Za-z0-9_.-]*@sha256:[0-9a-f]{64}' "${files[@]}" | sort -u)
if ((${#pinned[@]} == 0 && ${#extra[@]} == 0)); then
	echo "pin-images: no pinned reference in ${files[*]}" >&2
	exit 2
fi

# Resolve everything first, so that a registry error writes nothing.
declare -A want
refs=()
for p in "${pinned[@]}"; do
	ref=${p%@*}
	[[ -v want[$ref] ]] || refs+=("$ref")
	want[$ref]=
done
for ref in "${extra[@]}"; do
	if [[ ! $ref =~ ^[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]]; then
		echo "pin-images: $ref is not name:tag" >&2
		exit 2
	fi
	[[ -v want[$ref] ]] || refs+=("$ref")
	want[$ref]=
done
for ref in "${refs[@]}"; do
	want[$ref]=$(resolve "$ref") || { echo "pin-images: cannot resolve $ref" >&2; exit 2; }
done

stale=0
for p in "${pinned[@]}"; do
	ref=${p%@*} have=${p##*@}
	if [[ $have == "${want[$ref]}" ]]; then
		echo "ok      $ref $have"
		continue
	fi
	stale=1
	echo "changed $ref $have -> ${want[$ref]}"
	if ((!check)); then
		for f in "${files[@]}"; do
			sed_in_place "s|${ref//./\\.}@${have}|${ref}@${want[$ref]}|g" "$f"
		done
	fi
done
for ref in "${extra[@]}"; do
	# The reference unpinned: a word of its own, not followed by @.
	quoted=${ref//./\\.}
	pattern="(^|[[:space:]\"'=])${quoted}([[:space:]\"']|$)"
	if ! grep -qE "$pattern" "${files[@]}"; then
		echo "pin-images: $ref appears unpinned in none of ${files[*]}" >&2
		exit 2
	fi
	stale=1
	echo "pin     $ref ${want[$ref]}"
	if ((!check)); then
		for f in "${files[@]}"; do
			sed_in_place -E "s#${pattern}#\\1${ref}@${want[$ref]}\\2#g" "$f"
		done
	fi
done

if ((check && stale)); then
	echo "pin-images: a pin differs from its registry's digest; run scripts/pin-images.sh" >&2
	exit 1
fi
