package helm_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "quill"
	repoRoot  = "../.."
	release_  = "quill"
	namespace = "quill"
)

// kubeVersion is the cluster the chart is rendered and linted for: Helm's
// test builds otherwise assume v1.20, below the chart's kubeVersion.
var kubeVersion = mustKubeVersion("v1.33.0")

func mustKubeVersion(v string) *common.KubeVersion {
	kv, err := common.ParseKubeVersion(v)
	if err != nil {
		panic(err)
	}
	return kv
}

// program is what the chart must know of each daemon: its Deployment's
// component name, its admin port (the programs' default QUILL_ADMIN_ADDR,
// docs/operations.md), and the longest its graceful shutdown takes after
// SIGTERM (docs/operations.md's systemd table).
type program struct {
	component string
	unit      string
	adminPort int32
	grace     time.Duration
}

var programs = []program{
	{"api", "quill-api.service", 9090, 30 * time.Second},
	{"relay", "quill-relay.service", 9091, 110 * time.Second},
	{"attachment-worker", "quill-attachment-worker.service", 9092, 65 * time.Second},
	{"webhook-dispatcher", "quill-webhook-dispatcher.service", 9093, 70 * time.Second},
}

// secretSettings are the settings that hold secrets: they may only be read
// from a Secret.
var secretSettings = []string{"DATABASE_URL", "QUILL_RELAY_DATABASE_URL", "QUILL_WEBHOOK_SECRET_KEY"}

// rendering is one chart rendering, decoded.
type rendering struct {
	deployments     map[string]*appsv1.Deployment
	services        map[string]*corev1.Service
	pdbs            []*policyv1.PodDisruptionBudget
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	jobs            []*batchv1.Job
	hooks           map[string]*release.Hook // by Job name
	serviceAccounts []*corev1.ServiceAccount
	serviceMonitors []*monitoringv1.ServiceMonitor
	rules           []*monitoringv1.PrometheusRule
	objects         []metav1.Object
}

// valuesFile reads a values file as Helm does.
func valuesFile(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, yaml.Unmarshal(b, &v))
	return v
}

// render renders the chart as `helm template` does (client-only install,
// hooks included) with vals over the chart's values.yaml.
func render(ctx context.Context, vals map[string]any) (*release.Release, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.Replace = true
	install.ReleaseName = release_
	install.Namespace = namespace
	install.KubeVersion = kubeVersion
	rel, err := install.RunWithContext(ctx, chrt, vals)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	r, ok := rel.(*release.Release)
	if !ok {
		return nil, fmt.Errorf("render: a %T, not a v1 release", rel)
	}
	return r, nil
}

