package archtest

import (
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/quillhq/quill"

// golist runs go list in the module's root with args and returns its lines.
func golist(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", append([]string{"list"}, args...)...)
	cmd.Dir = root(t)
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		require.NoError(t, err, "go list %v: %s", args, ee.Stderr)
	}
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// imports maps every package of the module (tests excluded) to its direct
// imports.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	m := map[string][]string{}
	for _, line := range golist(t, "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...") {
		f := strings.Fields(line)
		m[strings.TrimPrefix(f[0], module+"/")] = f[1:]
	}
	return m
}

func TestNotesSpeaksNoHTTP(t *testing.T) {
	t.Parallel()
	deps := golist(t, "-deps", "./internal/notes")
	for _, banned := range []string{"net/http", module + "/internal/problem", module + "/internal/httpapi"} {
		require.NotContains(t, deps, banned, "internal/notes depends on %s", banned)
	}
}

func TestOnlyCmdRelayImportsRelay(t *testing.T) {
	t.Parallel()
	var importers []string
	for pkg, imps := range imports(t) {
		if slices.Contains(imps, module+"/internal/relay") {
			importers = append(importers, pkg)
		}
	}
	require.Equal(t, []string{"cmd/relay"}, importers)
}

func TestClientAndQuillLinkNoDatabaseDriver(t *testing.T) {
	t.Parallel()
	for _, pkg := range []string{module + "/client", "./cmd/quill"} {
		for _, dep := range golist(t, "-deps", pkg) {
			for _, banned := range []string{"github.com/jackc/", "github.com/pressly/goose", "github.com/lib/pq", module + "/migrations"} {
				require.False(t, strings.HasPrefix(dep, banned), "%s links %s", pkg, dep)
			}
		}
	}
}

// publicLinks names, for each public package, the packages of this module
// it may link (transitively): what an importer of it compiles of ours.
var publicLinks = map[string][]string{
	// client and contract are modules of their own (decision 0095),
	// listed by import path: their packages are the server module's
	// dependencies.
	"client": {"contract", "contract/opkey"},
	// The event schemas are contract's (decision 0095).
	"consumer": {"contract"},
	"contract": {},
}

func TestPublicPackagesLinkOnlyTheContract(t *testing.T) {
	t.Parallel()
	for pkg, allowed := range publicLinks {
		for _, dep := range golist(t, "-deps", module+"/"+pkg) {
			rest, ok := strings.CutPrefix(dep, module+"/")
			if !ok || rest == pkg || strings.HasPrefix(rest, pkg+"/") {
				continue
			}
			require.Contains(t, allowed, rest, "%s links %s of this module", pkg, rest)
		}
	}
}

// TestContractLinksTheStandardLibraryOnly: client and consumer importers
// pay for what contract imports.
func TestContractLinksTheStandardLibraryOnly(t *testing.T) {
	t.Parallel()
	for _, line := range golist(t, "-deps", "-f", "{{.ImportPath}} {{.Standard}}", module+"/contract/...") {
		f := strings.Fields(line)
		require.True(t, f[1] == "true" || strings.HasPrefix(f[0], module+"/contract"), "contract links %s", f[0])
	}
}

// TestNamesOfTheContractLiveInContract: the stream's name and the event
// types are written once, in contract; every other package names them
// through it.
func TestNamesOfTheContractLiveInContract(t *testing.T) {
	t.Parallel()
	literal := regexp.MustCompile(`"(?:QUILL_EVENTS|quill\.(?:note|attachment)\.[a-z]+\.v\d+|(?:note|attachment)\.(?:created|deleted|updated|processed))"`)
	for file, src := range productSources(t, "cmd", "internal", "client", "consumer") {
		require.NotRegexp(t, literal, src, "%s spells a name of the contract; use package contract", file)
	}
}

// root is the module's root directory.
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return r
}

