package contract_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/contract"
)

// The client and consumers import the package: it links nothing but the
// standard library (whose import paths have no dot in their first element).
func TestImportsOnlyTheStandardLibrary(t *testing.T) {
	t.Parallel()
	for _, pkg := range []string{".", "./opkey"} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		require.NoError(t, err)
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "github.com/quillhq/quill/contract") {
				continue
			}
			first, _, _ := strings.Cut(dep, "/")
			require.NotContains(t, first, ".", "%s links %s", pkg, dep)
		}
	}
}

// Every constant of a list's kind is in its list, so that adding one
// cannot forget the list that metrics, the CLI and the schema tests range
// over.
func TestListsNameEveryConstant(t *testing.T) {
	t.Parallel()
	require.ElementsMatch(t, stringConstants(t, "contract.go", "Event"), contract.EventTypes())
	require.ElementsMatch(t, stringConstants(t, "contract.go", "Action"), contract.Actions())
	require.ElementsMatch(t, stringConstants(t, "contract.go", "Outcome"), contract.Outcomes())
}

func TestEventTypes(t *testing.T) {
	t.Parallel()
	require.Equal(t, "quill.note.created.v1", contract.CloudEventType(contract.EventNoteCreated))
	require.Equal(t, "urn:quill:schema:quill.attachment.processed.v1", contract.DataSchema(contract.EventAttachmentProcessed))
	for _, typ := range contract.EventTypes() {
		got, ok := contract.EventTypeOf(contract.CloudEventType(typ))
		require.True(t, ok, typ)
		require.Equal(t, typ, got)
	}
	for _, ce := range []string{"", "note.created", "quill.note.created", "quill.note.created.v2", "quill.note.archived.v1"} {
		_, ok := contract.EventTypeOf(ce)
		require.False(t, ok, ce)
	}
}

func TestSubjects(t *testing.T) {
	t.Parallel()
	p := contract.DefaultSubjectPrefix
	require.Equal(t, "quill.acme.note.created", contract.Subject(p, "acme", contract.EventNoteCreated))
	require.Equal(t, "quill.>", contract.AllSubjects(p))
	require.Equal(t, "quill.acme.>", contract.TenantSubjects(p, "acme"))
	require.Equal(t, "quill.*.note.deleted", contract.TypeSubjects(p, contract.EventNoteDeleted))
	for _, tc := range []struct{ subject, tenant string }{
		{"quill.acme.note.created", "acme"},
		{"quill.acme", "acme"},
		{"other.acme.note.created", ""},
		{"quillx.acme.note.created", ""},
	} {
		require.Equal(t, tc.tenant, contract.SubjectTenant(p, tc.subject), tc.subject)
	}
}

func TestSource(t *testing.T) {
	t.Parallel()
	require.Equal(t, "/tenants/acme", contract.Source("acme"))
	for _, tc := range []struct {
		source, tenant string
		ok             bool
	}{
		{"/tenants/acme", "acme", true},
		{"/tenants/", "", true},
		{"/tenants/Acme", "Acme", true},
		{"/tenant/acme", "", false},
	} {
		got, ok := contract.SourceTenant(tc.source)
		require.Equal(t, tc.ok, ok, tc.source)
		require.Equal(t, tc.tenant, got, tc.source)
	}
}

func TestNotePath(t *testing.T) {
	t.Parallel()
	const id = "01a229cf-df18-7236-a349-3735bd4a95ce"
	require.Equal(t, "/v1/notes/"+id, contract.NotePath(id))
	require.Equal(t, "/v1/notes/a%2Fb", contract.NotePath("a/b"), "an id is one path segment")
	for _, tc := range []struct {
		path, id string
		ok       bool
	}{
		{contract.NotePath(id), id, true},
		{contract.NotePath("a/b"), "a/b", true},
		{"/v1/notes/", "", false},
		{"/v1/notes", "", false},
		{"/v1/notes/" + id + "/attachment", "", false},
		{"/v1/operations/" + id, "", false},
		{"", "", false},
	} {
		got, ok := contract.ParseNotePath(tc.path)
		require.Equal(t, tc.ok, ok, tc.path)
		require.Equal(t, tc.id, got, tc.path)
	}
}

func TestValidTenant(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(contract.TenantPattern)
	tests := []struct {
		name string
		ok   bool
	}{
		{"a", true},
		{"0", true},
		{"acme", true},
		{"acme-corp", true},
		{"acme-2", true},
		{"9lives", true},
		{"a-", true},
		{"a--b", true},
		{strings.Repeat("a", 63), true},
		{"x" + strings.Repeat("-", 62), true},

		{"", false},
		{strings.Repeat("a", 64), false},
		{"-acme", false},
		{"Acme", false},
		{"ACME", false},
		{"ac_me", false},
		{"ac.me", false}, // a NATS subject separator
		{"ac*", false},   // NATS wildcards
		{"ac>", false},
		{"ac me", false},
		{" acme", false},
		{"acme ", false},
		{"acme\n", false},
		{"\nacme", false},
		{"acme\x00", false},
		{"acmé", false},
		{"acme/other", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.ok, contract.ValidTenant(tt.name), "%q", tt.name)
			require.Equal(t, tt.ok, re.MatchString(tt.name), "TenantPattern: %q", tt.name)
		})
	}
}

// stringConstants returns the values of the string constants in the Go
// file path whose names start with prefix, in the file's order.
func stringConstants(t *testing.T, path, prefix string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	require.NoError(t, err)
	var values []string
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if !strings.HasPrefix(n.Name, prefix) {
					continue
				}
				require.Less(t, i, len(vs.Values), "%s is a string literal", n.Name)
				lit, ok := vs.Values[i].(*ast.BasicLit)
				require.True(t, ok, "%s is a string literal", n.Name)
				v, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				values = append(values, v)
			}
		}
	}
	return values
}
