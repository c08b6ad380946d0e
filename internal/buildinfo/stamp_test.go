package buildinfo_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/buildinfo"
)

// buildAndRun builds testdata/version with the go command's extra flags
// and returns what it prints.
func buildAndRun(t *testing.T, flags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "version")
	args := append([]string{"build", "-o", bin}, flags...)
	out, err := exec.Command("go", append(args, "./testdata/version")...).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	out, err = exec.Command(bin).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

// TestStampedBuilds builds a program the two ways Quill's builds stamp a
// version — the linker symbol (releases, images) and version control
// (make build, the scripts) — and runs it: neither says (devel).
func TestStampedBuilds(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds a program")
	}
	t.Run("linker stamp", func(t *testing.T) {
		t.Parallel()
		got := buildAndRun(t, "-buildvcs=false", "-ldflags", "-X "+buildinfo.StampSymbol+"=v0.1.0")
		require.True(t, strings.HasPrefix(got, "version v0.1.0 "), "got %q", got)
	})
	t.Run("version control", func(t *testing.T) {
		t.Parallel()
		head, err := exec.Command("git", "rev-parse", "HEAD").Output()
		if err != nil {
			t.Skip("not a git checkout")
		}
		got := buildAndRun(t, "-buildvcs=auto")
		require.NotContains(t, got, buildinfo.Devel)
		require.Contains(t, got, "(revision "+strings.TrimSpace(string(head)), "the revision is the checkout's HEAD")
	})
}
