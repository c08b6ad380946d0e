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
var publicModules = []string{"contract", "client"}

// heavy are module path prefixes an importer of the public modules must
// never get: the server's own module and what only the server or its
// tooling needs.
var heavy = []string{
	module + " ", "github.com/nats-io/nats-server", "github.com/pb33f/", "honnef.co/go/tools",
	"github.com/compose-spec/", "github.com/jackc/", "github.com/pressly/goose", "go.opentelemetry.io/",
	"github.com/prometheus/", "github.com/modelcontextprotocol/",
}

// TestAFreshModuleImportsThePublicModules is an importer's first day: a
// module of its own, outside the repository, requires the public modules
// at a pseudo-version after a tag (as `go get …@<commit>` after v0.1.0
// writes it), pointed at this checkout by a replace each, imports them,
// tidies and builds. Its module graph holds none of the server's
// dependencies and only a handful of modules in all; its binary links
// nothing of ours but the public packages.
func TestAFreshModuleImportsThePublicModules(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("tidies and builds a module")
	}
	rootDir := root(t)
	dir := t.TempDir()
	const version = "v0.1.1-0.20261203080000-0123456789ab"
	var gomod strings.Builder
	gomod.WriteString("module example.com/importer\n\ngo 1.22\n\nrequire (\n")
	for _, m := range publicModules {
		fmt.Fprintf(&gomod, "\t%s/%s %s\n", module, m, version)
	}
	gomod.WriteString(")\n\n")
	for _, m := range publicModules {
		fmt.Fprintf(&gomod, "replace %s/%s => %s\n", module, m, filepath.Join(rootDir, m))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod.String()), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(`// Command importer uses the public modules as an agent's program would.
package main

import (
	"fmt"

	"github.com/quillhq/quill/client"
	"github.com/quillhq/quill/contract"
)

func main() {
	c, err := client.New(client.Config{BaseURL: "http://127.0.0.1:8080", Token: "qt_example"})
	fmt.Println(c != nil, err, contract.EventNoteCreated, c.NewKey() != "")
}
`), 0o644))

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

	mods := strings.Split(strings.TrimSpace(gocmd("list", "-m", "all")), "\n")
	t.Logf("the importer's module graph (go list -m all):\n%s", strings.Join(mods, "\n"))
	for _, m := range mods {
		for _, h := range heavy {
			require.False(t, strings.HasPrefix(m+" ", h), "the importer gets %s", m)
		}
	}
	require.LessOrEqual(t, len(mods), 8, "a short list: %v", mods)

	var ours []string
	for _, p := range strings.Fields(gocmd("list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")) {
		if p != "example.com/importer" {
			ours = append(ours, p)
		}
	}
	slices.Sort(ours)
	require.Equal(t, []string{"github.com/google/uuid", module + "/client", module + "/contract", module + "/contract/opkey"}, ours,
		"the binary links the public packages and the client's one dependency")
}