// decodeStrict decodes one manifest into the Go type of its apiVersion and
// kind, refusing unknown and duplicate fields; a kind the chart should not
// render is an error.
func decodeStrict(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, fmt.Errorf("type: %w", err)
	}
	var obj any
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "v1 ServiceAccount":
		obj = &corev1.ServiceAccount{}
	case "batch/v1 Job":
		obj = &batchv1.Job{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "autoscaling/v2 HorizontalPodAutoscaler":
		obj = &autoscalingv2.HorizontalPodAutoscaler{}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		obj = &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1 PrometheusRule":
		obj = &monitoringv1.PrometheusRule{}
	default:
		return nil, fmt.Errorf("unexpected kind %q of %q", tm.Kind, tm.APIVersion)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

// decode decodes every manifest and hook of a release strictly.
func decode(t *testing.T, rel *release.Release) *rendering {
	t.Helper()
	r := &rendering{
		deployments: map[string]*appsv1.Deployment{},
		services:    map[string]*corev1.Service{},
		hooks:       map[string]*release.Hook{},
	}
	var docs []string
	for _, d := range releaseutil.SplitManifests(rel.Manifest) {
		docs = append(docs, d)
	}
	hookOf := map[string]*release.Hook{}
	for _, h := range rel.Hooks {
		docs = append(docs, h.Manifest)
		hookOf[h.Manifest] = h
	}
	for _, d := range docs {
		obj, err := decodeStrict([]byte(d))
		require.NoError(t, err, "manifest:\n%s", d)
		switch o := obj.(type) {
		case *appsv1.Deployment:
			r.deployments[o.Name] = o
		case *corev1.Service:
			r.services[o.Name] = o
		case *corev1.ServiceAccount:
			r.serviceAccounts = append(r.serviceAccounts, o)
		case *batchv1.Job:
			r.jobs = append(r.jobs, o)
			if h := hookOf[d]; h != nil {
				r.hooks[o.Name] = h
			}
		case *policyv1.PodDisruptionBudget:
			r.pdbs = append(r.pdbs, o)
		case *autoscalingv2.HorizontalPodAutoscaler:
			r.hpas = append(r.hpas, o)
		case *monitoringv1.ServiceMonitor:
			r.serviceMonitors = append(r.serviceMonitors, o)
		case *monitoringv1.PrometheusRule:
			r.rules = append(r.rules, o)
		}
		r.objects = append(r.objects, obj.(metav1.Object))
	}
	return r
}

// unitCommands reads each daemon's command from deploy/systemd's units
// (ExecStart less the binary's directory): the chart runs the same.
func unitCommands(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range programs {
		f, err := os.Open(filepath.Join(repoRoot, "deploy/systemd", p.unit))
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "ExecStart="); ok {
				fields := strings.Fields(rest)
				fields[0] = filepath.Base(fields[0])
				out[p.component] = fields
			}
		}
		require.NoError(t, f.Close())
		require.NotEmpty(t, out[p.component], "no ExecStart in %s", p.unit)
	}
	return out
}

// prometheusJobs maps an admin port to the job name that
// deploy/prometheus/prometheus.yml scrapes it under (the names the alert
// rules use).
func prometheusJobs(t *testing.T) map[int32]string {
	t.Helper()
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			StaticConfigs []struct {
				Targets []string `json:"targets"`
			} `json:"static_configs"`
			DNSSDConfigs []struct {
				Port int32 `json:"port"`
			} `json:"dns_sd_configs"`
		} `json:"scrape_configs"`
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/prometheus/prometheus.yml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &cfg))
	jobs := map[int32]string{}
	for _, sc := range cfg.ScrapeConfigs {
		for _, s := range sc.StaticConfigs {
			for _, target := range s.Targets {
				_, port, err := net.SplitHostPort(target)
				require.NoError(t, err)
				n, err := strconv.ParseInt(port, 10, 32)
				require.NoError(t, err)
				jobs[int32(n)] = sc.JobName
			}
		}
		for _, d := range sc.DNSSDConfigs {
			jobs[d.Port] = sc.JobName
		}
	}
	return jobs
}

func envOf(c corev1.Container, name string) (corev1.EnvVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return corev1.EnvVar{}, false
}

