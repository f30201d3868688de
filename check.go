package fencelock

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/driver"
	"github.com/fencelock/fencelock/internal/glob"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

// LockInfo is what Locker.Inspect found about a lock.
type LockInfo struct {
	Name      string
	Held      bool
	Owner     string        // the holder's Options.Owner or WithOwner; "" when not held or not stored
	TTL       time.Duration // left on the server; 0 when not held, -1 when the lock has no expiry
	Fence     int64         // the fence of the current holding; 0 when not held
	LastFence int64         // the last fence issued, kept for FenceRetention; 0 if none (Redlock: "How Redlock works")
	Waiters   int           // how many Lockers wait for the lock's release, each counted once
}

// Inspect reads the lock called name, changing nothing; on a Redlock, the
// holding a quorum agree on. It returns ErrInvalid for a bad name, ErrUnavailable
// (on a Redlock, no quorum answered within Options.ReleaseTimeout) or
// ErrMisconfigured, or an error matching ctx.Err().
func (l *Locker) Inspect(ctx context.Context, name string) (LockInfo, error) {
	if err := l.usable(); err != nil {
		return LockInfo{}, err
	}
	if err := checkName(name); err != nil {
		return LockInfo{}, err
	}
	h, err := l.read(ctx, name, fmt.Sprintf("inspect %q", name), func(ctx context.Context) (store.Holding, error) {
		return l.store.Inspect(ctx, name, true)
	})
	if err != nil {
		return LockInfo{}, err
	}
	info := LockInfo{Name: name, LastFence: h.Counter, Waiters: h.Waiters}
	if h.Value != "" {
		_, info.Fence, info.Owner = keys.Parse(h.Value)
		info.Held, info.TTL = true, h.PTTL
	}
	return info, nil
}

// read runs f, a read of the lock name, bounded by ctx; what names it in errors.
func (l *Locker) read(ctx context.Context, name, what string, f func(ctx context.Context) (store.Holding, error)) (store.Holding, error) {
	type result struct {
		h   store.Holding
		err error
	}
	res, done := tasks.Call(l.bg, ctx.Done(), nil, func() result {
		h, err := f(ctx)
		return result{h, err}
	}, nil)
	switch {
	case !done || (res.err != nil && (classify(res.err) == store.NoVerdict || ctxErr(ctx) != nil)):
		return store.Holding{}, ctxEnded(ctx, what)
	case res.err != nil:
		return store.Holding{}, callError(name, res.err)
	}
	return res.h, nil
}

// Severity says how much a Finding matters for the lock's guarantees.
type Severity int

const (
	SeverityInfo     Severity = iota // worth knowing; nothing needs to change
	SeverityWarning                  // weakens a guarantee when a fault happens (a restart, a failover, memory running out)
	SeverityCritical                 // breaks a guarantee in normal operation, or makes the lock unusable
)

func (s Severity) String() string {
	if names := [...]string{"info", "warning", "critical"}; s >= 0 && int(s) < len(names) {
		return names[s]
	}
	return "severity(" + strconv.Itoa(int(s)) + ")"
}

// A Finding is one thing Check found, and what it means for the lock.
type Finding struct {
	Severity Severity
	// Check names what was checked: "reachable", "role", "maxmemory-policy", "persistence",
	// "replicas", "permissions", "pubsub", "round-trip", "independence" (Redlock), "config".
	Check string
	Node  string // the server's address or Redlock node's name; "" for the deployment
	Seen  string // what was seen
	Means string // what it means for the lock
	Fix   string // what to change; "" when nothing needs to
}

// String returns the finding on one line.
func (f Finding) String() string {
	s := f.Severity.String() + " " + f.Check
	if f.Node != "" {
		s += " [" + f.Node + "]"
	}
	s += ": " + f.Seen
	if f.Means != "" {
		s += "; " + f.Means
	}
	if f.Fix != "" {
		s += "; fix: " + f.Fix
	}
	return s
}

