// Package buildinfo says what a Quill binary was built from — the module
// version, the VCS revision and the Go version, as runtime/debug records
// them — for every program's --version and the quill_build_info metric.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Devel is the version of a binary whose module version is unknown (go run,
// a test binary, a build outside version control).
const Devel = "(devel)"

// Info is what a binary was built from.
type Info struct {
	// Version is the main module's version: a tag, or since Go 1.24 a
	// pseudo-version naming the commit (+dirty when modified) for a build
	// from a checkout; Devel when unknown.
	Version string
	// Revision is the VCS commit (vcs.revision), "" when not stamped.
	Revision string
	// Modified reports uncommitted changes in the build's checkout
	// (vcs.modified).
	Modified bool
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// StampSymbol is the linker symbol a build stamps its version into:
//
//	go build -ldflags "-X github.com/quillhq/quill/internal/buildinfo.stamp=v0.1.0" ./cmd/...
//
// A release (GoReleaser) and an image built without a checkout stamp it;
// a build from a checkout (make build, the dev and bench scripts) passes
// -buildvcs=auto instead and Go records the tag or a pseudo-version.
const StampSymbol = "github.com/quillhq/quill/internal/buildinfo.stamp"

// stamp is set only by the linker (StampSymbol), never at run time: it is
// how a build without version control says what it is.
var stamp string

// Read returns the running binary's Info: the stamped version if the build
// stamped one, else what the Go toolchain recorded.
func Read() Info {
	bi, _ := debug.ReadBuildInfo()
	return FromBuildInfo(bi).WithStamp(stamp)
}

// WithStamp returns i with its Version replaced by v, a version stamped at
// link time (StampSymbol), unless v is empty.
func (i Info) WithStamp(v string) Info {
	if v = strings.TrimSpace(v); v != "" {
		i.Version = v
	}
	return i
}

// FromBuildInfo returns the Info recorded in bi; a nil bi (a binary built
// without module support) gives Devel and the running Go version.
func FromBuildInfo(bi *debug.BuildInfo) Info {
	info := Info{Version: Devel, GoVersion: runtime.Version()}
	if bi == nil {
		return info
	}
	if v := bi.Main.Version; v != "" {
		info.Version = v
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// Line is the one line a program prints for --version: its name, the
// version, the revision when known and the Go version, as in
// "quill v1.2.0 (revision 51946a4c, modified) go1.26.8".
func (i Info) Line(prog string) string {
	var b strings.Builder
	b.WriteString(prog + " " + i.Version)
	if i.Revision != "" {
		b.WriteString(" (revision " + i.Revision)
		if i.Modified {
			b.WriteString(", modified")
		}
		b.WriteString(")")
	}
	b.WriteString(" " + i.GoVersion)
	return b.String()
}
