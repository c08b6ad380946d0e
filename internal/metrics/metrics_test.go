package metrics_test

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/buildinfo"
	"github.com/quillhq/quill/internal/metrics"
)

func TestNewRegistryExportsBuildInfo(t *testing.T) {
	t.Parallel()
	families, err := metrics.NewRegistry().Gather()
	require.NoError(t, err)
	var got *dto.MetricFamily
	for _, f := range families {
		if f.GetName() == "quill_build_info" {
			got = f
		}
	}
	require.NotNil(t, got, "quill_build_info is exported")
	require.Equal(t, dto.MetricType_GAUGE, got.GetType())
	require.Len(t, got.GetMetric(), 1)
	m := got.GetMetric()[0]
	require.Equal(t, 1.0, m.GetGauge().GetValue())
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	info := buildinfo.Read()
	require.Equal(t, map[string]string{"version": info.Version, "goversion": info.GoVersion}, labels,
		"the version --version prints")
	require.NotEmpty(t, info.Version)
	require.NotEmpty(t, info.GoVersion)
}
