package consumer_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The package is for other teams' services: it links none of Quill's
// internal packages (and so none of what they pull in) and no database
// driver beyond pgx.
func TestLinksNoInternalPackageAndNoOtherDriver(t *testing.T) {
	t.Parallel()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", ".").Output()
	require.NoError(t, err)
	for _, dep := range strings.Fields(string(out)) {
		require.False(t, strings.HasPrefix(dep, "github.com/quillhq/quill/internal/"), "consumer links %s", dep)
		for _, banned := range []string{"github.com/lib/pq", "github.com/rs/zerolog", "modernc.org/sqlite", "github.com/go-sql-driver/", "github.com/ThreeDotsLabs/watermill-nats"} {
			require.False(t, strings.HasPrefix(dep, banned), "consumer links %s", dep)
		}
	}
}
