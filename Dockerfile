# syntax=docker/dockerfile:1

# One image with every shipped Quill program (cmd/*) in /usr/local/bin;
# compose.yaml and other deployments choose the binary with the container
# command, e.g. `api serve`, `api migrate`, `relay`, `attachment-worker`,
# `webhook-dispatcher`.
#
#   docker build -t quill:dev .

# Base images are pinned by digest (decision 0101): the tag is kept for the
# reader, Docker pulls by the digest, so a rebuild of a commit gets the bytes
# it was built with and a retagged upstream image cannot change it.
# scripts/pin-images.sh re-resolves the tags on a machine that reaches the
# registries (and --check verifies them); internal/archtest's
# TestBaseImagesArePinned refuses a FROM without a digest.

############################
# Build stage
############################
# golang:1.26.9 (go.mod says go 1.26.8; GOTOOLCHAIN=local below needs at least
# that). The digest was read from public repositories that pin this tag —
# JanuaPort/januaport-plugins script-runner/CHANGELOG.md, and golang:1.26 at
# the same index in VEXXHOST's Dockerfiles — and was NOT verified against the
# registry from the machine that wrote it (none was reachable): run
# scripts/pin-images.sh --check where one is.
FROM --platform=$BUILDPLATFORM golang:1.26.9@sha256:d7722066f0b60ceccb6c0643cbed1f5f9e15506ac237146c95333504d7805d89 AS build
WORKDIR /src

# The toolchain in the image must satisfy go.mod; never download another.
ENV GOTOOLCHAIN=local

# Dependencies first, so that editing the code does not re-download them.
COPY go.mod go.sum ./
# The public modules the server's go.mod replaces with their directories
# (decision 0095): their go.mod files are enough to resolve the graph.
COPY contract/go.mod contract/go.sum ./contract/
COPY client/go.mod client/go.sum ./client/
COPY consumer/go.mod consumer/go.sum ./consumer/
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download -x

COPY . .

# Build every shipped program (./cmd/...: api, relay, attachment-worker,
# webhook-dispatcher, quill; the benchmark and demo tools under ./tools stay
# out of the image) into /out, one executable per directory, named after it.
# Static, no cgo, reproducible paths.
# The version every program reports (--version, quill_build_info): the
# VERSION build argument when given (a release: --build-arg VERSION=v0.1.0),
# else what Go records from the checkout's .git, which the build context
# keeps for this (a tag, or a pseudo-version naming the commit). A build
# that would report (devel) fails here rather than ship unnamed.
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    set -eu; \
    mkdir -p /out; \
    ldflags='-s -w'; \
    if [ -n "$VERSION" ]; then ldflags="$ldflags -X github.com/quillhq/quill/internal/buildinfo.stamp=$VERSION"; fi; \
    CGO_ENABLED=0 GOOS="$TARGETOS" GOARCH="$TARGETARCH" \
        go build -trimpath -buildvcs=auto -ldflags="$ldflags" -o /out/ ./cmd/...; \
    test -x /out/api; test -x /out/webhook-dispatcher; \
    if [ -z "$VERSION" ] && go version -m /out/api | grep -q '^[[:space:]]*mod[[:space:]].*(devel)'; then \
        echo "no version: build from a git checkout or pass --build-arg VERSION=vX.Y.Z" >&2; exit 1; \
    fi; \
    ls -l /out

############################
# Runtime stage
############################
# distroless static-debian12:nonroot as of 2026-08-26, the newest index digest
# that two public repositories pin (6586x57890143/skua Dockerfile,
# kilo666mj/taskboard Dockerfile); NOT verified against the registry from the
# machine that wrote it. Dockerfile.release pins the same.
FROM gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab

COPY --from=build /out/ /usr/local/bin/

ENV PATH=/usr/local/bin:/usr/bin:/bin
USER nonroot:nonroot

# API (QUILL_HTTP_ADDR) and admin (QUILL_ADMIN_ADDR: /healthz, /readyz, /metrics).
EXPOSE 8080 9090

CMD ["api", "serve"]
