package e2e

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// profile sizes a run: the load and the faults scheduled over it.
type profile struct {
	Name    string
	Ops     int     // business operations
	Clients int     // concurrent clients
	Rate    float64 // operations started per second (fixed schedule)

	KillsEach       int           // random SIGKILLs of each of api, relay, worker
	TargetedEach    int           // relay kills between publish and mark; worker kills between commit and ack
	NATSOutages     int           // NATS stopped for NATSOutage each
	NATSOutage      time.Duration //
	PGRestarts      int           // pg_ctl -m fast restart
	DropProbability float64       // of a write's response at the proxy
	DropBursts      int           // "drop the next 10 responses"

	OpDeadline   time.Duration // how long a client keeps retrying one operation
	DrainTimeout time.Duration // how long the system may take to settle after the load

	// TestClusterFaults: each cycle shuts the stream leader down for
	// LeaderOutage, steps the meta leader down and stops one node for
	// NodeOutage.
	ClusterCycles int
	LeaderOutage  time.Duration
	NodeOutage    time.Duration
	BurstOps      int // creates in the burst right before each of those two faults
}

// Duration is the load's planned length.
func (p profile) Duration() time.Duration {
	return time.Duration(float64(p.Ops) / p.Rate * float64(time.Second))
}

// shortProfile runs in `go test ./...`: about 2,000 operations over ~75 s,
// every fault at least as often as the issue asks.
func shortProfile() profile {
	return profile{
		Name: "short", Ops: 2000, Clients: 64, Rate: 2000.0 / 75,
		KillsEach: 3, TargetedEach: 1, NATSOutages: 1, NATSOutage: 20 * time.Second, PGRestarts: 1,
		DropProbability: 0.1, DropBursts: 3,
		OpDeadline: 2 * time.Minute, DrainTimeout: 4 * time.Minute,
	}
}

// soakProfile is `make soak`: at least 50,000 operations at 120/s (about
// 7 minutes of load), faults scaled to the duration.
func soakProfile(ops int, rate float64) profile {
	p := profile{Name: "soak", Ops: ops, Clients: 64, Rate: rate, NATSOutage: 20 * time.Second,
		DropProbability: 0.1, OpDeadline: 3 * time.Minute, DrainTimeout: 20 * time.Minute}
	secs := p.Duration().Seconds()
	p.KillsEach = max(3, int(secs/30))
	p.TargetedEach = max(1, int(secs/90))
	p.NATSOutages = max(1, int(secs/150))
	p.PGRestarts = max(1, int(secs/200))
	p.DropBursts = max(3, int(secs/30))
	return p
}

// clusterShortProfile is TestClusterFaults in `go test ./...`: 1,500
// operations over 60 s, plus two bursts of 300, and one cycle of cluster
// faults (the node outage its full 20 s), for two of each program on a
// three-node cluster.
func clusterShortProfile() profile {
	return profile{
		Name: "cluster-short", Ops: 1500, Clients: 64, Rate: 1500.0 / 60,
		DropProbability: 0.1, DropBursts: 3,
		OpDeadline: 2 * time.Minute, DrainTimeout: 4 * time.Minute,
		ClusterCycles: 1, LeaderOutage: 5 * time.Second, NodeOutage: 20 * time.Second, BurstOps: 300,
	}
}

// clusterSoakProfile is TestClusterFaults in `make soak`: the soak's load
// with a cycle of cluster faults every two minutes.
func clusterSoakProfile(ops int, rate float64) profile {
	p := profile{Name: "cluster-soak", Ops: ops, Clients: 64, Rate: rate,
		DropProbability: 0.1, OpDeadline: 3 * time.Minute, DrainTimeout: 20 * time.Minute,
		LeaderOutage: 5 * time.Second, NodeOutage: 20 * time.Second, BurstOps: 300}
	p.ClusterCycles = max(1, int(p.Duration().Seconds()/120))
	p.DropBursts = max(3, int(p.Duration().Seconds()/30))
	return p
}

// profileFromEnv picks the profile: QUILL_E2E_PROFILE=short (default) or
// soak; QUILL_E2E_OPS and QUILL_E2E_RATE override the size and the rate.
func profileFromEnv() (profile, error) {
	return pickProfile(shortProfile, soakProfile)
}

// clusterProfileFromEnv is profileFromEnv for TestClusterFaults.
func clusterProfileFromEnv() (profile, error) {
	return pickProfile(clusterShortProfile, clusterSoakProfile)
}

func pickProfile(short func() profile, soak func(ops int, rate float64) profile) (profile, error) {
	ops, rate := 0, 0.0
	if v := os.Getenv("QUILL_E2E_OPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 {
			return profile{}, fmt.Errorf("QUILL_E2E_OPS %q: want an integer ≥ 100", v)
		}
		ops = n
	}
	if v := os.Getenv("QUILL_E2E_RATE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			return profile{}, fmt.Errorf("QUILL_E2E_RATE %q: want a positive number of operations per second", v)
		}
		rate = f
	}
	switch name := os.Getenv("QUILL_E2E_PROFILE"); name {
	case "", "short":
		p := short()
		planned := p.Duration()
		if ops > 0 {
			p.Ops = ops
		}
		if rate > 0 {
			p.Rate = rate
		} else if ops > 0 {
			p.Rate = float64(ops) / planned.Seconds()
		}
		return p, nil
	case "soak":
		if ops == 0 {
			ops = 50000
		}
		if rate == 0 {
			rate = 120
		}
		return soak(ops, rate), nil
	default:
		return profile{}, fmt.Errorf("QUILL_E2E_PROFILE %q: want short or soak", name)
	}
}
