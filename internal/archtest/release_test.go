package archtest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/quillhq/quill/internal/buildinfo"
)

// TestReleaseShipsEveryProgram holds .goreleaser.yaml (whose schema
// `make release-check` checks with GoReleaser itself) to the repository:
// every program under cmd/ is built, each build stamps the version into
// buildinfo's symbol, and the release image copies every binary.
func TestReleaseShipsEveryProgram(t *testing.T) {
	t.Parallel()
	dir := root(t)
	raw, err := os.ReadFile(filepath.Join(dir, ".goreleaser.yaml"))
	require.NoError(t, err)
	var cfg struct {
		Builds []struct {
			ID, Main, Binary string
			Ldflags          []string
			Env              []string
		}
		DockersV2 []struct {
			Dockerfile string
			IDs        []string
		} `yaml:"dockers_v2"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &cfg))

	entries, err := os.ReadDir(filepath.Join(dir, "cmd"))
	require.NoError(t, err)
	var programs, built []string
	for _, e := range entries {
		if e.IsDir() {
			programs = append(programs, e.Name())
		}
	}
	for _, b := range cfg.Builds {
		built = append(built, b.Binary)
		require.Equal(t, "./cmd/"+b.Binary, b.Main, "build %s", b.ID)
		require.Contains(t, strings.Join(b.Ldflags, " "), "-X "+buildinfo.StampSymbol+"=v{{ .Version }}", "build %s stamps the version", b.ID)
		require.Contains(t, b.Env, "CGO_ENABLED=0", "build %s is static", b.ID)
	}
	slices.Sort(built)
	require.Equal(t, programs, built, "every program under cmd/ is released")

	require.Len(t, cfg.DockersV2, 1)
	img := cfg.DockersV2[0]
	require.ElementsMatch(t, programs, img.IDs, "the image takes every program")
	dockerfile, err := os.ReadFile(filepath.Join(dir, img.Dockerfile))
	require.NoError(t, err)
	for _, p := range programs {
		require.Contains(t, string(dockerfile), "$TARGETPLATFORM/"+p+" ", "%s copies %s", img.Dockerfile, p)
	}
	require.Contains(t, string(dockerfile), "FROM gcr.io/distroless/static-debian12:nonroot", "the same runtime as ./Dockerfile")
}
