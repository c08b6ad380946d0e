package db

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		o    routeObservation
		want Route
	}{
		{"the backend key is the backend's", routeObservation{keyPID: 7, pid: 7}, RouteDirect},
		{"a pooler's key, and B got A's backend", routeObservation{keyPID: 99, pid: 7, otherPID: 7, againPID: 8}, RouteTransactionPooler},
		{"a pooler's key, and A moved to another backend", routeObservation{keyPID: 99, pid: 7, otherPID: 8, againPID: 9}, RouteTransactionPooler},
		{"a pooler's key, and A waited for a backend", routeObservation{keyPID: 99, pid: 7, otherPID: 8, blocked: true}, RouteTransactionPooler},
		{"a pooler's key, and A kept its backend", routeObservation{keyPID: 99, pid: 7, otherPID: 8, againPID: 7}, RouteSessionPooler},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, classify(tc.o))
		})
	}
}
