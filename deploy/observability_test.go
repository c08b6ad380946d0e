package deploy_test

import (
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

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
var adminPorts = map[string]uint32{svcAPI: 9090, svcRelay: 9091, svcWorker: 9092, svcDispatcher: 9093}

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
// relays, workers and dispatchers through DNS, so every scaled container is
// a target.
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
	for _, name := range []string{svcRelay, svcWorker, svcDispatcher} {
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

// alertRule is an alerting rule of quill.rules.yml, as far as it is
// checked here.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Annotations map[string]string `yaml:"annotations"`
}

// alertRules returns every alerting rule of quill.rules.yml.
func alertRules(t *testing.T) []alertRule {
	t.Helper()
	var file struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(readFile(t, prometheusRulesRel)), &file))
	var out []alertRule
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	require.NotEmpty(t, out)
	return out
}

// runbookBase is where the rules' runbook links point: the repository's
// documentation on GitHub.
const runbookBase = "https://github.com/quillhq/quill/blob/main/"

// headingAnchor is the anchor GitHub gives a Markdown heading's text:
// lower case, punctuation but '-' and '_' dropped, spaces as '-'.
func headingAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestRulesLinkTheirRunbooks: every alert has a runbook_url into docs/,
// to the section named after the alert, and that section exists — a
// renamed heading or alert breaks this test, not the page an operator
// opens at night.
func TestRulesLinkTheirRunbooks(t *testing.T) {
	t.Parallel()
	anchors := map[string]map[string]bool{} // docs file → its headings' anchors
	for _, r := range alertRules(t) {
		u := r.Annotations["runbook_url"]
		require.Truef(t, strings.HasPrefix(u, runbookBase+"docs/"), "alert %s: runbook_url %q must point into %sdocs/", r.Alert, u, runbookBase)
		file, anchor, ok := strings.Cut(strings.TrimPrefix(u, runbookBase), "#")
		require.Truef(t, ok, "alert %s: runbook_url %q names no section", r.Alert, u)
		require.Equalf(t, strings.ToLower(r.Alert), anchor, "alert %s: its runbook is the section named after it", r.Alert)
		if anchors[file] == nil {
			anchors[file] = map[string]bool{}
			fenced := false // a "# comment" in a code block is no heading
			for _, line := range strings.Split(readFile(t, file), "\n") {
				if strings.HasPrefix(line, "```") {
					fenced = !fenced
				}
				if h, ok := strings.CutPrefix(line, "#"); ok && !fenced {
					anchors[file][headingAnchor(strings.TrimLeft(h, "#"))] = true
				}
			}
		}
		require.Truef(t, anchors[file][anchor], "alert %s: %s has no heading for #%s", r.Alert, file, anchor)
	}
}

// jobMatcher finds the jobs a rule's expression names.
var jobMatcher = regexp.MustCompile(`job="([^"]*)"`)

// TestRulesWatchEveryScrapeJob: each job of prometheus.yml has an alert
// for a target that fails its scrapes (up == 0) and one for a job with no
// target at all (absent), and the rules name no job prometheus.yml lacks.
func TestRulesWatchEveryScrapeJob(t *testing.T) {
	t.Parallel()
	var conf prometheusConfig
	require.NoError(t, yaml.Unmarshal([]byte(readFile(t, prometheusConfRel)), &conf))
	jobs := map[string]bool{}
	for _, sc := range conf.ScrapeConfigs {
		jobs[sc.JobName] = true
	}
	require.Len(t, jobs, len(adminPorts), "one job per process")
	rules := alertRules(t)
	for job := range jobs {
		var down, absent bool
		for _, r := range rules {
			expr := strings.Join(strings.Fields(r.Expr), " ")
			down = down || expr == `up{job="`+job+`"} == 0`
			absent = absent || expr == `absent(up{job="`+job+`"})`
		}
		require.Truef(t, down, "no alert has the expression up{job=%q} == 0", job)
		require.Truef(t, absent, "no alert has the expression absent(up{job=%q})", job)
	}
	for _, r := range rules {
		for _, m := range jobMatcher.FindAllStringSubmatch(r.Expr, -1) {
			require.Truef(t, jobs[m[1]], "alert %s names job %q, which prometheus.yml does not scrape", r.Alert, m[1])
		}
	}
}
