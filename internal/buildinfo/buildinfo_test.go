package buildinfo_test

import (
	"regexp"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/buildinfo"
)

func TestFromBuildInfo(t *testing.T) {
	t.Parallel()
	const rev = "51946a4c1f0e2d3b4a5968778695a4b3c2d1e0f9"
	vcs := func(modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev},
			{Key: "vcs.time", Value: "2026-12-01T08:54:12Z"}, {Key: "vcs.modified", Value: modified}}
	}
	tests := []struct {
		name string
		bi   *debug.BuildInfo
		want buildinfo.Info
		line string
	}{
		{
			name: "tagged release",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/quillhq/quill", Version: "v1.2.0"}, Settings: vcs("false")},
			want: buildinfo.Info{Version: "v1.2.0", Revision: rev, GoVersion: "go1.26.8"},
			line: "quill v1.2.0 (revision " + rev + ") go1.26.8",
		},
		{
			name: "modified checkout",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261201085412-51946a4c1f0e+dirty"}, Settings: vcs("true")},
			want: buildinfo.Info{Version: "v0.0.0-20261201085412-51946a4c1f0e+dirty", Revision: rev, Modified: true, GoVersion: "go1.26.8"},
			line: "quill v0.0.0-20261201085412-51946a4c1f0e+dirty (revision " + rev + ", modified) go1.26.8",
		},
		{
			name: "no version control (go run, a test binary)",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			want: buildinfo.Info{Version: buildinfo.Devel, GoVersion: "go1.26.8"},
			line: "quill (devel) go1.26.8",
		},
		{
			name: "empty module version",
			bi:   &debug.BuildInfo{GoVersion: "go1.26.8"},
			want: buildinfo.Info{Version: buildinfo.Devel, GoVersion: "go1.26.8"},
			line: "quill (devel) go1.26.8",
		},
		{
			name: "no build info",
			want: buildinfo.Info{Version: buildinfo.Devel, GoVersion: runtime.Version()},
			line: "quill (devel) " + runtime.Version(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := buildinfo.FromBuildInfo(tt.bi)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.line, got.Line("quill"))
		})
	}
}

func TestRead(t *testing.T) {
	t.Parallel()
	info := buildinfo.Read()
	require.Equal(t, runtime.Version(), info.GoVersion)
	require.NotEmpty(t, info.Version)
	require.Regexp(t, regexp.MustCompile(`^api \S+( \(revision [0-9a-f]+(, modified)?\))? go1\.\S+$`), info.Line("api"))
}

func TestWithStamp(t *testing.T) {
	t.Parallel()
	recorded := buildinfo.Info{Version: "v0.0.0-20261201085412-51946a4c1f0e", Revision: "51946a4c", GoVersion: "go1.26.8"}
	devel := buildinfo.Info{Version: buildinfo.Devel, GoVersion: "go1.26.8"}
	tests := []struct {
		name  string
		info  buildinfo.Info
		stamp string
		want  string
	}{
		{"a release's stamp wins over the recorded version", recorded, "v0.1.0", "v0.1.0"},
		{"a stamp replaces (devel)", devel, "v0.1.0", "v0.1.0"},
		{"no stamp keeps the recorded version", recorded, "", recorded.Version},
		{"a blank stamp is no stamp", devel, " \n", buildinfo.Devel},
		{"surrounding space is trimmed", devel, " v0.2.0-rc.1\n", "v0.2.0-rc.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := tt.info.WithStamp(tt.stamp)
			require.Equal(t, tt.want, got.Version)
			require.Equal(t, tt.info.Revision, got.Revision, "only the version changes")
		})
	}
}