// checkPodSecurity: non-root, read-only root file system, no privilege
// escalation, no capabilities, the runtime's seccomp profile, no token.
func checkPodSecurity(t *testing.T, name string, spec corev1.PodSpec) {
	t.Helper()
	psc := spec.SecurityContext
	require.NotNil(t, psc, name)
	require.NotNil(t, psc.RunAsNonRoot, name)
	require.True(t, *psc.RunAsNonRoot, name)
	require.NotNil(t, psc.RunAsUser, name)
	require.NotZero(t, *psc.RunAsUser, name)
	require.NotNil(t, psc.SeccompProfile, name)
	require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, psc.SeccompProfile.Type, name)
	require.NotNil(t, spec.AutomountServiceAccountToken, name)
	require.False(t, *spec.AutomountServiceAccountToken, name)
	require.NotEmpty(t, spec.Containers, name)
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		sc := c.SecurityContext
		require.NotNil(t, sc, "%s/%s", name, c.Name)
		require.NotNil(t, sc.ReadOnlyRootFilesystem, "%s/%s", name, c.Name)
		require.True(t, *sc.ReadOnlyRootFilesystem, "%s/%s readOnlyRootFilesystem", name, c.Name)
		require.NotNil(t, sc.AllowPrivilegeEscalation, "%s/%s", name, c.Name)
		require.False(t, *sc.AllowPrivilegeEscalation, "%s/%s allowPrivilegeEscalation", name, c.Name)
		require.True(t, sc.Privileged == nil || !*sc.Privileged, "%s/%s privileged", name, c.Name)
		require.NotNil(t, sc.Capabilities, "%s/%s", name, c.Name)
		require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, "%s/%s drops ALL", name, c.Name)
		require.Empty(t, sc.Capabilities.Add, "%s/%s adds none", name, c.Name)
		require.True(t, sc.RunAsUser == nil || *sc.RunAsUser != 0, "%s/%s runs as root", name, c.Name)
		require.NotNil(t, c.Resources.Requests.Memory(), "%s/%s", name, c.Name)
		require.False(t, c.Resources.Requests.Memory().IsZero(), "%s/%s requests memory", name, c.Name)
		require.False(t, c.Resources.Limits.Memory().IsZero(), "%s/%s limits memory", name, c.Name)
		checkEnv(t, name+"/"+c.Name, c)
	}
	for _, v := range spec.Volumes {
		// Secrets mounted as files (NATS's), nothing writable, no host path.
		require.NotNil(t, v.Secret, "%s: volume %s is not a Secret", name, v.Name)
	}
}

// checkEnv: secrets only by reference, no setting twice, no credentials in
// a plain value.
func checkEnv(t *testing.T, name string, c corev1.Container) {
	t.Helper()
	seen := map[string]bool{}
	for _, e := range c.Env {
		require.False(t, seen[e.Name], "%s sets %s twice", name, e.Name)
		seen[e.Name] = true
		if slices.Contains(secretSettings, e.Name) {
			require.Empty(t, e.Value, "%s: %s has a value, not a Secret reference", name, e.Name)
			require.NotNil(t, e.ValueFrom, "%s: %s", name, e.Name)
			require.NotNil(t, e.ValueFrom.SecretKeyRef, "%s: %s is not read from a Secret", name, e.Name)
			require.NotEmpty(t, e.ValueFrom.SecretKeyRef.Name, "%s: %s", name, e.Name)
			require.NotEmpty(t, e.ValueFrom.SecretKeyRef.Key, "%s: %s", name, e.Name)
			continue
		}
		if strings.Contains(e.Value, "://") {
			require.NotContains(t, e.Value, "@", "%s: %s holds credentials", name, e.Name)
		}
	}
	require.Empty(t, c.EnvFrom, "%s: envFrom hides what the container reads", name)
}

