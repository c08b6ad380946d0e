# syntax=docker/dockerfile:1

# One image with every shipped Quill program (cmd/*) in /usr/local/bin;
# compose.yaml and other deployments choose the binary with the container
# command, e.g. `api serve`, `api migrate`, `relay`, `attachment-worker`,
# `webhook-dispatcher`.
#
#   docker build -t quill:dev .

ARG GO_VERSION=1.26

############################
# Build stage
############################
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
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
FROM gcr.io/distroless/static-debian12:nonroot

COPY --from=build /out/ /usr/local/bin/

ENV PATH=/usr/local/bin:/usr/bin:/bin
USER nonroot:nonroot

# API (QUILL_HTTP_ADDR) and admin (QUILL_ADMIN_ADDR: /healthz, /readyz, /metrics).
EXPOSE 8080 9090

CMD ["api", "serve"]