// productSources returns the non-test Go files under the top directories
// (cmd/, internal/, client/, consumer/: the shipped programs and the public
// packages), relative to the root, with their contents. tools/ is left
// out: a benchmark may seed tables directly.
func productSources(t *testing.T, tops ...string) map[string]string {
	t.Helper()
	r := root(t)
	files := map[string]string{}
	for _, top := range tops {
		err := filepath.WalkDir(filepath.Join(r, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(r, path)
			files[filepath.ToSlash(rel)] = string(b)
			return err
		})
		require.NoError(t, err)
	}
	require.NotEmpty(t, files)
	return files
}

// tableOwners names the one package that writes each table.
var tableOwners = map[string]string{
	"notes":          "internal/notes",
	"attachments":    "internal/notes",
	"operations":     "internal/idempotency",
	"outbox_events":  "internal/outbox",
	"outbox_pending": "internal/outbox",
	"api_tokens":     "internal/auth",

	"webhook_endpoints": "internal/webhooks",

	"console_session_keys": "internal/console",
	"console_signouts":     "internal/console",

	"webhook_endpoint_health": "internal/dispatch",
	"webhook_deliveries":      "internal/dispatch",

	// The consumer package's tables (consumer.DefaultTablePrefix), which
	// hold every consumer's inbox and dead letters; its statements name
	// them through the prefix, so only other writers can be seen here.
	"quill_consumer_inbox":        "consumer",
	"quill_consumer_dead_letters": "consumer",
	"quill_consumer_versions":     "consumer",
}

// formattedTables are written by statements that name them through a
// prefix: a writer cannot be found by its name, only a stranger.
var formattedTables = []string{"quill_consumer_inbox", "quill_consumer_dead_letters", "quill_consumer_versions"}

var writeRE = regexp.MustCompile(`(?i)\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?|COPY)\s+([a-z_]+)`)

func TestEachTableHasOneWriter(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for file, src := range productSources(t, "cmd", "internal", "consumer") {
		for _, m := range writeRE.FindAllStringSubmatch(src, -1) {
			owner, ok := tableOwners[strings.ToLower(m[1])]
			if !ok {
				continue // a word after UPDATE in prose, or a table of no concern
			}
			seen[m[1]] = true
			require.Equal(t, owner, path.Dir(file), "%s writes %s (%q), which only %s writes", file, m[1], m[0], owner)
		}
	}
	for table := range tableOwners {
		if slices.Contains(formattedTables, table) {
			continue
		}
		require.True(t, seen[table], "no writer of %s found: the rule's table list is stale", table)
	}
}

var beginRE = regexp.MustCompile(`\.BeginTx\(|\.Begin\(|"BEGIN\b`)

// ownTransaction is the one file outside internal/db that opens a
// transaction: the public consumer package's stage that commits a batch
// (it cannot import internal/, being a module of its own to be).
const ownTransaction = "consumer/stages.go"

func TestOnlyDBOpensTransactions(t *testing.T) {
	t.Parallel()
	files := productSources(t, "cmd", "internal", "client", "consumer")
	require.Regexp(t, beginRE, files[ownTransaction], "the exception is stale")
	for file, src := range files {
		// Only a file that speaks to PostgreSQL can open a transaction; a
		// Begin elsewhere is another thing (the client's journal).
		if path.Dir(file) == "internal/db" || file == ownTransaction || !strings.Contains(src, `"github.com/jackc/pgx/v5`) {
			continue
		}
		require.NotRegexp(t, beginRE, src, "%s opens a transaction itself; use internal/db (WithTx, WithSnapshot, Pipeline)", file)
	}
}

func TestTestPackagesAreImportedByTestsOnly(t *testing.T) {
	t.Parallel()
	testOnly := []string{"internal/dbtest", "internal/natstest", "internal/apitest", "internal/clitest", "internal/testkit", "internal/webhooktest"}
	for pkg, imps := range imports(t) {
		if slices.Contains(testOnly, pkg) {
			continue
		}
		for _, tp := range testOnly {
			require.NotContains(t, imps, module+"/"+tp, "%s imports the test-only %s", pkg, tp)
		}
	}
}
