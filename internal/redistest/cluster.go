package redistest

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// slots is the number of hash slots in a Redis Cluster.
const slots = 16384

// defaultNodeTimeout is Redis's default cluster-node-timeout in
// milliseconds.
const defaultNodeTimeout = 15000

// settleTimeout bounds every wait for the cluster's nodes to agree.
const settleTimeout = 20 * time.Second

// StartCluster starts a one-node Redis Cluster that serves all 16384 slots,
// so tests see the cluster's rules (a script's keys must share one slot).
func StartCluster(t testing.TB) *Server {
	t.Helper()
	return StartClusterN(t, 1, 0).Masters[0]
}

// Cluster is a Redis Cluster of redis-server children on loopback ports.
// Its fields describe the roles the nodes were started in; a test that fails
// over or empties a master changes the roles but not the fields.
type Cluster struct {
	// Masters[i] serves the i-th of len(Masters) equal ranges of slots,
	// until MigrateSlot moves one.
	Masters []*Server
	// Replicas[i] are the replicas of Masters[i].
	Replicas [][]*Server

	t   testing.TB
	ids map[*Server]string // node IDs, which survive Restart
}

// StartClusterN starts a Redis Cluster of masters masters, each with
// replicasPerMaster replicas, splits the slots evenly across the masters in
// order, and waits until every node reports cluster_state:ok, every node
// agrees on the nodes, their roles and the slot map, and every replica's link
// to its master is up. Once formed, the nodes have Redis's default
// cluster-node-timeout (15s), so a node paused for less is not failed over.
// The nodes are stopped when the test ends.
func StartClusterN(t testing.TB, masters, replicasPerMaster int) *Cluster {
	t.Helper()
	if masters < 1 || masters > slots || replicasPerMaster < 0 {
		t.Fatalf("redistest: StartClusterN(%d, %d): need 1..%d masters and >= 0 replicas", masters, replicasPerMaster, slots)
	}
	c := &Cluster{t: t, ids: make(map[*Server]string)}
	for range masters {
		c.Masters = append(c.Masters, start(t, true, nil, ""))
	}
	for range masters {
		var rs []*Server
		for range replicasPerMaster {
			rs = append(rs, start(t, true, nil, ""))
		}
		c.Replicas = append(c.Replicas, rs)
	}
	nodes := c.nodes()
	for i, s := range nodes {
		// A node pings every other at least each cluster-node-timeout/2,
		// and otherwise one random node a second, so with the default
		// timeout six nodes take 4-6s to learn each other's roles. A short
		// one while the cluster forms, and the default afterwards, keep
		// both the start fast and the cluster's later behaviour Redis's
		// own.
		s.mustDo("CONFIG", "SET", "cluster-node-timeout", 500)
		// Distinct epochs from the start spare the nodes resolving
		// collisions, as redis-cli --cluster create does.
		s.mustDo("CLUSTER", "SET-CONFIG-EPOCH", i+1)
		c.ids[s] = s.mustDo("CLUSTER", "MYID").(string)
	}
	want := make([]node, 0, len(nodes))
	for i, m := range c.Masters {
		lo, hi := i*slots/masters, (i+1)*slots/masters-1
		m.mustDo("CLUSTER", "ADDSLOTSRANGE", lo, hi)
		want = append(want, node{id: c.ids[m], master: "-", slots: []string{slotRange(lo, hi)}})
	}
	for _, s := range nodes[1:] {
		nodes[0].mustDo("CLUSTER", "MEET", "127.0.0.1", s.port, s.bus)
	}
	for i, rs := range c.Replicas {
		id := c.ids[c.Masters[i]]
		for _, r := range rs {
			// A replica learns of its master through gossip after the
			// MEET; until then CLUSTER REPLICATE fails with "Unknown node".
			eventually(t, settleTimeout, func() error {
				_, err := r.Do("CLUSTER", "REPLICATE", id)
				return err
			})
			want = append(want, node{id: c.ids[r], master: id})
		}
	}
	wantSummary := summary(want)
	c.waitSettled(func(got []node) error {
		if s := summary(got); s != wantSummary {
			return fmt.Errorf("cluster is\n%s\nwant\n%s", s, wantSummary)
		}
		return nil
	})
	for i, rs := range c.Replicas {
		for _, r := range rs {
			waitLinked(t, r, c.Masters[i])
		}
	}
	for _, s := range nodes {
		s.mustDo("CONFIG", "SET", "cluster-node-timeout", defaultNodeTimeout)
	}
	return c
}