// Check inspects the deployment (every node of a Redlock, master of a Cluster,
// shard of a Ring) for what weakens the lock, most severe first (docs/operating.md,
// "A deployment check"), trying each command the library sends on a test lock
// "fencelock-check:<random>" whose keys it deletes. It returns an error only for
// a zero Locker (ErrInvalid), or by ctx's end, whatever the client's options: one
// matching ctx.Err(), with the findings made before, the test lock's keys then
// deleted in the background (Close waits for it).
func (l *Locker) Check(ctx context.Context) ([]Finding, error) {
	if err := l.usable(); err != nil {
		return nil, err
	}
	c := &checker{l: l}
	tasks.Call(l.bg, ctx.Done(), nil, func() struct{} {
		c.run(ctx)
		return struct{}{}
	}, nil)
	findings, complete := c.result()
	if !complete {
		return findings, ctxEnded(ctx, "check")
	}
	return findings, nil
}

// checker gathers one Check's findings, on a goroutine that may outlive Check.
type checker struct {
	l        *Locker
	mu       sync.Mutex
	findings []Finding    // guarded by mu
	complete bool         // guarded by mu; every check ran: what may be left is the clean-up
	returned bool         // guarded by mu; Check has returned: findings are no longer added
	ended    bool         // ctx ended: the check stops (see cut)
	written  []testLock   // the test locks whose keys may have been written, for cleanUp
	servers  []serverInfo // Redlock: what each node said, for the independence check
}

// A checkNode is a deployment Check looks at: New's, or a Redlock node.
type checkNode struct {
	name   string        // a Redlock node's; "" for New's
	client driver.Client // the scripts go through it
	single single        // for the test lock
}

type testLock struct {
	via  driver.Node
	keys []any
}

// run runs every check, then deletes the test locks' keys.
func (c *checker) run(ctx context.Context) {
	defer c.cleanUp(ctx)
	for _, n := range c.l.checks {
		if c.cut(ctx) {
			return
		}
		c.deployment(ctx, n)
	}
	if len(c.l.checks) > 1 && !c.cut(ctx) { // a Redlock
		c.independence(len(c.l.checks))
	}
	if !c.cut(ctx) {
		c.mu.Lock()
		c.complete = true
		c.mu.Unlock()
	}
}

// result returns the findings, most severe first, and whether every check ran.
func (c *checker) result() ([]Finding, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.returned = true
	sort.SliceStable(c.findings, func(i, j int) bool { return c.findings[i].Severity > c.findings[j].Severity })
	return c.findings, c.complete
}

// cut reports whether ctx has ended: the check stops, the last error no finding.
func (c *checker) cut(ctx context.Context) bool {
	if !c.ended && ctxErr(ctx) != nil {
		c.ended = true
	}
	return c.ended
}

type serverInfo struct {
	node, addr, runID, replID string
	master                    string // a replica's master, host:port
}

func (c *checker) add(f Finding) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.returned {
		c.findings = append(c.findings, f)
	}
}

func (c *checker) deployment(ctx context.Context, n checkNode) {
	node := n.name
	servers, err := n.client.Servers(ctx)
	if err != nil {
		if c.cut(ctx) {
			return
		}
		c.add(Finding{Severity: SeverityCritical, Check: "reachable", Node: node,
			Seen:  "could not list the servers: " + store.OneLine(err.Error()),
			Means: "the lock cannot be taken there", Fix: "check the address and the network"})
		return
	}
	for _, s := range servers {
		name := s.Addr
		if node != "" {
			name = node
		}
		c.server(ctx, s, name)
		if c.ended {
			return
		}
	}
	if !c.roundTrip(ctx, n.client, node) { // unreachable: reported by the server checks
		return
	}
	base := "fencelock-check:" + string(keys.NewToken())
	if n.client.Network().Topology() != notify.Cluster {
		c.permissions(ctx, n, nil, node, base)
		return
	}
	for _, m := range servers { // ACLs are each master's own
		where := m.Addr
		if node != "" {
			where = node + " (" + where + ")"
		}
		if name, ok := c.nameOn(m, base); ok {
			c.permissions(ctx, n, m.Node, where, name)
		} else {
			c.add(Finding{Severity: SeverityInfo, Check: "permissions", Node: where,
				Seen:  "no test lock name found whose keys the master serves",
				Means: "Check did not try the ACL there (with a hash tag in KeyPrefix, no lock is there either)"})
		}
		if c.cut(ctx) {
			return
		}
	}
}

