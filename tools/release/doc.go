// Package release pins GoReleaser as a tool of a module of its own, so
// that the server's go.mod does not carry GoReleaser's dependency graph:
// `make release-check` runs `go tool goreleaser check` on the repository's
// .goreleaser.yaml, and a release runs `go tool goreleaser release` here.
package release
