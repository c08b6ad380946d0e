// Package helm tests Quill's Helm chart, deploy/helm/quill, without a
// cluster: Helm's own lint (strict) and Helm's own rendering (as `helm
// template` renders, through Helm's Go SDK), then every manifest decoded
// strictly into Kubernetes' Go types (and prometheus-operator's for the
// ServiceMonitors and the PrometheusRule) and checked for the properties
// docs/kubernetes.md promises. It is a module of its own so that Helm's and
// Kubernetes' dependencies stay out of Quill's go.mod; `make test` runs it.
// It has no exported API.
package helm
