package deploy_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

// The services compose.yaml must define, and how they relate.
const (
	svcPostgres = "postgres"
	svcNATS     = "nats"
	svcMigrate  = "migrate"
	svcAPI      = "api"

	natsConfRel = "deploy/nats.conf"
)

// repoRoot is the repository root: this package lives in <root>/deploy.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	return root
}

func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), rel))
	require.NoErrorf(t, err, "read %s", rel)
	return string(b)
}

// projectOptions loads ../compose.yaml with schema validation, normalization and
// the consistency check, with an empty environment and no .env file: the file
// must mean the same on every machine.
func projectOptions(t *testing.T, interpolate bool) *cli.ProjectOptions {
	t.Helper()
	root := repoRoot(t)
	opts, err := cli.NewProjectOptions(
		[]string{filepath.Join(root, "compose.yaml")},
		cli.WithWorkingDirectory(root),
		cli.WithEnv([]string{}),
		cli.WithInterpolation(interpolate),
		cli.WithNormalization(true),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(false),
	)
	require.NoError(t, err)
	return opts
}

func loadProject(t *testing.T) *types.Project {
	t.Helper()
	project, err := projectOptions(t, true).LoadProject(context.Background())
	require.NoError(t, err, "compose.yaml does not load or validate (compose-go, schema validation on)")
	return project
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	svc, err := p.GetService(name)
	require.NoErrorf(t, err, "compose.yaml must define service %q", name)
	return svc
}

func TestComposeLoadsWithoutEnvironment(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	withInterp, err := projectOptions(t, true).LoadModel(ctx)
	require.NoError(t, err, "compose.yaml does not load with interpolation")
	without, err := projectOptions(t, false).LoadModel(ctx)
	require.NoError(t, err, "compose.yaml does not load without interpolation")
	require.Equal(t, without, withInterp,
		"compose.yaml must not depend on variable interpolation (${VAR} or $$): it is loaded with an empty environment and no .env file")

	p := loadProject(t)
	require.Equal(t, "quill", p.Name, "compose.yaml should name the project")
	for name, svc := range p.Services {
		require.Emptyf(t, svc.EnvFiles, "service %q must not need an env_file", name)
	}
}

func TestComposeServices(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	for _, name := range []string{svcPostgres, svcNATS, svcMigrate, svcAPI} {
		service(t, p, name)
	}
}

func TestComposeMigrate(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	migrate := service(t, p, svcMigrate)

	require.Equal(t, types.ShellCommand{"api", "migrate"}, migrate.Command,
		"service migrate must run `api migrate`")
	require.Equal(t, "no", migrate.Restart, "service migrate runs once: restart must be \"no\"")

	dep, ok := migrate.DependsOn[svcPostgres]
	require.True(t, ok, "service migrate must depend on postgres")
	require.Equal(t, types.ServiceConditionHealthy, dep.Condition,
		"service migrate must wait for postgres to be healthy")

	pg := service(t, p, svcPostgres)
	require.NotNil(t, pg.HealthCheck, "service postgres needs a healthcheck (migrate waits for service_healthy)")
	require.Contains(t, strings.Join(pg.HealthCheck.Test, " "), "pg_isready",
		"postgres healthcheck should use pg_isready")
}

