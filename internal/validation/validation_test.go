package validation

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		fields [][2]string
		want   string
	}{
		{"none", nil, ""},
		{"one", [][2]string{{"title", "is required"}}, "validation failed: title: is required"},
		{"two, in order", [][2]string{{"url", "is required"}, {"event_types", "must name one"}},
			"validation failed: url: is required; event_types: must name one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := &Error{}
			for _, f := range tc.fields {
				e.Add(f[0], "%s", f[1])
			}
			err := e.Err()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tc.want)
			var got *Error
			require.True(t, errors.As(err, &got))
			require.Len(t, got.Errors, len(tc.fields))
		})
	}
}