// nodes returns every node, masters first.
func (c *Cluster) nodes() []*Server {
	nodes := slices.Clone(c.Masters)
	for _, rs := range c.Replicas {
		nodes = append(nodes, rs...)
	}
	return nodes
}

// Addrs returns the address of every node, masters first.
func (c *Cluster) Addrs() []string {
	var addrs []string
	for _, s := range c.nodes() {
		addrs = append(addrs, s.Addr)
	}
	return addrs
}

// Client returns a new go-redis cluster client seeded with every node's
// address, closed when the test ends. opts may be nil; its Addrs is
// overwritten.
func (c *Cluster) Client(opts *redis.ClusterOptions) *redis.ClusterClient {
	var o redis.ClusterOptions
	if opts != nil {
		o = *opts
	}
	o.Addrs = c.Addrs()
	cc := redis.NewClusterClient(&o)
	c.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// NodeID returns the cluster node ID of s, which must be one of the
// cluster's nodes.
func (c *Cluster) NodeID(s *Server) string {
	c.t.Helper()
	id, ok := c.ids[s]
	if !ok {
		c.t.Fatalf("redistest: %s is not a node of the cluster", s.Addr)
	}
	return id
}

// server returns the node whose ID is id.
func (c *Cluster) server(id string) *Server {
	c.t.Helper()
	for s, sid := range c.ids {
		if sid == id {
			return s
		}
	}
	c.t.Fatalf("redistest: no node has ID %s", id)
	return nil
}

// MasterOf returns the master serving slot in the view of the first node
// that answers, failing the test if none does or no master serves slot.
func (c *Cluster) MasterOf(slot int) *Server {
	c.t.Helper()
	var err error
	for _, s := range c.nodes() {
		var ns []node
		if ns, err = clusterNodes(s); err != nil {
			continue
		}
		if id := ownerOf(ns, slot); id != "" {
			return c.server(id)
		}
		c.t.Fatalf("redistest: %s sees no master serving slot %d", s.Addr, slot)
	}
	c.t.Fatalf("redistest: slot %d: %v", slot, err)
	return nil
}

// MigrateSlot moves slot, with its keys, from the master serving it to the
// master to, as redis-cli --cluster reshard does: CLUSTER SETSLOT IMPORTING
// on to, SETSLOT MIGRATING on the source, MIGRATE of the slot's keys in
// batches of 100, then SETSLOT NODE on to, on the source and on every other
// master. It returns once every node reports cluster_state:ok and agrees that
// to serves slot. Every node must be running. When the slot leaves the
// source, Redis 7 sends each client subscribed there with SSUBSCRIBE to a
// shard channel of the slot a sunsubscribe for that channel.
func (c *Cluster) MigrateSlot(slot int, to *Server) {
	c.t.Helper()
	from := c.MasterOf(slot)
	if from == to {
		return
	}
	fromID, toID := c.NodeID(from), c.NodeID(to)
	to.mustDo("CLUSTER", "SETSLOT", slot, "IMPORTING", fromID)
	from.mustDo("CLUSTER", "SETSLOT", slot, "MIGRATING", toID)
	for {
		keys, _ := from.mustDo("CLUSTER", "GETKEYSINSLOT", slot, 100).([]any)
		if len(keys) == 0 {
			break
		}
		args := append([]any{"MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS"}, keys...)
		from.mustDo(args...)
	}
	ns, err := clusterNodes(from)
	if err != nil {
		c.t.Fatalf("redistest: %v", err)
	}
	// The destination first, so that once the source redirects clients
	// with MOVED, the destination already serves the slot.
	to.mustDo("CLUSTER", "SETSLOT", slot, "NODE", toID)
	from.mustDo("CLUSTER", "SETSLOT", slot, "NODE", toID)
	for _, n := range ns {
		if s := c.server(n.id); n.master == "-" && s != to && s != from {
			s.mustDo("CLUSTER", "SETSLOT", slot, "NODE", toID)
		}
	}
	c.waitSettled(func(got []node) error {
		if owner := ownerOf(got, slot); owner != toID {
			return fmt.Errorf("slot %d is on node %s, want %s", slot, owner, toID)
		}
		return nil
	})
}

// waitSettled waits until every node reports cluster_state:ok, knows every
// node as connected and healthy, has no slot importing or migrating, agrees
// with the others on roles and slots, and check passes on that view.
func (c *Cluster) waitSettled(check func([]node) error) {
	c.t.Helper()
	all := c.nodes()
	eventually(c.t, settleTimeout, func() error {
		var first string
		for i, s := range all {
			ns, err := clusterNodes(s)
			if err != nil {
				return err
			}
			if len(ns) != len(all) {
				return fmt.Errorf("%s knows %d nodes, want %d", s.Addr, len(ns), len(all))
			}
			for _, n := range ns {
				if n.unsettled != "" {
					return fmt.Errorf("%s sees node %s %s", s.Addr, n.id, n.unsettled)
				}
			}
			sum := summary(ns)
			if i == 0 {
				if err := check(ns); err != nil {
					return err
				}
				first = sum
			} else if sum != first {
				return fmt.Errorf("%s and %s disagree:\n%s\nand\n%s", all[0].Addr, s.Addr, first, sum)
			}
			v, err := s.Do("CLUSTER", "INFO")
			if err != nil {
				return err
			}
			if info, _ := v.(string); !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("%s: cluster_state is not ok", s.Addr)
			}
		}
		return nil
	})
}