// checkRendering asserts everything the chart promises of any values.
func checkRendering(t *testing.T, r *rendering, vals map[string]any) {
	t.Helper()
	commands := unitCommands(t)
	jobs := prometheusJobs(t)

	for _, o := range r.objects {
		require.Equal(t, namespace, o.GetNamespace(), "%s has no namespace", o.GetName())
		require.Equal(t, release_, o.GetLabels()["app.kubernetes.io/instance"], "%s", o.GetName())
	}

	// The four daemons, each as its systemd unit runs it.
	require.Len(t, r.deployments, len(programs))
	delay, _ := vals["shutdownDelay"].(string)
	for _, p := range programs {
		name := release_ + "-" + p.component
		d := r.deployments[name]
		require.NotNil(t, d, "no Deployment %s", name)
		spec := d.Spec.Template.Spec
		checkPodSecurity(t, name, spec)
		require.Len(t, spec.Containers, 1, name)
		c := spec.Containers[0]
		require.Equal(t, commands[p.component], c.Command, "%s runs what %s runs", name, p.unit)

		// Probes: httpGet on the admin port, whose number is the admin
		// address the program is told.
		var admin int32
		for _, port := range c.Ports {
			if port.Name == "admin" {
				admin = port.ContainerPort
			}
		}
		require.Equal(t, p.adminPort, admin, "%s admin port", name)
		addr, ok := envOf(c, "QUILL_ADMIN_ADDR")
		require.True(t, ok, "%s sets no QUILL_ADMIN_ADDR", name)
		require.Equal(t, fmt.Sprintf(":%d", admin), addr.Value, name)
		for _, pr := range []struct {
			probe *corev1.Probe
			path  string
		}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}, {c.StartupProbe, "/healthz"}} {
			require.NotNil(t, pr.probe, "%s lacks a probe on %s", name, pr.path)
			require.NotNil(t, pr.probe.HTTPGet, name)
			require.Equal(t, pr.path, pr.probe.HTTPGet.Path, name)
			require.Equal(t, "admin", pr.probe.HTTPGet.Port.String(), name)
		}
		if p.component == "api" {
			httpAddr, ok := envOf(c, "QUILL_HTTP_ADDR")
			require.True(t, ok, name)
			require.Equal(t, ":8080", httpAddr.Value, name)
		}

		// Graceful shutdown: the delay, then the program's grace, inside
		// the grace period Kubernetes gives before SIGKILL.
		var d0 time.Duration
		if delay != "" {
			e, ok := envOf(c, "QUILL_SHUTDOWN_DELAY")
			require.True(t, ok, "%s sets no QUILL_SHUTDOWN_DELAY", name)
			var err error
			d0, err = time.ParseDuration(e.Value)
			require.NoError(t, err, name)
			require.Positive(t, d0, name)
		}
		require.NotNil(t, spec.TerminationGracePeriodSeconds, name)
		grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
		require.Greater(t, grace, d0+p.grace, "%s: terminationGracePeriodSeconds below the delay + the program's grace", name)

		// Every daemon reads the database and NATS; the dispatcher needs
		// the webhook key.
		_, ok = envOf(c, "DATABASE_URL")
		require.True(t, ok, name)
		_, ok = envOf(c, "NATS_URL")
		require.True(t, ok, name)
		if key, ok := envOf(c, "QUILL_WEBHOOK_SECRET_KEY"); ok {
			// The API starts without the key; the dispatcher does not.
			optional := key.ValueFrom.SecretKeyRef.Optional != nil && *key.ValueFrom.SecretKeyRef.Optional
			require.Equal(t, p.component == "api", optional, "%s: QUILL_WEBHOOK_SECRET_KEY optional", name)
		} else {
			require.NotEqual(t, "webhook-dispatcher", p.component, "%s needs QUILL_WEBHOOK_SECRET_KEY", name)
		}

		// A rollout adds a pod before it takes one away.
		require.NotNil(t, d.Spec.Strategy.RollingUpdate, name)
		require.Equal(t, "0", d.Spec.Strategy.RollingUpdate.MaxUnavailable.String(), name)

		// Exactly one PodDisruptionBudget selects this Deployment's pods.
		podLabels := labels.Set(d.Spec.Template.Labels)
		var budgets int
		for _, pdb := range r.pdbs {
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			require.NoError(t, err)
			require.False(t, sel.Empty(), pdb.Name)
			if sel.Matches(podLabels) {
				budgets++
				require.True(t, pdb.Spec.MaxUnavailable != nil || pdb.Spec.MinAvailable != nil, pdb.Name)
				require.NotNil(t, pdb.Spec.UnhealthyPodEvictionPolicy, pdb.Name)
				require.Equal(t, policyv1.AlwaysAllow, *pdb.Spec.UnhealthyPodEvictionPolicy, pdb.Name)
			}
		}
		require.Equal(t, 1, budgets, "%s: PodDisruptionBudgets selecting its pods", name)

		// Its admin Service selects its pods, on the admin port.
		svc := r.services[name+"-admin"]
		require.NotNil(t, svc, "no admin Service for %s", name)
		require.Equal(t, corev1.ServiceTypeClusterIP, svc.Spec.Type, svc.Name)
		require.True(t, labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels), svc.Name)
		require.Len(t, svc.Spec.Ports, 1, svc.Name)
		require.Equal(t, "admin", svc.Spec.Ports[0].TargetPort.String(), svc.Name)
		require.Equal(t, admin, svc.Spec.Ports[0].Port, svc.Name)

		// The ServiceMonitor, when on: that Service, the job name the
		// alert rules know this program by.
		for _, sm := range r.serviceMonitors {
			if sm.Name != name {
				continue
			}
			sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
			require.NoError(t, err)
			var matched []string
			for _, s := range r.services {
				if sel.Matches(labels.Set(s.Labels)) {
					matched = append(matched, s.Name)
				}
			}
			require.Equal(t, []string{svc.Name}, matched, sm.Name)
			require.Len(t, sm.Spec.Endpoints, 1, sm.Name)
			ep := sm.Spec.Endpoints[0]
			require.Equal(t, "admin", ep.Port, sm.Name)
			require.Equal(t, "/metrics", ep.Path, sm.Name)
			var job string
			for _, rl := range ep.RelabelConfigs {
				if rl.TargetLabel == "job" && rl.Replacement != nil {
					job = *rl.Replacement
				}
			}
			require.Equal(t, jobs[p.adminPort], job, "%s: the job prometheus.yml scrapes port %d under", sm.Name, p.adminPort)
		}
	}

	// The API's Service, and its HPA on CPU.
	api := r.deployments[release_+"-api"]
	apiSvc := r.services[release_+"-api"]
	require.NotNil(t, apiSvc)
	require.True(t, labels.SelectorFromSet(apiSvc.Spec.Selector).Matches(labels.Set(api.Spec.Template.Labels)))
	require.Len(t, apiSvc.Spec.Ports, 1, "the API's Service exposes no admin port")
	require.Equal(t, "http", apiSvc.Spec.Ports[0].TargetPort.String())
	require.Len(t, r.hpas, 1)
	hpa := r.hpas[0]
	require.Equal(t, autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: api.Name}, hpa.Spec.ScaleTargetRef)
	require.Len(t, hpa.Spec.Metrics, 1)
	require.Equal(t, corev1.ResourceCPU, hpa.Spec.Metrics[0].Resource.Name)
	require.Nil(t, api.Spec.Replicas, "the HPA owns the API's replicas")
	require.False(t, api.Spec.Template.Spec.Containers[0].Resources.Requests.Cpu().IsZero(), "an HPA on CPU needs a CPU request")
	require.GreaterOrEqual(t, *hpa.Spec.MinReplicas, int32(2))
	for _, p := range programs[1:] {
		d := r.deployments[release_+"-"+p.component]
		require.NotNil(t, d.Spec.Replicas, d.Name)
		require.GreaterOrEqual(t, *d.Spec.Replicas, int32(2), "%s: two or more for availability", d.Name)
	}

	// The migration: `api migrate`, a Job Helm runs before install and
	// upgrade, not an object of the release.
	require.Len(t, r.jobs, 1)
	job := r.jobs[0]
	hook := r.hooks[job.Name]
	require.NotNil(t, hook, "the migration Job is not a hook")
	require.ElementsMatch(t, []release.HookEvent{release.HookPreInstall, release.HookPreUpgrade}, hook.Events)
	require.Contains(t, hook.DeletePolicies, release.HookBeforeHookCreation)
	require.Equal(t, []string{"api", "migrate"}, job.Spec.Template.Spec.Containers[0].Command)
	require.Equal(t, corev1.RestartPolicyNever, job.Spec.Template.Spec.RestartPolicy)
	checkPodSecurity(t, job.Name, job.Spec.Template.Spec)
	_, ok := envOf(job.Spec.Template.Spec.Containers[0], "DATABASE_URL")
	require.True(t, ok)

	for _, sa := range r.serviceAccounts {
		require.NotNil(t, sa.AutomountServiceAccountToken, sa.Name)
		require.False(t, *sa.AutomountServiceAccountToken, sa.Name)
	}

	// The alert rules, when on: exactly deploy/prometheus/quill.rules.yml.
	if len(r.rules) > 0 {
		require.Len(t, r.rules, 1)
		b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/prometheus/quill.rules.yml"))
		require.NoError(t, err)
		var want monitoringv1.PrometheusRuleSpec
		require.NoError(t, yaml.UnmarshalStrict(b, &want))
		require.NotEmpty(t, want.Groups)
		require.Equal(t, want, r.rules[0].Spec)
	}
}

