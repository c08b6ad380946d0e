package testkit

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// StringConstants returns the values of the constants declared in the Go
// file at path whose names start with prefix, in the order of the source.
// Each must be given a string literal of its own. Tests read the values
// from the source, so that a constant added there without its counterpart
// in a document fails them.
func StringConstants(t testing.TB, path, prefix string) []string {
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
