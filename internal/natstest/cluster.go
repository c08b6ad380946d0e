package natstest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quillhq/quill/internal/testkit"
)

// clusterTimeout bounds every wait of a cluster: a JetStream election takes
// the server's election timeout, several seconds outside nats-server's own
// tests, and a restarted node must catch up before it counts as current.
const clusterTimeout = 60 * time.Second

// Account is the account the cluster's clients use (no auth: the global
// account); stream leadership is asked of the servers per account.
const Account = server.DEFAULT_GLOBAL_ACCOUNT

// System account credentials of every node: only the test's own requests
// to the system API (meta leader step-down) use them.
const (
	sysUser     = "sys"
	sysPassword = "natstest"
)

// clusterConf is one node's configuration file, the shape nats-server's
// own cluster tests use: client and route listeners on loopback, explicit
// routes to every node, and a system account user. Clients without
// credentials land in the global account.
const clusterConf = `
listen: 127.0.0.1:%d
server_name: %s
jetstream: {store_dir: '%s'%s}
cluster {
	name: %s
	listen: 127.0.0.1:%d
	routes = [%s]
}
accounts { $SYS { users = [ { user: %q, pass: %q } ] } }
`

// Cluster is a JetStream cluster of in-process nats-servers on loopback.
// Each node keeps its client port, route port and store directory across
// Stop and Restart. Its methods are safe for concurrent use.
type Cluster struct {
	t    testing.TB
	name string

	mu    sync.Mutex
	nodes []*node
}

type node struct {
	name       string
	storeDir   string
	confFile   string
	clientPort int // -1 until the first start has chosen one
	routePort  int
	ns         *server.Server
	log        *tLogger
}

// StartCluster starts n JetStream nodes (3 for a cluster that keeps
// quorum with one node down) routed to each other on 127.0.0.1, and
// returns once a meta leader is elected and every node is current. Of
// opts, WithSyncAlways applies to every node; WithMaxPayload and
// WithStoreDir are ignored. The nodes are stopped when t ends.
func StartCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	require.GreaterOrEqual(t, n, 1, "natstest: cluster size")
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	c := &Cluster{t: t, name: "natstest"}
	routes := make([]string, n)
	for i := range n {
		nd := &node{
			name:       fmt.Sprintf("n%d", i),
			storeDir:   t.TempDir(),
			clientPort: -1,
			routePort:  freePort(t),
		}
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", nd.routePort)
		c.nodes = append(c.nodes, nd)
	}
	confDir := t.TempDir()
	syncOpt := ""
	if cfg.syncAlways {
		syncOpt = ", sync_interval: always"
	}
	for _, nd := range c.nodes {
		nd.confFile = filepath.Join(confDir, nd.name+".conf")
		conf := fmt.Sprintf(clusterConf, -1, nd.name, nd.storeDir, syncOpt, c.name, nd.routePort, strings.Join(routes, ", "), sysUser, sysPassword)
		require.NoError(t, os.WriteFile(nd.confFile, []byte(conf), 0o600))
	}
	// Registered after t.TempDir's removal, so it runs before it.
	t.Cleanup(c.stopAll)
	c.mu.Lock()
	// The nodes start together: none can elect a meta leader alone.
	for _, nd := range c.nodes {
		c.startLocked(t, nd)
	}
	c.mu.Unlock()
	for _, nd := range c.nodes {
		c.waitReady(t, nd)
	}
	c.WaitForLeader(t)
	return c
}

// freePort returns a loopback port that was free a moment ago. Route ports
// must be known before any node starts, because every node lists them all.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err, "natstest: free port")
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startLocked starts nd on its remembered ports and store directory
// without waiting for it to be ready. c.mu must be held.
func (c *Cluster) startLocked(t testing.TB, nd *node) {
	t.Helper()
	opts, err := server.ProcessConfigFile(nd.confFile)
	require.NoError(t, err, "natstest: node %s config", nd.name)
	opts.Port = nd.clientPort
	opts.NoLog, opts.NoSigs = true, true
	opts.DisableShortFirstPing = true
	opts.DisableJetStreamBanner = true
	ns, err := server.NewServer(opts)
	require.NoError(t, err, "natstest: new node %s", nd.name)
	var lg *tLogger
	if testing.Verbose() {
		lg = &tLogger{t: c.t}
		ns.SetLoggerV2(lg, false, false, false)
	}
	ns.Start()
	if !ns.ReadyForConnections(readyTimeout) {
		shutdown(ns, lg)
		require.FailNowf(t, "natstest: node not ready", "node %s on route port %d (port taken?) within %s", nd.name, nd.routePort, readyTimeout)
	}
	if nd.clientPort < 0 {
		nd.clientPort = ns.Addr().(*net.TCPAddr).Port
	}
	nd.ns, nd.log = ns, lg
}

