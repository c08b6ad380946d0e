package deploy_test

import (
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The observability profile: Prometheus and Grafana beside the stack.
const (
	profileObservability = "observability"
	svcPrometheus        = "prometheus"
	svcGrafana           = "grafana"

	prometheusConfRel  = "deploy/prometheus/prometheus.yml"
	prometheusRulesRel = "deploy/prometheus/quill.rules.yml"
	grafanaDatasources = "deploy/grafana/provisioning/datasources"
	grafanaProviders   = "deploy/grafana/provisioning/dashboards"
	grafanaDashboards  = "deploy/grafana/dashboards"
	dashboardRel       = "deploy/grafana/dashboards/quill.json"

	// prometheusPort is the port Prometheus listens on in its container.
	prometheusPort = 9090
)

// adminPorts are the admin ports of the processes (SPEC §2's
// QUILL_ADMIN_ADDR defaults), which compose.yaml keeps.
var adminPorts = map[string]uint32{svcAPI: 9090, svcRelay: 9091, svcWorker: 9092}

// mounts returns svc's bind mounts as container target → source path
// relative to the repository root.
func mounts(t *testing.T, svc types.ServiceConfig) map[string]string {
	t.Helper()
	root := repoRoot(t)
	out := map[string]string{}
	for _, v := range svc.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		src := v.Source
		if !filepath.IsAbs(src) {
			src = filepath.Join(root, src)
		}
		rel, err := filepath.Rel(root, src)
		require.NoError(t, err)
		require.Truef(t, v.ReadOnly, "service %q should mount %s read-only", svc.Name, rel)
		out[v.Target] = filepath.ToSlash(rel)
	}
	return out
}

// targetOf returns the container path where svc mounts the repository file
// or directory rel, failing when it does not mount it or it does not exist.
func targetOf(t *testing.T, svc types.ServiceConfig, rel string) string {
	t.Helper()
	for target, src := range mounts(t, svc) {
		if src == rel {
			return target
		}
	}
	require.Failf(t, "missing mount", "service %q must bind-mount %s; it mounts %v", svc.Name, rel, mounts(t, svc))
	return ""
}

// TestComposeObservabilityProfile: Prometheus and Grafana are in the
// observability profile only, so `docker compose up` starts neither, and
// every file they mount is in the repository.
func TestComposeObservabilityProfile(t *testing.T) {
	t.Parallel()
	p := loadProject(t)
	require.NotContains(t, p.ServiceNames(), svcPrometheus, "`docker compose up` without the profile starts no Prometheus")
	require.NotContains(t, p.ServiceNames(), svcGrafana)

	p = loadProject(t, profileObservability)
	root := repoRoot(t)
	for _, name := range []string{svcPrometheus, svcGrafana} {
		svc := service(t, p, name)
		require.Equalf(t, []string{profileObservability}, svc.Profiles, "service %q belongs to the observability profile", name)
		for target, src := range mounts(t, svc) {
			_, err := os.Stat(filepath.Join(root, src))
			require.NoErrorf(t, err, "service %q mounts %s at %s: it must exist", name, src, target)
		}
	}
	grafana := service(t, p, svcGrafana)
	_, ok := grafana.DependsOn[svcPrometheus]
	require.True(t, ok, "grafana depends on prometheus, its data source")
}

// prometheusConfig is the part of deploy/prometheus/prometheus.yml checked
// here.
type prometheusConfig struct {
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
		DNSSDConfigs []struct {
			Names []string `yaml:"names"`
			Type  string   `yaml:"type"`
			Port  uint32   `yaml:"port"`
		} `yaml:"dns_sd_configs"`
	} `yaml:"scrape_configs"`
}