func TestChartLintsStrictly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vals func(t *testing.T) map[string]any
	}{
		{"default values", func(*testing.T) map[string]any { return map[string]any{} }},
		{"values-production.yaml", func(t *testing.T) map[string]any {
			return valuesFile(t, filepath.Join(chartDir, "values-production.yaml"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = namespace
			lint.KubeVersion = kubeVersion
			res := lint.Run([]string{chartDir}, tc.vals(t))
			for _, m := range res.Messages {
				t.Log(m)
			}
			require.Empty(t, res.Errors)
			require.Equal(t, 1, res.TotalChartsLinted)
		})
	}
}

func TestDefaultValuesRender(t *testing.T) {
	t.Parallel()
	rel, err := render(t.Context(), map[string]any{})
	require.NoError(t, err)
	r := decode(t, rel)
	checkRendering(t, r, valuesFile(t, filepath.Join(chartDir, "values.yaml")))
	require.Empty(t, r.serviceMonitors, "off by default: needs prometheus-operator's CRDs")
	require.Empty(t, r.rules, "off by default: needs prometheus-operator's CRDs")
	require.Len(t, r.serviceAccounts, 1)
}

func TestProductionValuesRender(t *testing.T) {
	t.Parallel()
	vals := valuesFile(t, filepath.Join(chartDir, "values-production.yaml"))
	rel, err := render(t.Context(), vals)
	require.NoError(t, err)
	r := decode(t, rel)
	checkRendering(t, r, valuesFile(t, filepath.Join(chartDir, "values.yaml")))
	require.Len(t, r.serviceMonitors, len(programs))
	require.Len(t, r.rules, 1)

	// The Secrets it names, each where it belongs.
	ref := func(c corev1.Container, name string) string {
		e, ok := envOf(c, name)
		require.True(t, ok, "%s unset in %s", name, c.Name)
		return e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
	}
	relay := r.deployments[release_+"-relay"].Spec.Template.Spec.Containers[0]
	require.Equal(t, "quill-database/QUILL_RELAY_DATABASE_URL", ref(relay, "QUILL_RELAY_DATABASE_URL"))
	replicas, _ := envOf(relay, "QUILL_STREAM_REPLICAS")
	require.Equal(t, "3", replicas.Value)
	job := r.jobs[0].Spec.Template.Spec.Containers[0]
	require.Equal(t, "quill-migrate/DATABASE_URL", ref(job, "DATABASE_URL"))
	for _, p := range programs {
		d := r.deployments[release_+"-"+p.component]
		c := d.Spec.Template.Spec.Containers[0]
		require.Equal(t, "quill-database/DATABASE_URL", ref(c, "DATABASE_URL"), d.Name)
		natsURL, _ := envOf(c, "NATS_URL")
		require.Len(t, strings.Split(natsURL.Value, ","), 3, "%s: the three NATS nodes", d.Name)
		creds, _ := envOf(c, "QUILL_NATS_CREDS")
		require.Equal(t, "/etc/quill/nats-creds/nats.creds", creds.Value, d.Name)
		ca, _ := envOf(c, "QUILL_NATS_TLS_CA")
		require.Equal(t, "/etc/quill/nats-tls/ca.crt", ca.Value, d.Name)
		// The files' directories are mounted from the Secrets named.
		mounts := map[string]string{}
		for _, m := range c.VolumeMounts {
			require.True(t, m.ReadOnly, "%s: %s", d.Name, m.Name)
			mounts[m.MountPath] = m.Name
		}
		vols := map[string]string{}
		for _, v := range d.Spec.Template.Spec.Volumes {
			vols[v.Name] = v.Secret.SecretName
		}
		require.Equal(t, "quill-nats-creds", vols[mounts["/etc/quill/nats-creds"]], d.Name)
		require.Equal(t, "quill-nats-tls", vols[mounts["/etc/quill/nats-tls"]], d.Name)
		if p.component == "api" || p.component == "webhook-dispatcher" {
			require.Equal(t, "quill-webhooks/QUILL_WEBHOOK_SECRET_KEY", ref(c, "QUILL_WEBHOOK_SECRET_KEY"), d.Name)
		}
	}
}

// The chart can read only its own files: its copy of the rules must be the
// rules promtool tests.
func TestPrometheusRuleCopyIsTheRulesFile(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile(filepath.Join(repoRoot, "deploy/prometheus/quill.rules.yml"))
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(chartDir, "files/quill.rules.yml"))
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got),
		"deploy/helm/quill/files/quill.rules.yml differs from deploy/prometheus/quill.rules.yml: cp deploy/prometheus/quill.rules.yml deploy/helm/quill/files/")
}