// nameOn returns a test lock's name, base with a suffix, whose keys m serves.
func (c *checker) nameOn(m driver.Server, base string) (string, bool) {
	for i := range 1 << 16 { // a master with one slot of 16384 is found 98 times in 100
		name := base + ":" + strconv.Itoa(i)
		slot := keys.Slot(keys.Lock(c.l.opts.KeyPrefix, name))
		for _, r := range m.Slots {
			if r[0] <= slot && slot <= r[1] {
				return name, true
			}
		}
	}
	return "", false
}

// info returns an INFO section as a map, or records that it could not.
func (c *checker) info(ctx context.Context, s driver.Node, node, section string) map[string]string {
	reply, err := s.Call(ctx, []any{"INFO", section})
	if err == nil {
		text, _ := reply.(string)
		return pairs(text, "\n", ":")
	}
	if !c.cut(ctx) {
		sev, means := SeverityInfo, "Check could not look at this"
		if classify(err) == store.Unavailable {
			sev, means = SeverityCritical, "the server did not answer: the lock cannot be taken there"
		}
		c.add(Finding{Severity: sev, Check: "config", Node: node,
			Seen: fmt.Sprintf("INFO %s not answered: %s", section, store.OneLine(err.Error())), Means: means})
	}
	return nil
}

// server checks one server's role, memory policy, persistence and replicas.
func (c *checker) server(ctx context.Context, server driver.Server, node string) {
	s := server.Node
	if _, err := s.Call(ctx, []any{"PING"}); err != nil && classify(err) != store.Misconfigured {
		if c.cut(ctx) { // no verdict: the server may answer yet
			return
		}
		c.add(Finding{Severity: SeverityCritical, Check: "reachable", Node: node,
			Seen: "PING failed: " + store.OneLine(err.Error()), Means: "the lock cannot be taken there",
			Fix: "check the address, the network and the server"})
		return
	}
	srv := c.info(ctx, s, node, "server")
	repl := c.info(ctx, s, node, "replication")
	mem := c.info(ctx, s, node, "memory")
	pers := c.info(ctx, s, node, "persistence")
	if c.ended {
		return
	}
	info := serverInfo{node: node, addr: server.Addr, runID: srv["run_id"], replID: repl["master_replid"]}
	if repl["role"] == "slave" {
		info.master = hostPort(repl["master_host"], repl["master_port"])
		c.add(Finding{Severity: SeverityCritical, Check: "role", Node: node,
			Seen:  "the server is a replica of " + info.master,
			Means: "it refuses writes (READONLY): every acquisition fails",
			Fix:   "point the client at the master, or use Sentinel or Cluster clients"})
	}
	online := 0 // replicas
	for k, v := range repl {
		if strings.HasPrefix(k, "slave") && strings.Contains(v, "ip=") && pairs(v, ",", "=")["state"] == "online" {
			online++
		}
	}
	c.servers = append(c.servers, info)
	c.settings(node, srv, mem)
	if c.persistence(ctx, s, node, pers) {
		return
	}
	if want := c.l.opts.Replicas; want > 0 && repl["role"] == "master" && online < want {
		c.add(Finding{Severity: SeverityCritical, Check: "replicas", Node: node,
			Seen:  fmt.Sprintf("%d replicas online, Options.Replicas is %d", online, want),
			Means: "no acquisition can be acknowledged by enough replicas: every one fails",
			Fix:   "add replicas, or lower Options.Replicas"})
	}
}