func TestComposeAPI(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	api := service(t, p, svcAPI)

	require.Equal(t, types.ShellCommand{"api", "serve"}, api.Command, "service api must run `api serve`")

	dep, ok := api.DependsOn[svcMigrate]
	require.True(t, ok, "service api must depend on migrate")
	require.Equal(t, types.ServiceConditionCompletedSuccessfully, dep.Condition,
		"service api must start only after migrate completed successfully")

	var targets []uint32
	for _, port := range api.Ports {
		targets = append(targets, port.Target)
	}
	require.Contains(t, targets, uint32(8080), "service api must publish the HTTP port 8080")
	require.Contains(t, targets, uint32(9090), "service api must publish the admin port 9090")

	// Its connection strings point at the compose services, with the
	// authentication the postgres service is configured for.
	env := api.Environment
	require.Contains(t, env, "DATABASE_URL")
	require.NotNil(t, env["DATABASE_URL"])
	dbURL, err := url.Parse(*env["DATABASE_URL"])
	require.NoError(t, err, "DATABASE_URL")
	require.Equal(t, "postgres:5432", dbURL.Host, "DATABASE_URL must point at the postgres service")
	require.Equal(t, "/quill", dbURL.Path, "DATABASE_URL must name the quill database")

	pg := service(t, p, svcPostgres)
	pgUser := "postgres"
	if u := pg.Environment["POSTGRES_USER"]; u != nil {
		pgUser = *u
	}
	require.Equal(t, pgUser, dbURL.User.Username(), "DATABASE_URL user must be the postgres service's POSTGRES_USER")
	password, hasPassword := dbURL.User.Password()
	if m := pg.Environment["POSTGRES_HOST_AUTH_METHOD"]; m != nil && *m == "trust" {
		require.False(t, hasPassword, "postgres uses trust auth: DATABASE_URL should carry no password")
	} else {
		require.NotNil(t, pg.Environment["POSTGRES_PASSWORD"], "postgres needs POSTGRES_PASSWORD or POSTGRES_HOST_AUTH_METHOD=trust")
		require.Equal(t, *pg.Environment["POSTGRES_PASSWORD"], password, "DATABASE_URL password must match POSTGRES_PASSWORD")
	}

	require.NotNil(t, env["NATS_URL"], "service api needs NATS_URL")
	require.Equal(t, "nats://nats:4222", *env["NATS_URL"], "NATS_URL must point at the nats service")
}

// natsConfig is deploy/nats.conf with comments removed.
func natsConfig(t *testing.T) string {
	t.Helper()
	comment := regexp.MustCompile(`(?m)(^|\s)(#|//).*$`)
	return comment.ReplaceAllString(readFile(t, natsConfRel), "")
}

var (
	jetstreamBlockRe = regexp.MustCompile(`(?s)\bjetstream\s*[:=]?\s*\{([^}]*)\}`)
	syncAlwaysRe     = regexp.MustCompile(`\bsync_interval\s*[:=]\s*"?always"?`)
	storeDirRe       = regexp.MustCompile(`\bstore_dir\s*[:=]\s*"?([^"\s]+)"?`)
)

func TestNATSConfig(t *testing.T) {
	t.Parallel()
	conf := natsConfig(t)
	m := jetstreamBlockRe.FindStringSubmatch(conf)
	require.NotNilf(t, m, "%s must enable JetStream with a `jetstream { ... }` block", natsConfRel)
	block := m[1]
	require.Regexpf(t, syncAlwaysRe, block,
		"%s: JetStream must fsync every write (`sync_interval: always` inside the jetstream block)", natsConfRel)
	require.Regexpf(t, storeDirRe, block, "%s: the jetstream block must set store_dir", natsConfRel)
	require.Regexp(t, `(?m)^\s*http\s*[:=]\s*\S*8222\b`, conf, "%s must serve HTTP monitoring on port 8222", natsConfRel)
}

func TestComposeNATS(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	root := repoRoot(t)
	nats := service(t, p, svcNATS)

	// deploy/nats.conf is bind-mounted ...
	var confTarget string
	var mountTargets []string
	for _, v := range nats.Volumes {
		mountTargets = append(mountTargets, v.Target)
		if v.Type != types.VolumeTypeBind {
			continue
		}
		src := v.Source
		if !filepath.IsAbs(src) {
			src = filepath.Join(root, src)
		}
		if filepath.Clean(src) == filepath.Join(root, natsConfRel) {
			confTarget = v.Target
			require.True(t, v.ReadOnly, "nats.conf should be mounted read-only")
		}
	}
	require.NotEmptyf(t, confTarget, "service nats must bind-mount %s", natsConfRel)

	// ... and is the configuration the server actually reads.
	cmd := []string(nats.Command)
	i := slices.IndexFunc(cmd, func(a string) bool { return a == "--config" || a == "-c" })
	require.GreaterOrEqualf(t, i, 0, "service nats must start with `--config %s`; command is %q", confTarget, cmd)
	require.Less(t, i+1, len(cmd), "--config needs a path")
	require.Equal(t, confTarget, cmd[i+1], "service nats must read the mounted nats.conf")

	// The JetStream store directory is a persistent named volume.
	m := storeDirRe.FindStringSubmatch(natsConfig(t))
	require.NotNil(t, m, "%s must set store_dir", natsConfRel)
	storeDir := m[1]
	var storeIsVolume bool
	for _, v := range nats.Volumes {
		if v.Target == storeDir && v.Type == types.VolumeTypeVolume {
			storeIsVolume = true
			require.Containsf(t, p.Volumes, v.Source, "volume %q must be declared at top level", v.Source)
		}
	}
	require.Truef(t, storeIsVolume, "the JetStream store_dir %q must be a named volume; nats mounts %q", storeDir, mountTargets)
}