// Values that cannot make a working installation are refused at render
// time, with the setting named.
func TestBadValuesAreRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"no database Secret", map[string]any{"database": map[string]any{"url": map[string]any{"existingSecret": ""}}}, "DATABASE_URL: existingSecret names no Secret"},
		{"dispatcher without the webhook key", map[string]any{"webhooks": map[string]any{"secretKey": map[string]any{"existingSecret": ""}}}, "QUILL_WEBHOOK_SECRET_KEY: existingSecret names no Secret"},
		{"a NATS certificate without its key", map[string]any{"nats": map[string]any{"tls": map[string]any{"existingSecret": "t", "cert": "tls.crt"}}}, "nats.tls.key is empty"},
		{"no NATS URL", map[string]any{"nats": map[string]any{"url": ""}}, "nats.url is empty"},
		// values.schema.json: a misspelt or ill-formed value is refused,
		// not ignored.
		{"a misspelt value", map[string]any{"api": map[string]any{"replica": 3}}, "replica"},
		{"a delay without a unit", map[string]any{"shutdownDelay": "5"}, "shutdownDelay"},
		{"stream replicas out of range", map[string]any{"nats": map[string]any{"streamReplicas": "7"}}, "streamReplicas"},
		{"a Secret reference without its key", map[string]any{"database": map[string]any{"relayURL": map[string]any{"existingSecret": "x", "key": nil}}}, "relayURL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := render(t.Context(), tc.vals)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// The decoding is strict: a misspelt or misplaced field is an error, not
// dropped.
func TestDecodeStrictRefusesUnknownFields(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, doc string
	}{
		{"misspelt field", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 2}\n"},
		{"misplaced field", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 80, path: /}]}\n"},
		{"duplicate field", "apiVersion: v1\nkind: Service\nmetadata: {name: x, name: y}\n"},
		{"unknown kind", "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n"},
		{"bad quantity", "apiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: c, resources: {requests: {cpu: lots}}}]}}}\n"},
		{"unknown rule field", "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec: {groups: [{name: g, rules: [{alert: A, expr: up, fo: 5m}]}]}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := decodeStrict([]byte(tc.doc))
			require.Error(t, err)
		})
	}
	_, err := decodeStrict([]byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: 2}\n"))
	require.NoError(t, err, "a correct manifest decodes")
}