// TestComposePrometheusScrapesEveryProcess: the Prometheus of the profile
// reads the mounted configuration and rules, and scrapes the API, the
// relays and the workers on the admin ports compose.yaml gives them —
// relays and workers through DNS, so every scaled container is a target.
func TestComposePrometheusScrapesEveryProcess(t *testing.T) {
	t.Parallel()
	p := loadProject(t, profileObservability)
	prom := service(t, p, svcPrometheus)
	confTarget := targetOf(t, prom, prometheusConfRel)
	require.Equal(t, "/etc/prometheus/prometheus.yml", confTarget, "the image's default command reads this path")
	require.Empty(t, prom.Command, "the image's own command, which reads /etc/prometheus/prometheus.yml")
	rulesTarget := targetOf(t, prom, prometheusRulesRel)

	var conf prometheusConfig
	require.NoError(t, yaml.Unmarshal([]byte(readFile(t, prometheusConfRel)), &conf))
	var rules []string
	for _, f := range conf.RuleFiles {
		if !path.IsAbs(f) {
			f = path.Join(path.Dir(confTarget), f)
		}
		rules = append(rules, f)
	}
	require.Equal(t, []string{rulesTarget}, rules, "the rules Prometheus loads are the mounted quill.rules.yml")

	scraped := map[string]uint32{} // compose service → port scraped
	for _, sc := range conf.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				host, port, err := net.SplitHostPort(target)
				require.NoError(t, err, "job %s: target %q", sc.JobName, target)
				n, err := strconv.ParseUint(port, 10, 16)
				require.NoError(t, err)
				scraped[host] = uint32(n)
			}
		}
		for _, dns := range sc.DNSSDConfigs {
			require.Equal(t, "A", dns.Type, "job %s: compose's DNS answers A records, one per container", sc.JobName)
			for _, name := range dns.Names {
				scraped[name] = dns.Port
			}
		}
	}
	for name, port := range adminPorts {
		svc := service(t, p, name)
		got, ok := scraped[name]
		require.Truef(t, ok, "Prometheus must scrape service %q; it scrapes %v", name, scraped)
		require.Equalf(t, port, got, "Prometheus scrapes %q on the wrong port", name)
		require.NotContainsf(t, svc.Environment, "QUILL_ADMIN_ADDR", "service %q keeps its default admin address, the one scraped", name)
		var targets []uint32
		for _, pc := range svc.Ports {
			targets = append(targets, pc.Target)
		}
		require.Containsf(t, targets, port, "service %q exposes its admin port %d", name, port)
	}
	for _, name := range []string{svcRelay, svcWorker} {
		for _, sc := range conf.ScrapeConfigs {
			for _, st := range sc.StaticConfigs {
				for _, target := range st.Targets {
					require.Falsef(t, strings.HasPrefix(target, name+":"),
						"service %q scales: scrape it through dns_sd_configs, a static target reaches one container", name)
				}
			}
		}
	}
}

// TestComposeGrafanaProvisioning: Grafana gets the data source (the
// profile's Prometheus, at its container port), the dashboard provider and
// the dashboard, which names that data source.
func TestComposeGrafanaProvisioning(t *testing.T) {
	t.Parallel()
	p := loadProject(t, profileObservability)
	grafana := service(t, p, svcGrafana)
	require.Equal(t, "/etc/grafana/provisioning/datasources", targetOf(t, grafana, grafanaDatasources))
	require.Equal(t, "/etc/grafana/provisioning/dashboards", targetOf(t, grafana, grafanaProviders))
	dashTarget := targetOf(t, grafana, grafanaDashboards)

	var ds struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(readFile(t, grafanaDatasources+"/prometheus.yml")), &ds))
	require.Len(t, ds.Datasources, 1)
	src := ds.Datasources[0]
	require.Equal(t, "prometheus", src.Type)
	u, err := url.Parse(src.URL)
	require.NoError(t, err)
	require.Equal(t, svcPrometheus, u.Hostname(), "the data source is the profile's Prometheus")
	require.Equal(t, strconv.Itoa(prometheusPort), u.Port())
	service(t, p, svcPrometheus)

	var providers struct {
		Providers []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(readFile(t, grafanaProviders+"/quill.yml")), &providers))
	require.Len(t, providers.Providers, 1)
	require.Equal(t, "file", providers.Providers[0].Type)
	require.Equal(t, dashTarget, providers.Providers[0].Options.Path, "the provider loads the mounted dashboards")
	home := grafana.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
	require.NotNil(t, home)
	require.Equal(t, path.Join(dashTarget, path.Base(dashboardRel)), *home, "the home dashboard is the mounted quill.json")

	// Every panel and query of the dashboard reads that data source.
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Type       string            `json:"type"`
			Datasource map[string]string `json:"datasource"`
			Targets    []struct {
				Datasource map[string]string `json:"datasource"`
				Expr       string            `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal([]byte(readFile(t, dashboardRel)), &dash))
	require.NotEmpty(t, dash.UID)
	queries := 0
	for _, panel := range dash.Panels {
		if panel.Type == "row" {
			continue
		}
		require.Equal(t, src.UID, panel.Datasource["uid"])
		for _, tg := range panel.Targets {
			require.Equal(t, src.UID, tg.Datasource["uid"])
			require.NotEmpty(t, tg.Expr)
			queries++
		}
	}
	require.Greater(t, queries, 10)
}