func TestComposeAppImageBuiltFromDockerfile(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	api := service(t, p, svcAPI)
	migrate := service(t, p, svcMigrate)

	require.NotNil(t, api.Build, "service api must be built from ./Dockerfile")
	require.NotNil(t, migrate.Build, "service migrate must be built from ./Dockerfile")
	require.NotEmpty(t, api.Image, "service api should name its image, so every app service shares it")
	require.Equal(t, api.Image, migrate.Image, "migrate must run the same image as api")

	for name, svc := range p.Services {
		if svc.Build == nil && svc.Image != api.Image {
			continue // a third-party image
		}
		require.NotNilf(t, svc.Build, "service %q runs the app image %q and must carry its build section", name, svc.Image)
		require.Equalf(t, ".", svc.Build.Context, "service %q: build context must be the repository root `.`", name)
		require.Containsf(t, []string{"", "Dockerfile"}, svc.Build.Dockerfile, "service %q must build ./Dockerfile", name)
		require.Equalf(t, api.Image, svc.Image, "service %q must tag the shared app image", name)
	}
}

// dockerfileInstructions returns the Dockerfile's instructions, continuation
// lines joined and comments dropped.
func dockerfileInstructions(t *testing.T) []string {
	t.Helper()
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(readFile(t, "Dockerfile"), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\"))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(trimmed)
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	return out
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	inst := dockerfileInstructions(t)
	fromRe := regexp.MustCompile(`(?i)^FROM\s+(?:--platform=\S+\s+)?(\S+)`)
	var froms []string
	for _, in := range inst {
		if m := fromRe.FindStringSubmatch(in); m != nil {
			froms = append(froms, m[1])
		}
	}
	require.GreaterOrEqualf(t, len(froms), 2, "Dockerfile must be a multi-stage build; FROM lines: %q", froms)
	require.True(t, strings.HasPrefix(froms[0], "golang:"), "the first stage must build with a golang image, got %q", froms[0])
	require.Equal(t, "gcr.io/distroless/static-debian12:nonroot", froms[len(froms)-1],
		"the runtime stage must be distroless static, nonroot")

	// A static `go build` whose package pattern covers ./cmd/api.
	buildRe := regexp.MustCompile(`\bgo build\b.*?(\./cmd/(?:api\b|\.\.\.|\*/?))`)
	var build string
	for _, in := range inst {
		if buildRe.MatchString(in) {
			build = in
			break
		}
	}
	require.NotEmpty(t, build, "Dockerfile must `go build` ./cmd/api (directly, ./cmd/... or a loop over ./cmd/*/)")
	require.Contains(t, build, "CGO_ENABLED=0", "the binaries must be static")
	require.Contains(t, build, "-trimpath")
	require.Contains(t, build, "-ldflags='-s -w'")

	st, err := os.Stat(filepath.Join(repoRoot(t), "cmd", "api"))
	require.NoError(t, err, "./cmd/api must exist for the image to build")
	require.True(t, st.IsDir())

	var copiesBinaries bool
	for _, in := range inst {
		if strings.HasPrefix(strings.ToUpper(in), "COPY ") && strings.Contains(in, "--from=") &&
			strings.HasSuffix(strings.TrimRight(in, "/"), "/usr/local/bin") {
			copiesBinaries = true
		}
	}
	require.True(t, copiesBinaries, "the runtime stage must COPY --from the build stage into /usr/local/bin")
}