// A node is one line of CLUSTER NODES.
type node struct {
	id        string
	master    string   // the master's ID, "-" for a master
	slots     []string // ranges as Redis prints them: "0-5460", "7"
	unsettled string   // why the node is in flux, "" if it is not
}

// clusterNodes returns the nodes in s's CLUSTER NODES.
func clusterNodes(s *Server) ([]node, error) {
	v, err := s.Do("CLUSTER", "NODES")
	if err != nil {
		return nil, fmt.Errorf("CLUSTER NODES on %s: %w", s.Addr, err)
	}
	text, _ := v.(string)
	var ns []node
	for line := range strings.Lines(text) {
		// <id> <ip:port@cport> <flags> <master> <ping-sent> <pong-recv>
		// <config-epoch> <link-state> <slot> <slot> ...
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		n := node{id: f[0], master: f[3]}
		for flag := range strings.SplitSeq(f[2], ",") {
			switch flag {
			case "fail", "fail?", "handshake", "noaddr":
				n.unsettled = "flagged " + flag
			}
		}
		if f[7] != "connected" {
			n.unsettled = f[7]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // [slot->-id] or [slot-<-id]
				n.unsettled = "moving slot " + r
				continue
			}
			n.slots = append(n.slots, r)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// summary renders the nodes' roles and slots, one node a line, in the order
// of their IDs.
func summary(ns []node) string {
	ns = slices.SortedFunc(slices.Values(ns), func(a, b node) int { return cmp.Compare(a.id, b.id) })
	var b strings.Builder
	for _, n := range ns {
		fmt.Fprintf(&b, "%s master=%s slots=%s\n", n.id, n.master, strings.Join(n.slots, ","))
	}
	return b.String()
}

// ownerOf returns the ID of the master that serves slot, or "".
func ownerOf(ns []node, slot int) string {
	for _, n := range ns {
		for _, r := range n.slots {
			lo, hi, _ := strings.Cut(r, "-")
			l, _ := strconv.Atoi(lo)
			h := l
			if hi != "" {
				h, _ = strconv.Atoi(hi)
			}
			if l <= slot && slot <= h {
				return n.id
			}
		}
	}
	return ""
}

func slotRange(lo, hi int) string {
	if lo == hi {
		return strconv.Itoa(lo)
	}
	return strconv.Itoa(lo) + "-" + strconv.Itoa(hi)
}