// waitReady waits until nd is part of the cluster with JetStream current.
func (c *Cluster) waitReady(t testing.TB, nd *node) {
	t.Helper()
	testkit.WaitFor(t, clusterTimeout, func() bool {
		c.mu.Lock()
		ns := nd.ns
		c.mu.Unlock()
		return ns != nil && ns.JetStreamEnabled() && ns.JetStreamIsCurrent()
	}, fmt.Sprintf("node %s to be current in the cluster", nd.name))
}

func (c *Cluster) stopAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, nd := range c.nodes {
		if nd.ns != nil {
			shutdown(nd.ns, nd.log)
			nd.ns, nd.log = nil, nil
		}
	}
}

// Servers returns the running *server.Server of each node, nil for a
// stopped one, in node order.
func (c *Cluster) Servers() []*server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*server.Server, len(c.nodes))
	for i, nd := range c.nodes {
		out[i] = nd.ns
	}
	return out
}

// URL returns node i's client URL, nats://127.0.0.1:PORT; it does not
// change across Restart.
func (c *Cluster) URL(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].clientPort)
}

// URLs returns every node's client URL, comma-separated, as NATS_URL and
// nats.Connect take a cluster's server list.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i := range c.nodes {
		urls[i] = c.URL(i)
	}
	return strings.Join(urls, ",")
}

// Connect connects to the cluster through its server list and returns the
// connection with a JetStream handle. Like Server.Connect it reconnects
// forever every 20ms; opts override these defaults. It is closed when t
// ends.
func (c *Cluster) Connect(t testing.TB, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return connect(t, c.URLs(), opts...)
}

// MetaLeader returns the index of the node that leads the JetStream meta
// group, or -1 when none does right now.
func (c *Cluster) MetaLeader() int {
	for i, ns := range c.Servers() {
		if ns != nil && ns.JetStreamIsLeader() {
			return i
		}
	}
	return -1
}

// WaitForLeader waits until a meta leader is elected, every running node is
// current with it, and the leader counts every running node as an online
// peer (until then it refuses to place a replicated stream on them); it
// returns the leader's index.
func (c *Cluster) WaitForLeader(t testing.TB) int {
	t.Helper()
	leader := -1
	testkit.WaitFor(t, clusterTimeout, func() bool {
		leader = c.MetaLeader()
		if leader < 0 {
			return false
		}
		servers := c.Servers()
		running := 0
		for _, ns := range servers {
			if ns == nil {
				continue
			}
			running++
			if !ns.JetStreamIsCurrent() {
				return false
			}
		}
		ls := servers[leader]
		return ls != nil && len(ls.JetStreamClusterPeers()) >= running
	}, "a JetStream meta leader with every running node current and online")
	return leader
}

// streamLeader returns the index of stream's leader, or -1.
func (c *Cluster) streamLeader(stream string) int {
	for i, ns := range c.Servers() {
		if ns != nil && ns.JetStreamIsStreamLeader(Account, stream) {
			return i
		}
	}
	return -1
}

// StreamLeader waits until stream has a leader and returns its index.
func (c *Cluster) StreamLeader(t testing.TB, stream string) int {
	t.Helper()
	leader := -1
	testkit.WaitFor(t, clusterTimeout, func() bool {
		leader = c.streamLeader(stream)
		return leader >= 0
	}, fmt.Sprintf("stream %s to have a leader", stream))
	return leader
}

// StepDownStreamLeader asks stream's leader to step down and waits until
// another node leads it; it returns the new leader's index.
func (c *Cluster) StepDownStreamLeader(t testing.TB, stream string) int {
	t.Helper()
	old := c.StreamLeader(t, stream)
	ns := c.Servers()[old]
	require.NotNil(t, ns)
	require.NoError(t, ns.JetStreamStepdownStream(Account, stream), "natstest: step down the leader of %s", stream)
	leader := -1
	testkit.WaitFor(t, clusterTimeout, func() bool {
		leader = c.streamLeader(stream)
		return leader >= 0 && leader != old
	}, fmt.Sprintf("another leader of stream %s than node %d", stream, old))
	return leader
}

