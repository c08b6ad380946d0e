package archtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// publicModules are the modules an importer takes, in their directories
// of the repository (decision 0095).
var publicModules = []string{"contract", "client", "consumer"}

// serverOnly are module path prefixes no importer of the public modules
// may get: the server's own module and what only the server or its tooling
// needs.
var serverOnly = []string{
	module + " ", "github.com/nats-io/nats-server", "github.com/pb33f/", "honnef.co/go/tools",
	"github.com/compose-spec/", "go.opentelemetry.io/", "github.com/modelcontextprotocol/",
	"github.com/cloudevents/", "golang.org/x/image",
}

// consumerOnly are what the consumer needs (a database, NATS, metrics) and
// an agent importing only the client must not get.
var consumerOnly = []string{"github.com/jackc/", "github.com/nats-io/", "github.com/prometheus/", "github.com/pressly/goose", "github.com/ThreeDotsLabs/"}

// TestAFreshModuleImportsThePublicModules is an importer's first day: a
// module of its own, outside the repository, requires the public modules
// at a pseudo-version after a tag (as `go get …@<commit>` after v0.1.0
// writes it), pointed at this checkout by a replace each, imports them,
// tidies and builds — once an agent's program with the client alone, once
// a downstream service with the consumer too. Neither module graph holds
// the server or its tooling, the agent's none of the consumer's database
// and NATS either, and neither binary links anything of ours but the
// public packages.
func TestAFreshModuleImportsThePublicModules(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("tidies and builds a module")
	}
	for _, tc := range []struct {
		name     string
		main     string
		banned   []string
		maxMods  int
		wantOurs []string
	}{
		{"an agent, client only", `package main

import (
	"fmt"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
)

func main() {
	c, err := client.New(client.Config{BaseURL: "http://127.0.0.1:8080", Token: "qt_example"})
	fmt.Println(err, contract.EventNoteCreated, c.NewKey() != "")
}
`, append(slices.Clone(serverOnly), consumerOnly...), 8, []string{"client", "contract", "contract/opkey"}},
		{"a downstream service, consumer too", `package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/quillhq/quill/consumer"
)

func main() {
	fmt.Println(consumer.Config{Durable: "search", Stream: "QUILL_EVENTS"}.Durable, consumer.VersionsInOrder)
	_ = func(ctx context.Context, tx pgx.Tx, ev consumer.Event) error { return nil }
}
`, serverOnly, 70, []string{"consumer", "contract"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mods, ours := importer(t, tc.main)
			t.Logf("the importer's module graph (go list -m all), %d modules:\n%s", len(mods), strings.Join(mods, "\n"))
			for _, m := range mods {
				for _, h := range tc.banned {
					require.False(t, strings.HasPrefix(m+" ", h), "the importer gets %s", m)
				}
			}
			require.LessOrEqual(t, len(mods), tc.maxMods, "a short list")
			var want []string
			for _, p := range tc.wantOurs {
				want = append(want, module+"/"+p)
			}
			require.Equal(t, want, ours, "the binary links only the public packages of ours")
		})
	}
}

// importer writes a module outside the repository whose main.go is src and
// which requires every public module through a replace, tidies and builds
// it, and returns its module graph and the packages of ours its binary
// links, sorted.
func importer(t *testing.T, src string) (mods, ours []string) {
	t.Helper()
	rootDir := root(t)
	dir := t.TempDir()
	const version = "v0.1.1-0.20261203080000-0123456789ab"
	var gomod strings.Builder
	gomod.WriteString("module example.com/importer\n\ngo 1.26\n\nrequire (\n")
	for _, m := range publicModules {
		fmt.Fprintf(&gomod, "\t%s/%s %s\n", module, m, version)
	}
	gomod.WriteString(")\n\n")
	for _, m := range publicModules {
		fmt.Fprintf(&gomod, "replace %s/%s => %s\n", module, m, filepath.Join(rootDir, m))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod.String()), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644))
	gocmd := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), "go", args...)
		cmd.Dir = dir
		// The importer's own settings: no workspace, no -mod from the
		// environment, the module cache (and proxy) as this machine has them.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	gocmd("mod", "tidy")
	gocmd("build", "-o", filepath.Join(dir, "importer"), ".")
	mods = strings.Split(strings.TrimSpace(gocmd("list", "-m", "all")), "\n")
	for _, p := range strings.Fields(gocmd("list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")) {
		if strings.HasPrefix(p, module+"/") {
			ours = append(ours, p)
		}
	}
	slices.Sort(ours)
	return mods, ours
}