// settings checks a server's version (sharded pub/sub) and memory policy.
func (c *checker) settings(node string, srv, mem map[string]string) {
	if v := srv["redis_version"]; v != "" {
		if major, _, _ := strings.Cut(v, "."); major < "7" && len(major) == 1 {
			c.add(Finding{Severity: SeverityInfo, Check: "pubsub", Node: node,
				Seen:  "Redis " + v + " has no sharded pub/sub",
				Means: "waiters use classic SUBSCRIBE and PUBLISH, which a Cluster sends to every node",
				Fix:   "Redis 7 or later"})
		}
	}
	if policy, maxmemory := mem["maxmemory_policy"], mem["maxmemory"]; maxmemory != "0" && maxmemory != "" {
		seen := fmt.Sprintf("maxmemory-policy %s with maxmemory %s", policy, maxmemory)
		switch {
		case strings.HasPrefix(policy, "volatile-"):
			c.add(Finding{Severity: SeverityCritical, Check: "maxmemory-policy", Node: node, Seen: seen,
				Means: "when memory runs out, keys with a TTL are evicted first, and every lock key has one: held locks are granted again",
				Fix:   "maxmemory-policy noeviction (a full Redis then refuses new locks with OOM, an outage, instead of double grants)"})
		case strings.HasPrefix(policy, "allkeys-"):
			c.add(Finding{Severity: SeverityWarning, Check: "maxmemory-policy", Node: node, Seen: seen,
				Means: "when memory runs out, lock keys may be evicted: held locks are granted again",
				Fix:   "maxmemory-policy noeviction, or a Redis of its own for the locks"})
		}
	}
}

// persistence checks a server's persistence, and reports whether ctx ended.
func (c *checker) persistence(ctx context.Context, s driver.Node, node string, pers map[string]string) bool {
	if pers == nil {
		return false
	}
	aof := pers["aof_enabled"] == "1"
	fsync := ""
	if aof {
		v, err := s.Call(ctx, []any{"CONFIG", "GET", "appendfsync"})
		if err != nil && c.cut(ctx) {
			return true
		}
		fsync = configValue(v, "appendfsync")
	}
	switch {
	case !aof:
		c.add(Finding{Severity: SeverityWarning, Check: "persistence", Node: node,
			Seen:  "appendonly no",
			Means: "a server restarted at once comes back without the locks it held and grants them again (GUARANTEES.md S5)",
			Fix:   "appendonly yes with appendfsync always, or keep a crashed server down for longer than the longest TTL"})
	case fsync != "" && fsync != "always":
		c.add(Finding{Severity: SeverityInfo, Check: "persistence", Node: node,
			Seen:  "appendfsync " + fsync,
			Means: "a crash loses the last writes (up to a second with everysec): locks taken just before it are granted again",
			Fix:   "appendfsync always, if that cost is acceptable"})
	}
	return false
}

// configValue returns name's value in CONFIG GET's reply: pairs in an
// array (RESP2), or a map (RESP3).
func configValue(reply any, name string) string {
	var v any
	switch r := reply.(type) {
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			if r[i] == name {
				v = r[i+1]
			}
		}
	case map[any]any:
		v = r[name]
	}
	s, _ := v.(string)
	return s
}

func hostPort(host, port string) string {
	if host == "" {
		return ""
	}
	return host + ":" + port
}

// pairs parses INFO's "k1:v1\r\nk2:v2" (sep "\n", eq ":") or a replica's
// "ip=...,port=..." (sep ",", eq "=").
func pairs(s, sep, eq string) map[string]string {
	m := make(map[string]string)
	for _, f := range strings.Split(s, sep) {
		if k, v, ok := strings.Cut(strings.TrimSpace(f), eq); ok {
			m[k] = v
		}
	}
	return m
}

