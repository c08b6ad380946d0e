package archtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// pinnedRef is an image reference pinned by digest with its tag kept for
// the reader: name:tag@sha256:<64 lower-case hex> (decision 0101).
var pinnedRef = regexp.MustCompile(`^[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9_][A-Za-z0-9_.-]*@sha256:[0-9a-f]{64}$`)

// unpinned are the third-party images compose.yaml may name without a
// digest, each with the reason. An entry goes once its image is pinned
// (the test fails while a pinned image is still listed here).
var unpinned = map[string]string{}

// dockerfileFroms returns the image reference of every FROM of a
// Dockerfile (continuation lines joined, comments dropped), less those
// naming an earlier stage or scratch.
func dockerfileFroms(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var insts []string
	var cur strings.Builder
	for _, line := range strings.Split(string(raw), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		if s := strings.TrimSpace(cur.String()); s != "" {
			insts = append(insts, s)
		}
		cur.Reset()
	}
	stages := map[string]bool{"scratch": true}
	var refs []string
	for _, in := range insts {
		f := strings.Fields(in)
		if !strings.EqualFold(f[0], "FROM") {
			continue
		}
		args := f[1:]
		for len(args) > 0 && strings.HasPrefix(args[0], "--") {
			args = args[1:]
		}
		require.NotEmpty(t, args, "%s: %q names no image", path, in)
		if !stages[strings.ToLower(args[0])] {
			refs = append(refs, args[0])
		}
		// The stage's name counts for the FROMs after it, not its own.
		if len(args) >= 3 && strings.EqualFold(args[1], "AS") {
			stages[strings.ToLower(args[2])] = true
		}
	}
	return refs
}

