package helm_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// images returns the image of every container and init container of the
// rendered Deployments and Jobs, by "object/container".
func images(r *rendering) map[string]string {
	out := map[string]string{}
	for name, d := range r.deployments {
		spec := d.Spec.Template.Spec
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			out[name+"/"+c.Name] = c.Image
		}
	}
	for _, j := range r.jobs {
		spec := j.Spec.Template.Spec
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			out[j.Name+"/"+c.Name] = c.Image
		}
	}
	return out
}

// TestImageDigest: with image.digest set every Deployment and the
// migration Job run repository@digest (the tag ignored), without it
// repository:tag; a digest that is not sha256:<64 hex> is refused.
func TestImageDigest(t *testing.T) {
	t.Parallel()
	digest := "sha256:" + strings.Repeat("0123456789abcdef", 4)
	for _, tc := range []struct {
		name  string
		image map[string]any
		want  string
	}{
		{"no digest: the chart's appVersion", map[string]any{"repository": "registry.example.com/quill"}, "registry.example.com/quill:v0.1.0"},
		{"no digest: the tag", map[string]any{"repository": "registry.example.com/quill", "tag": "v0.1.1"}, "registry.example.com/quill:v0.1.1"},
		{"a digest", map[string]any{"repository": "registry.example.com/quill", "digest": digest}, "registry.example.com/quill@" + digest},
		{"a digest wins over the tag", map[string]any{"repository": "registry.example.com/quill", "tag": "v0.1.1", "digest": digest}, "registry.example.com/quill@" + digest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rel, err := render(t.Context(), map[string]any{"image": tc.image})
			require.NoError(t, err)
			r := decode(t, rel)
			got := images(r)
			// Every daemon and the migration Job, nothing else.
			require.Len(t, got, len(programs)+1, "containers: %v", got)
			require.Len(t, r.jobs, 1)
			for where, image := range got {
				require.Equal(t, tc.want, image, where)
			}
		})
	}

	for _, bad := range []string{
		strings.TrimPrefix(digest, "sha256:"), // no algorithm
		digest[:len(digest)-1],                // short
		"sha256:" + strings.Repeat("A", 64),   // upper case
		"sha512:" + strings.Repeat("0", 64),   // not what the registries name
		"v0.1.0",                              // a tag
	} {
		_, err := render(t.Context(), map[string]any{"image": map[string]any{"digest": bad}})
		require.ErrorContains(t, err, "digest", "image.digest %q", bad)
	}
}