// roundTrip compares PING's round trip with TTL's drift allowance; false: no answer.
func (c *checker) roundTrip(ctx context.Context, client driver.Node, node string) bool {
	var worst time.Duration
	for range 5 {
		start := c.l.clock.Now()
		if _, err := client.Call(ctx, []any{"PING"}); err != nil {
			// Unreachable: the server checks'; a refusal: the permissions check's.
			return !c.cut(ctx) && classify(err) != store.Unavailable
		}
		worst = max(worst, c.l.clock.Now().Sub(start))
	}
	ttl := c.l.opts.TTL
	allowance := drift(ttl)
	f := Finding{Severity: SeverityInfo, Check: "round-trip", Node: node,
		Seen: fmt.Sprintf("round trip up to %v (5 PINGs), drift allowance %v at TTL %v", worst.Round(time.Microsecond), allowance, ttl)}
	if worst > allowance {
		f.Severity = SeverityWarning
		f.Means = "the allowance also covers the network's delays: a lease's deadline may come after the server let the lock expire"
		f.Fix = "a longer TTL (the allowance is TTL/100 + 2ms), or a Redis closer to the clients"
	}
	c.add(f)
	return true
}

// permissions tries aclRules, test lock name and its channel as the library uses
// them; master is a Cluster's master that serves name's keys, else nil.
func (c *checker) permissions(ctx context.Context, n checkNode, master driver.Node, node, name string) {
	if c.cut(ctx) { // nothing sent, nothing to delete
		return
	}
	token := keys.NewToken()
	ks := keys.ForLease(c.l.opts.KeyPrefix, name, token)
	key := ks[keys.LockKey]
	written := testLock{n.client, []any{"DEL", key + ":acl"}} // one hash tag: one slot on a Cluster
	for _, k := range ks {
		written.keys = append(written.keys, k)
	}
	c.written = append(c.written, written)
	channel := keys.Channel(key, n.client.DB())
	if !c.tryRules(ctx, n, master, node, key+":acl", channel) {
		return
	}
	h := n.single.Lock(store.Spec{Name: name, Token: token, TTL: time.Second, Owner: c.l.opts.Owner})
	a := h.Acquire(ctx)
	var replicas *store.ReplicaError
	switch {
	case a.Err != nil && c.cut(ctx):
		return
	case a.Err != nil && errors.As(a.Err, &replicas): // the replicas check's; cleanUp deletes the lock
	case a.Err != nil:
		sev := SeverityCritical
		if classify(a.Err) == store.Unavailable {
			sev = SeverityWarning // reported as unreachable elsewhere if it is
		}
		c.add(Finding{Severity: sev, Check: "permissions", Node: node,
			Seen:  "taking a test lock failed: " + advice(name, a.Err),
			Means: "locks cannot be taken", Fix: "see the error"})
		return
	case a.OK:
		if !c.released(ctx, n, master, h, node, name, channel) {
			return
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	unsub, err, unsubErr := subscribeTest(sctx, n.client.Network(), channel)
	if err != nil && !c.cut(ctx) && classify(err) == store.Misconfigured {
		c.add(Finding{Severity: SeverityWarning, Check: "permissions", Node: node,
			Seen:  "subscribing to a lock channel failed: " + store.OneLine(err.Error()),
			Means: "waiters are not woken by releases: they poll (backoff, the holder's TTL)",
			Fix:   "let the ACL user subscribe to the lock channels: &" + glob.Escape(c.l.opts.KeyPrefix) + "*"})
		return
	}
	c.refused(node, unsub, unsubErr) // what waiters send at the end of one
}

// subscribeTest subscribes to channel as a waiter does (sharded, or classic
// on a server without sharded pub/sub), then unsubscribes: the command it
// sent to unsubscribe, and both errors.
func subscribeTest(ctx context.Context, net notify.Network, channel string) (unsub string, err, unsubErr error) {
	node, err := net.Route(ctx, channel)
	if err != nil {
		return "", err, nil
	}
	for _, sharded := range []bool{true, false} {
		conn := net.Open(node, sharded)
		defer func() { _ = conn.Close() }()
		ev := notify.Event{Kind: notify.Broken}
		if ev.Err = conn.Subscribe(ctx, channel); ev.Err == nil {
			ev = conn.Receive(ctx)
		}
		if ev.Kind == notify.Refused && ev.Unknown && sharded {
			continue
		}
		unsub = map[bool]string{true: "SUNSUBSCRIBE", false: "UNSUBSCRIBE"}[sharded]
		if ev.Kind != notify.Subscribed {
			return unsub, ev.Err, nil
		}
		if unsubErr = conn.Unsubscribe(ctx, channel); unsubErr == nil {
			if ev = conn.Receive(ctx); ev.Kind == notify.Refused {
				unsubErr = ev.Err
			}
		}
		return unsub, nil, unsubErr
	}
	return unsub, nil, nil
}

// released releases test lock h and publishes a wake-up; false: ctx ended.
func (c *checker) released(ctx context.Context, n checkNode, master driver.Node, h store.Lease, node, name, channel string) bool {
	_, perr, err := h.Release(ctx, store.Release, time.Second)
	if err == nil && perr == nil {
		perr = publishTest(ctx, n.client, master, channel)
	}
	switch {
	case (err != nil || perr != nil) && c.cut(ctx):
		return false
	case err != nil:
		c.add(Finding{Severity: SeverityCritical, Check: "permissions", Node: node,
			Seen:  "releasing a test lock failed: " + advice(name, err),
			Means: "locks are not released: they expire after their TTL", Fix: "see the error"})
	case perr != nil:
		c.add(Finding{Severity: SeverityWarning, Check: "permissions", Node: node,
			Seen:  "a release could not publish its wake-up: " + store.OneLine(perr.Error()),
			Means: "waiters are not woken by releases: they poll (backoff, the holder's TTL)",
			Fix:   "let the ACL user publish on the lock channels: &" + glob.Escape(c.l.opts.KeyPrefix) + "*"})
	}
	return true
}

// publishTest publishes "released" on channel as release.lua does, through
// master if not nil, and returns the error of a publish the server refused.
func publishTest(ctx context.Context, client, master driver.Node, channel string) error {
	via := client
	if master != nil {
		via = master
	}
	_, err := via.Call(ctx, []any{"SPUBLISH", channel, "released"})
	if err != nil && store.IsUnknownCommand(err) {
		_, err = via.Call(ctx, []any{"PUBLISH", channel, "released"})
	}
	if err != nil && !strings.Contains(err.Error(), "NOPERM") {
		return nil // not a refusal: the network's, reported elsewhere
	}
	return err
}

// cleanUp deletes the test locks' keys, also after ctx ended, within ReleaseTimeout.
func (c *checker) cleanUp(ctx context.Context) {
	if len(c.written) == 0 {
		return
	}
	ctx, cancel := c.l.detached(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, w := range c.written {
		wg.Go(func() { _, _ = w.via.Call(ctx, w.keys) })
	}
	wg.Wait()
}

// tryRules sends aclRules' commands (to master if not nil) and reports those the ACL
// refuses; false when ctx ended or no connection can be set up.
func (c *checker) tryRules(ctx context.Context, n checkNode, master driver.Node, node, key, channel string) bool {
	o := &c.l.opts
	db := n.client.DB()
	via := driver.Node(n.client)
	if master != nil {
		via = master
	}
	for _, r := range aclRules { // go-redis selects the database as it sets up a connection
		if r.only == onlyDB && db != 0 {
			_, err := via.Call(ctx, tryArgs(r.try, key, channel, db))
			if err != nil && c.cut(ctx) || c.refused(node, r.try, err) {
				return false
			}
		}
	}
	keySet := false // SET made the test key, with a TTL: the writes after it fail on its type
	for _, r := range aclRules {
		if r.only == onlyReplicas && o.Replicas == 0 || r.only == onlyFsync && !o.ReplicaFsync || r.only == onlyDB {
			continue
		}
		if r.only == onlyCluster {
			if master != nil && r.try != "" {
				err := master.Pipe(ctx, false, tryArgs(r.try, key, channel, db), []any{"PING"})[0] // PING spends the flag ASKING leaves
				if err != nil && c.cut(ctx) {
					return false
				}
				c.refused(node, r.try, err)
			}
			continue
		}
		try := r.try
		if try == "" || r.creates && !keySet { // without the key, try would make one with no TTL
			continue
		}
		_, err := via.Call(ctx, tryArgs(try, key, channel, db))
		if r.rule == "+set" {
			keySet = err == nil
		}
		if err != nil && r.try6 != "" && store.IsUnknownCommand(err) {
			try = r.try6
			_, err = via.Call(ctx, tryArgs(try, key, channel, db))
		}
		if err != nil && c.cut(ctx) {
			return false
		}
		c.refused(node, try, err)
	}
	// The fencelock command reads a lock in a transaction.
	var err error
	for _, e := range via.Pipe(ctx, true, []any{"GET", key}) {
		if err == nil || e != nil && strings.Contains(e.Error(), "NOPERM") {
			err = e
		}
	}
	if err != nil && c.cut(ctx) {
		return false
	}
	c.refused(node, "MULTI, GET, EXEC", err)
	return true
}

// refused reports and records err if it is the ACL's refusal of what.
func (c *checker) refused(node, what string, err error) bool {
	if err == nil || !strings.Contains(err.Error(), "NOPERM") { // EXEC: "EXECABORT ... because of: NOPERM ..."
		return false
	}
	f := Finding{Severity: SeverityWarning, Check: "permissions", Node: node,
		Seen: what + " refused: " + store.OneLine(err.Error()),
		Fix:  "grant the ACL user " + aclAdviceFor(c.l.opts.KeyPrefix)}
	for _, r := range aclRules {
		for _, rule := range []string{r.rule, r.redis6} {
			name := "'" + strings.TrimPrefix(rule, "+")
			// A subcommand's refusal names it: 'command|count' for +command.
			if rule != "" && (strings.Contains(err.Error(), name+"'") || strings.Contains(err.Error(), name+"|")) {
				f.Severity, f.Means, f.Fix = r.sev, r.needs+" fail without "+rule, "grant the ACL user "+rule
			}
		}
	}
	c.add(f)
	return true
}

// tryArgs splits an aclRules command into arguments, filling {key}, {channel}, {db}.
func tryArgs(try, key, channel string, db int) []any {
	var args []any
	r := strings.NewReplacer("{key}", key, "{channel}", channel, "{db}", strconv.Itoa(db))
	for _, a := range strings.Fields(try) {
		args = append(args, r.Replace(a))
	}
	return args
}

// independence reports Redlock nodes that are one server or replicate one another.
func (c *checker) independence(nodes int) {
	for i, a := range c.servers {
		for _, b := range c.servers[i+1:] {
			var seen string
			switch {
			case a.runID != "" && a.runID == b.runID:
				seen = "the same server (run_id " + a.runID + ")"
			case a.master != "" && a.master == b.addr, b.master != "" && b.master == a.addr:
				seen = "a master and its replica"
			case a.replID != "" && a.replID == b.replID:
				seen = "one replication stream (master_replid " + a.replID + ")"
			}
			if seen == "" {
				continue
			}
			c.add(Finding{Severity: SeverityCritical, Check: "independence", Node: a.node + ", " + b.node,
				Seen:  seen,
				Means: fmt.Sprintf("one failure takes both: the quorum of %d of %d is weaker than it looks", nodes/2+1, nodes),
				Fix:   "give each Redlock node its own server, with no replication between them"})
		}
	}
}