// composeImages returns the image of every compose.yaml service that is
// not built from ./Dockerfile (the app's image, `build` set), by service.
func composeImages(t *testing.T, path string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc struct {
		Services map[string]struct {
			Image string `yaml:"image"`
			Build any    `yaml:"build"`
		} `yaml:"services"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	require.NotEmpty(t, doc.Services)
	out := map[string]string{}
	for name, svc := range doc.Services {
		if svc.Build != nil {
			continue
		}
		require.NotEmpty(t, svc.Image, "service %s has neither a build nor an image", name)
		out[name] = svc.Image
	}
	return out
}

// checkPins checks the references found in a tree: each pinned by a
// 64-hex digest (or listed in unpinned, and then really unpinned), and one
// tag pinned to one digest everywhere. It returns the first violation.
func checkPins(froms map[string][]string, images map[string]string, unpinned map[string]string) error {
	digests := map[string]string{}
	seen := func(where, ref string) error {
		if !pinnedRef.MatchString(ref) {
			if strings.Contains(ref, "$") {
				return fmt.Errorf("%s: %q is built from a variable; write the pinned reference itself, so that it is checked", where, ref)
			}
			return fmt.Errorf("%s: %q is not pinned by digest (name:tag@sha256:<64 hex>; scripts/pin-images.sh %s)", where, ref, ref)
		}
		tag, digest, _ := strings.Cut(ref, "@")
		if d, ok := digests[tag]; ok && d != digest {
			return fmt.Errorf("%s: %s is pinned to %s here and to %s elsewhere", where, tag, digest, d)
		}
		digests[tag] = digest
		return nil
	}
	for file, refs := range froms {
		if len(refs) == 0 {
			return fmt.Errorf("%s: no FROM of an image", file)
		}
		for _, ref := range refs {
			if err := seen(file, ref); err != nil {
				return err
			}
		}
	}
	used := map[string]bool{}
	for svc, ref := range images {
		if _, ok := unpinned[ref]; ok {
			used[ref] = true
			continue
		}
		if why, ok := unpinned[strings.SplitN(ref, "@", 2)[0]]; ok && strings.Contains(ref, "@") {
			return fmt.Errorf("compose.yaml service %s: %s is pinned now; drop its entry from unpinned (%s)", svc, ref, why)
		}
		if err := seen("compose.yaml service "+svc, ref); err != nil {
			return err
		}
	}
	for ref := range unpinned {
		if !used[ref] {
			return fmt.Errorf("unpinned lists %s, which compose.yaml no longer names unpinned", ref)
		}
	}
	return nil
}

// TestBaseImagesArePinned: every FROM of every Dockerfile* and every
// third-party image of compose.yaml is pinned by digest, so that a build
// or a `docker compose up` of a commit runs the bytes it was written
// against (issue 28, decision 0101).
func TestBaseImagesArePinned(t *testing.T) {
	t.Parallel()
	dir := root(t)
	froms, images := repositoryImages(t, dir)
	require.NoError(t, checkPins(froms, images, unpinned))
}

func repositoryImages(t *testing.T, dir string) (map[string][]string, map[string]string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "Dockerfile*"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	froms := map[string][]string{}
	for _, f := range files {
		froms[filepath.Base(f)] = dockerfileFroms(t, f)
	}
	return froms, composeImages(t, filepath.Join(dir, "compose.yaml"))
}

// TestPinCheckRefusesWhatItShould holds the check to its promise on
// altered copies of the repository's references: a pin removed, a short
// digest, a variable, two digests for one tag, a stale exception.
func TestPinCheckRefusesWhatItShould(t *testing.T) {
	t.Parallel()
	froms, images := repositoryImages(t, root(t))
	require.NoError(t, checkPins(froms, images, unpinned), "the repository's own references")

	clone := func() (map[string][]string, map[string]string) {
		f := map[string][]string{}
		for k, v := range froms {
			f[k] = append([]string(nil), v...)
		}
		i := map[string]string{}
		for k, v := range images {
			i[k] = v
		}
		return f, i
	}
	strip := func(ref string) string { return strings.SplitN(ref, "@", 2)[0] }
	for _, tc := range []struct {
		name  string
		alter func(map[string][]string, map[string]string)
		want  string
	}{
		{"a FROM's pin removed", func(f map[string][]string, _ map[string]string) {
			f["Dockerfile"][0] = strip(f["Dockerfile"][0])
		}, "not pinned by digest"},
		{"the runtime's pin removed", func(f map[string][]string, _ map[string]string) {
			last := len(f["Dockerfile.release"]) - 1
			f["Dockerfile.release"][last] = strip(f["Dockerfile.release"][last])
		}, "not pinned by digest"},
		{"a service's pin removed", func(_ map[string][]string, i map[string]string) {
			i["postgres"] = strip(i["postgres"])
		}, "not pinned by digest"},
		{"a short digest", func(_ map[string][]string, i map[string]string) {
			i["grafana"] = i["grafana"][:len(i["grafana"])-1]
		}, "not pinned by digest"},
		{"a digest without its tag", func(_ map[string][]string, i map[string]string) {
			tag, digest, _ := strings.Cut(i["nats"], "@")
			i["nats"] = strings.SplitN(tag, ":", 2)[0] + "@" + digest
		}, "not pinned by digest"},
		{"a variable", func(f map[string][]string, _ map[string]string) {
			f["Dockerfile"][0] = "golang:${GO_VERSION}"
		}, "built from a variable"},
		{"two digests for one tag", func(_ map[string][]string, i map[string]string) {
			i["nats-1"] = strip(i["nats-1"]) + "@sha256:" + strings.Repeat("0", 64)
		}, "elsewhere"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, i := clone()
			tc.alter(f, i)
			err := checkPins(f, i, unpinned)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	// The list of images allowed unpinned: one listed may stay unpinned;
	// one listed and pinned, or listed and named by no service, is stale.
	prom := strip(images["prometheus"])
	f, i := clone()
	err := checkPins(f, i, map[string]string{prom: "a test's exception"})
	require.ErrorContains(t, err, "drop its entry")
	err = checkPins(f, i, map[string]string{"example/gone:1": "a test's exception"})
	require.ErrorContains(t, err, "no longer names")
	i["prometheus"] = strip(i["prometheus"])
	require.NoError(t, checkPins(f, i, map[string]string{i["prometheus"]: "a test's exception"}))
}

// TestPinImagesScript runs scripts/pin-images.sh on a copy of the
// Dockerfiles and compose.yaml with a stand-in `crane` first on PATH (no
// registry is reachable from the tests): --check exits 1 on a stale pin
// and changes nothing, a run rewrites it and pins a reference it is given,
// and --check then exits 0.
func TestPinImagesScript(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is missing")
	}
	dir := root(t)
	tree, bin := t.TempDir(), t.TempDir()
	files, err := filepath.Glob(filepath.Join(dir, "Dockerfile*"))
	require.NoError(t, err)
	for _, f := range append(files, filepath.Join(dir, "compose.yaml")) {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		if filepath.Base(f) == "compose.yaml" {
			// An image named unpinned, as a new service's would be,
			// for the script to pin.
			b = regexp.MustCompile(`(image: prom/prometheus:v3\.5\.0)@sha256:[0-9a-f]{64}`).ReplaceAll(b, []byte("$1"))
			require.Contains(t, string(b), "image: prom/prometheus:v3.5.0\n")
		}
		require.NoError(t, os.WriteFile(filepath.Join(tree, filepath.Base(f)), b, 0o644))
	}

	// The registry's answers: today's pins, but for one tag moved on and
	// the exception's digest.
	froms, images := repositoryImages(t, dir)
	registry := map[string]string{}
	for _, refs := range froms {
		for _, r := range refs {
			tag, digest, _ := strings.Cut(r, "@")
			registry[tag] = digest
		}
	}
	for _, r := range images {
		if tag, digest, ok := strings.Cut(r, "@"); ok {
			registry[tag] = digest
		}
	}
	moved := "sha256:" + strings.Repeat("1", 64)
	promDigest := "sha256:" + strings.Repeat("2", 64)
	oldNats := registry["nats:2.11-alpine"]
	require.NotEmpty(t, oldNats)
	registry["nats:2.11-alpine"] = moved
	registry["prom/prometheus:v3.5.0"] = promDigest
	var answers strings.Builder
	for tag, digest := range registry {
		fmt.Fprintf(&answers, "%s %s\n", tag, digest)
	}
	answersFile := filepath.Join(bin, "answers")
	require.NoError(t, os.WriteFile(answersFile, []byte(answers.String()), 0o644))
	crane := "#!/usr/bin/env bash\n[[ $1 == digest ]] || exit 3\n" +
		"awk -v r=\"$2\" '$1==r{print $2; f=1} END{exit !f}' " + answersFile + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(bin, "crane"), []byte(crane), 0o755))

	run := func(args ...string) (int, string) {
		cmd := exec.Command("bash", append([]string{filepath.Join(dir, "scripts/pin-images.sh"), "--root", tree}, args...)...)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), string(out)
		}
		require.NoError(t, err, string(out))
		return 0, string(out)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(tree, name))
		require.NoError(t, err)
		return string(b)
	}
	before := read("compose.yaml")

	code, out := run("--check")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "changed nats:2.11-alpine")
	require.Equal(t, before, read("compose.yaml"), "--check writes nothing")

	code, out = run("prom/prometheus:v3.5.0")
	require.Equal(t, 0, code, out)
	compose := read("compose.yaml")
	require.False(t, strings.Contains(compose, oldNats), "a stale nats pin is left")
	require.Equal(t, strings.Count(before, oldNats), strings.Count(compose, "nats:2.11-alpine@"+moved), "every nats pin rewritten")
	require.Contains(t, compose, "image: prom/prometheus:v3.5.0@"+promDigest)
	require.Equal(t, read("Dockerfile"), string(mustRead(t, filepath.Join(dir, "Dockerfile"))), "current pins are left alone")

	code, out = run("--check")
	require.Equal(t, 0, code, out)

	code, out = run("--check", "nosuch/image:1")
	require.Equal(t, 2, code, "an unresolvable reference is an error: %s", out)
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}
