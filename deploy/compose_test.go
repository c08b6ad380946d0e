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

	"github.com/quillhq/quill/internal/whsecret"
)

// The services compose.yaml must define, and how they relate.
const (
	svcPostgres = "postgres"
	svcNATS     = "nats"
	svcMigrate  = "migrate"
	svcAPI      = "api"

	natsConfRel = "deploy/nats.conf"

	svcRelay      = "relay"
	svcWorker     = "attachment-worker"
	svcDispatcher = "webhook-dispatcher"

	// The cluster profile: a second stack on a three-node NATS cluster.
	profileCluster       = "cluster"
	natsClusterConfRel   = "deploy/nats-cluster.conf"
	svcRelayCluster      = "relay-cluster"
	svcWorkerCluster     = "attachment-worker-cluster"
	svcDispatcherCluster = "webhook-dispatcher-cluster"
	svcAPICluster        = "api-cluster"
	svcMigrateCluster    = "migrate-cluster"
)

// natsNodes are the cluster profile's NATS services.
var natsNodes = []string{"nats-1", "nats-2", "nats-3"}

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

func loadProject(t *testing.T, profiles ...string) *types.Project {
	t.Helper()
	opts := projectOptions(t, true)
	require.NoError(t, cli.WithProfiles(profiles)(opts))
	project, err := opts.LoadProject(context.Background())
	require.NoErrorf(t, err, "compose.yaml does not load or validate with profiles %q (compose-go, schema validation on)", profiles)
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
	// The tag, less the digest it is pinned by (internal/archtest checks the pins).
	runtime, _, _ := strings.Cut(froms[len(froms)-1], "@")
	require.Equal(t, "gcr.io/distroless/static-debian12:nonroot", runtime,
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
	require.Contains(t, build, "ldflags='-s -w'", "stripped")
	// The version (issue 28): the VERSION argument stamped, else Go's
	// record of the checkout, whose .git the context must keep.
	require.Contains(t, build, "-buildvcs=auto", "the version from the checkout")
	require.Contains(t, build, "-X github.com/quillhq/quill/internal/buildinfo.stamp=$VERSION", "a release's VERSION stamped")
	require.NotContains(t, strings.Fields(readFile(t, ".dockerignore")), ".git", "the build context keeps .git, from which Go records the version")

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

// TestComposeDefaultStack: `docker compose up` without a profile starts the
// single-node stack and nothing of the cluster profile.
func TestComposeDefaultStack(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	require.ElementsMatch(t, []string{svcPostgres, svcNATS, svcMigrate, svcAPI, svcRelay, svcWorker, svcDispatcher}, p.ServiceNames(),
		"the default `docker compose up` must start exactly the single-node stack")
	for _, name := range p.ServiceNames() {
		require.NotContainsf(t, service(t, p, name).Profiles, profileCluster, "service %q must not be in the cluster profile", name)
	}
}

// TestComposeRelayAndWorkerScale: relays, workers and webhook dispatchers
// publish no fixed host port and have no container name, so `docker
// compose up --scale relay=2 --scale attachment-worker=2 --scale
// webhook-dispatcher=2` (and the cluster stack's equivalents) can start
// two of each.
func TestComposeRelayAndWorkerScale(t *testing.T) {
	t.Parallel()
	p := loadProject(t, profileCluster)
	for _, name := range []string{svcRelay, svcWorker, svcDispatcher, svcRelayCluster, svcWorkerCluster, svcDispatcherCluster} {
		svc := service(t, p, name)
		require.Emptyf(t, svc.ContainerName, "service %q must not set container_name: it could not scale", name)
		for _, port := range svc.Ports {
			require.Emptyf(t, port.Published, "service %q publishes host port %s for %d: a second container could not bind it; publish the target only (\"%d\") or expose it",
				name, port.Published, port.Target, port.Target)
		}
	}
}

// natsClusterConfig is deploy/nats-cluster.conf with comments removed.
func natsClusterConfig(t *testing.T) string {
	t.Helper()
	comment := regexp.MustCompile(`(?m)(^|\s)(#|//).*$`)
	return comment.ReplaceAllString(readFile(t, natsClusterConfRel), "")
}

var (
	clusterBlockRe = regexp.MustCompile(`(?s)\bcluster\s*[:=]?\s*\{(.*)\}`)
	clusterPortRe  = regexp.MustCompile(`\blisten\s*[:=]\s*"?[^:\s"]*:(\d+)"?`)
	routesRe       = regexp.MustCompile(`(?s)\broutes\s*[:=]?\s*\[([^\]]*)\]`)
	routeRe        = regexp.MustCompile(`nats-route://([A-Za-z0-9_.-]+):(\d+)`)
)

// TestComposeClusterNodes: the cluster profile runs three NATS nodes from
// deploy/nats-cluster.conf, each with its own name and store volume,
// JetStream on, and routes between all three.
func TestComposeClusterNodes(t *testing.T) {
	t.Parallel()
	p := loadProject(t, profileCluster)
	root := repoRoot(t)
	conf := natsClusterConfig(t)

	m := jetstreamBlockRe.FindStringSubmatch(conf)
	require.NotNilf(t, m, "%s must enable JetStream with a `jetstream { ... }` block", natsClusterConfRel)
	require.Regexpf(t, syncAlwaysRe, m[1], "%s: every node must fsync every write (`sync_interval: always`)", natsClusterConfRel)
	sd := storeDirRe.FindStringSubmatch(m[1])
	require.NotNilf(t, sd, "%s: the jetstream block must set store_dir", natsClusterConfRel)
	storeDir := sd[1]

	cb := clusterBlockRe.FindStringSubmatch(conf)
	require.NotNilf(t, cb, "%s must have a `cluster { ... }` block", natsClusterConfRel)
	lp := clusterPortRe.FindStringSubmatch(cb[1])
	require.NotNilf(t, lp, "%s: the cluster block must listen on a route port", natsClusterConfRel)
	rb := routesRe.FindStringSubmatch(cb[1])
	require.NotNilf(t, rb, "%s: the cluster block must list its routes", natsClusterConfRel)
	routes := map[string]string{}
	for _, r := range routeRe.FindAllStringSubmatch(rb[1], -1) {
		routes[r[1]] = r[2]
	}

	names := map[string]bool{}
	volumes := map[string]bool{}
	for _, node := range natsNodes {
		svc := service(t, p, node)
		require.Equalf(t, []string{profileCluster}, svc.Profiles, "service %q belongs to the cluster profile only", node)
		require.Containsf(t, routes, node, "%s must route to %s", natsClusterConfRel, node)
		require.Equalf(t, lp[1], routes[node], "%s: the route to %s must use the cluster port %s", natsClusterConfRel, node, lp[1])

		var confTarget string
		var storeVolume string
		for _, v := range svc.Volumes {
			src := v.Source
			if v.Type == types.VolumeTypeBind && !filepath.IsAbs(src) {
				src = filepath.Join(root, src)
			}
			switch {
			case v.Type == types.VolumeTypeBind && filepath.Clean(src) == filepath.Join(root, natsClusterConfRel):
				confTarget = v.Target
				require.Truef(t, v.ReadOnly, "service %q: %s should be mounted read-only", node, natsClusterConfRel)
			case v.Type == types.VolumeTypeVolume && v.Target == storeDir:
				storeVolume = v.Source
				require.Containsf(t, p.Volumes, v.Source, "volume %q must be declared at top level", v.Source)
			}
		}
		require.NotEmptyf(t, confTarget, "service %q must bind-mount %s", node, natsClusterConfRel)
		require.NotEmptyf(t, storeVolume, "service %q: the JetStream store_dir %q must be a named volume", node, storeDir)
		require.Falsef(t, volumes[storeVolume], "service %q shares the store volume %q with another node", node, storeVolume)
		volumes[storeVolume] = true

		cmd := []string(svc.Command)
		i := slices.IndexFunc(cmd, func(a string) bool { return a == "--config" || a == "-c" })
		require.GreaterOrEqualf(t, i, 0, "service %q must start with `--config %s`; command is %q", node, confTarget, cmd)
		require.Less(t, i+1, len(cmd))
		require.Equalf(t, confTarget, cmd[i+1], "service %q must read the mounted %s", node, natsClusterConfRel)
		j := slices.IndexFunc(cmd, func(a string) bool { return a == "--name" || a == "-n" })
		require.GreaterOrEqualf(t, j, 0, "service %q must name itself (`--name %s`): JetStream needs a name per node", node, node)
		require.Less(t, j+1, len(cmd))
		require.Falsef(t, names[cmd[j+1]], "service %q reuses the server name %q", node, cmd[j+1])
		names[cmd[j+1]] = true
		require.NotNilf(t, svc.HealthCheck, "service %q needs a healthcheck (the cluster stack waits for it)", node)
	}
	require.Lenf(t, routes, len(natsNodes), "%s routes to %q; want exactly the nodes %q", natsClusterConfRel, routes, natsNodes)
}

// TestComposeClusterApps: the cluster stack's processes connect to all three
// nodes, ask for an R3 stream, use a database of their own and wait for the
// nodes and their migration.
func TestComposeClusterApps(t *testing.T) {
	t.Parallel()
	p := loadProject(t, profileCluster)
	var wantURLs []string
	for _, node := range natsNodes {
		wantURLs = append(wantURLs, "nats://"+node+":4222")
	}
	for _, name := range []string{svcMigrateCluster, svcAPICluster, svcRelayCluster, svcWorkerCluster, svcDispatcherCluster} {
		svc := service(t, p, name)
		require.Equalf(t, []string{profileCluster}, svc.Profiles, "service %q belongs to the cluster profile only", name)
		env := svc.Environment
		require.NotNilf(t, env["NATS_URL"], "service %q needs NATS_URL", name)
		require.ElementsMatchf(t, wantURLs, strings.Split(*env["NATS_URL"], ","),
			"service %q: NATS_URL must list every node's client URL, comma-separated", name)
		require.NotNilf(t, env["QUILL_STREAM_REPLICAS"], "service %q must set QUILL_STREAM_REPLICAS", name)
		require.Equalf(t, "3", *env["QUILL_STREAM_REPLICAS"], "service %q: the cluster's stream has three replicas", name)
		require.NotNilf(t, env["DATABASE_URL"], "service %q needs DATABASE_URL", name)
		dbURL, err := url.Parse(*env["DATABASE_URL"])
		require.NoError(t, err)
		require.Equalf(t, "postgres:5432", dbURL.Host, "service %q: DATABASE_URL must point at the postgres service", name)
		require.Equalf(t, "/quill_cluster", dbURL.Path,
			"service %q: the cluster stack keeps its own database, so both stacks may run at once without sharing an outbox", name)
		if name == svcMigrateCluster {
			continue
		}
		dep, ok := svc.DependsOn[svcMigrateCluster]
		require.Truef(t, ok, "service %q must depend on %s", name, svcMigrateCluster)
		require.Equal(t, types.ServiceConditionCompletedSuccessfully, dep.Condition)
		for _, node := range natsNodes {
			dep, ok := svc.DependsOn[node]
			require.Truef(t, ok, "service %q must depend on %s", name, node)
			require.Equalf(t, types.ServiceConditionHealthy, dep.Condition, "service %q must wait for %s to be healthy", name, node)
		}
	}
	for _, pair := range [][2]string{{svcAPI, svcAPICluster}, {svcRelay, svcRelayCluster}, {svcWorker, svcWorkerCluster}, {svcDispatcher, svcDispatcherCluster}} {
		require.Equalf(t, service(t, p, pair[0]).Command, service(t, p, pair[1]).Command, "service %q must run what %q runs", pair[1], pair[0])
	}
}

// TestComposeWebhookDispatcher: each stack runs the dispatcher after its
// migration, with a QUILL_WEBHOOK_SECRET_KEY the dispatcher accepts and
// that is the API's own (the API seals the endpoints' secrets, the
// dispatcher opens them), and delivering to the private addresses a local
// stack's receivers have.
func TestComposeWebhookDispatcher(t *testing.T) {
	t.Parallel()
	p := loadProject(t, profileCluster)
	for _, pair := range [][3]string{{svcDispatcher, svcAPI, svcMigrate}, {svcDispatcherCluster, svcAPICluster, svcMigrateCluster}} {
		d, api := service(t, p, pair[0]), service(t, p, pair[1])
		require.Equalf(t, types.ShellCommand{"webhook-dispatcher"}, d.Command, "service %q runs the dispatcher", pair[0])
		dep, ok := d.DependsOn[pair[2]]
		require.Truef(t, ok, "service %q must depend on %s", pair[0], pair[2])
		require.Equal(t, types.ServiceConditionCompletedSuccessfully, dep.Condition)

		key := d.Environment[whsecret.KeyEnv]
		require.NotNilf(t, key, "service %q needs %s: without it the dispatcher does not start", pair[0], whsecret.KeyEnv)
		_, err := whsecret.ParseKeys(*key)
		require.NoErrorf(t, err, "service %q: %s", pair[0], whsecret.KeyEnv)
		apiKey := api.Environment[whsecret.KeyEnv]
		require.NotNilf(t, apiKey, "service %q needs %s to seal the endpoints' secrets", pair[1], whsecret.KeyEnv)
		require.Equalf(t, *key, *apiKey, "services %q and %q must share %s: the dispatcher opens what the API sealed", pair[0], pair[1], whsecret.KeyEnv)

		allow := d.Environment["QUILL_WEBHOOK_ALLOW_PRIVATE"]
		require.NotNilf(t, allow, "service %q: a local stack's receivers have private addresses", pair[0])
		require.Equal(t, "true", *allow)
	}
}

// TestComposeHealthchecks: every daemon built from ./Dockerfile, in every
// profile, has a healthcheck, and it is its own program's probe — the
// image has no shell or HTTP client — with a start period and retries.
func TestComposeHealthchecks(t *testing.T) {
	t.Parallel()
	p := loadProject(t, profileCluster)
	seen := 0
	for _, name := range p.ServiceNames() {
		svc := service(t, p, name)
		if svc.Build == nil || len(svc.Command) == 0 || svc.Command[0] == "api" && len(svc.Command) > 1 && svc.Command[1] == "migrate" {
			continue
		}
		seen++
		prog := svc.Command[0]
		require.NotNilf(t, svc.HealthCheck, "service %q has a healthcheck", name)
		require.Equalf(t, types.HealthCheckTest{"CMD", "/usr/local/bin/" + prog, "probe"}, svc.HealthCheck.Test,
			"service %q's healthcheck is %s's probe", name, prog)
		require.NotNilf(t, svc.HealthCheck.StartPeriod, "service %q: a start period", name)
		require.NotNilf(t, svc.HealthCheck.Retries, "service %q: retries", name)
	}
	require.Equal(t, 8, seen, "four daemons, single-node and cluster")
}