// StepDownMetaLeader asks the JetStream meta leader to step down, through
// the system account's API as an operator would, and waits until another
// node leads; it returns the new leader's index.
func (c *Cluster) StepDownMetaLeader(t testing.TB) int {
	t.Helper()
	old := c.WaitForLeader(t)
	nc, err := nats.Connect(c.URL(old), nats.UserInfo(sysUser, sysPassword), nats.Name("natstest-system"))
	require.NoError(t, err, "natstest: system connection")
	defer nc.Close()
	reply, err := nc.Request(jetstream.DefaultAPIPrefix+"META.LEADER.STEPDOWN", nil, readyTimeout)
	require.NoError(t, err, "natstest: meta leader step-down")
	var resp struct {
		Success bool `json:"success"`
		Error   *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(reply.Data, &resp), "natstest: step-down answer %s", reply.Data)
	require.True(t, resp.Success, "natstest: step-down answer %s", reply.Data)
	leader := -1
	testkit.WaitFor(t, clusterTimeout, func() bool {
		leader = c.MetaLeader()
		return leader >= 0 && leader != old
	}, fmt.Sprintf("another meta leader than node %d", old))
	return leader
}

// WaitForStreamReplicas waits until stream has a leader and replicas-1
// followers that are current with it, as the stream leader sees them.
func (c *Cluster) WaitForStreamReplicas(t testing.TB, js jetstream.JetStream, stream string, replicas int) {
	t.Helper()
	testkit.WaitFor(t, clusterTimeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return false
		}
		info := st.CachedInfo()
		if info.Config.Replicas != replicas || info.Cluster == nil || info.Cluster.Leader == "" {
			return false
		}
		current := 0
		for _, p := range info.Cluster.Replicas {
			if p.Current && !p.Offline {
				current++
			}
		}
		return len(info.Cluster.Replicas) == replicas-1 && current == replicas-1
	}, fmt.Sprintf("stream %s to have %d current replicas", stream, replicas))
}

// WaitHealthy waits until every running node answers its health check
// (nats-server's /healthz) as healthy: each stream and consumer it holds a
// replica of is current with its leader. It is the wait of a rolling
// restart between two nodes: a stream current again does not make its
// consumers current, and stopping the next node while a restarted node's
// consumer replica still catches up leaves that consumer without a quorum
// (nats-server then answers every pull with no responders, 503 to
// consumer info, until the stopped node is back).
func (c *Cluster) WaitHealthy(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(clusterTimeout)
	for {
		unhealthy := ""
		for i, ns := range c.Servers() {
			if ns == nil {
				continue
			}
			if h := ns.Healthz(nil); h.Status != "ok" {
				unhealthy = fmt.Sprintf("n%d: %s", i, h.Error)
				break
			}
		}
		if unhealthy == "" {
			return
		}
		if time.Now().After(deadline) {
			require.FailNowf(t, "timed out", "after %s waiting for every running node to be healthy; %s", clusterTimeout, unhealthy)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop shuts node i down and waits until it has; its ports close. Stopping
// a stopped node does nothing.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.nodes[i]
	if nd.ns == nil {
		return
	}
	shutdown(nd.ns, nd.log)
	nd.ns, nd.log = nil, nil
}

// Restart stops node i if it runs and starts it again on its ports and
// store directory, returning once it is back in the cluster, current with
// the meta leader and counted online by it (WaitForLeader). Its streams
// catch up on their own; wait for that with WaitForStreamReplicas.
func (c *Cluster) Restart(t testing.TB, i int) {
	t.Helper()
	c.Stop(i)
	c.mu.Lock()
	c.startLocked(t, c.nodes[i])
	c.mu.Unlock()
	c.waitReady(t, c.nodes[i])
	c.WaitForLeader(t)
}

// ClusterLeakOptions are the goleak options of a package whose tests stop
// and restart nodes of a Cluster that hold replicated consumers: a node
// shut down in-process while such a consumer catches up can leave its file
// store's state flusher (and the store's access-time ticker) running after
// Shutdown returned. They belong to nats-server, not to the code under
// test.
func ClusterLeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	}
}
