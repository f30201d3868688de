//go:build !noredlock

// The Redlock benchmarks need fencelock.NewRedlock; bench.sh builds with
// -tags noredlock when it benchmarks a past commit (REV) that has none.

package benchmarks

import (
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// redlockNodes is how many independent redis-servers the Redlock benchmarks
// start: the usual Redlock deployment, which tolerates the loss of two.
const redlockNodes = 5

// A redlockDriver sets up one Redlock implementation over several
// independent servers.
type redlockDriver struct {
	name string
	// open connects to the redis-servers at addrs (one go-redis client per
	// server, closed by b.Cleanup) and returns a function that makes
	// sessions sharing those clients.
	open func(b testing.TB, addrs []string) func() session
}

// redlockDrivers lists the Redlock implementations in the order they run
// and are reported.
var redlockDrivers = []redlockDriver{
	{"fencelock", openFencelockRedlock},
	{"redsync", openRedsyncRedlock},
}

func init() {
	for _, d := range redlockDrivers {
		openers["redlock/"+d.name] = d.open
	}
}

// startRedlockNodes starts redlockNodes servers, stopped when b ends.
func startRedlockNodes(b *testing.B) ([]*redistest.Server, []string) {
	var servers []*redistest.Server
	var addrs []string
	for range redlockNodes {
		srv := startServer(b)
		servers = append(servers, srv)
		addrs = append(addrs, srv.Addr)
	}
	return servers, addrs
}

// BenchmarkRedlockUncontended is BenchmarkUncontended over redlockNodes
// independent servers: take and release one lock nobody else wants, in a
// loop. srv-ns/op sums the CPU time of the servers' main threads.
func BenchmarkRedlockUncontended(b *testing.B) {
	servers, addrs := startRedlockNodes(b)
	for _, d := range redlockDrivers {
		newSession := d.open(b, addrs)
		b.Run(d.name, func(b *testing.B) {
			uncontended(b, newSession(), d.name+":redlock:uncontended", servers...)
		})
	}
}

// BenchmarkRedlockContended is BenchmarkContended over redlockNodes
// independent servers: -waiters goroutines, each with its own clients (one
// per server), compete for one lock; hold 1ms, release, pause 5ms (-waiters,
// -hold, -pause; with -procs it is BenchmarkRedlockContendedProcs). The
// metrics are BenchmarkContended's.
func BenchmarkRedlockContended(b *testing.B) {
	_, addrs := startRedlockNodes(b)
	for _, d := range redlockDrivers {
		b.Run(d.name, func(b *testing.B) {
			c := contentionFlags()
			w := waiterSpec{suite: "redlock", impl: d.name, addrs: addrs}
			r := contend(b, w, d.name+":redlock:contended", measuredDuration(), c)
			r.report(b)
		})
	}
}

// BenchmarkRedlockContendedProcs is BenchmarkRedlockContended with every
// waiter a process of its own, as separate pods are (-procs; see
// contendProcs): a waiter's timers then do not wait for the other waiters'
// network traffic.
func BenchmarkRedlockContendedProcs(b *testing.B) {
	_, addrs := startRedlockNodes(b)
	for _, d := range redlockDrivers {
		b.Run(d.name, func(b *testing.B) {
			c := contentionFlags()
			c.procs = true
			w := waiterSpec{suite: "redlock", impl: d.name, addrs: addrs}
			r := contend(b, w, d.name+":redlock:contended", measuredDuration(), c)
			r.report(b)
		})
	}
}

// fencelock.NewRedlock

func openFencelockRedlock(b testing.TB, addrs []string) func() session {
	clients := make([]redis.UniversalClient, len(addrs))
	for i, addr := range addrs {
		clients[i] = newGoRedis(b, addr)
	}
	locker, err := fencelock.NewRedlock(clients, &fencelock.Options{TTL: ttl})
	if err != nil {
		b.Fatal(err)
	}
	closeLater(b, locker)
	return func() session { return &fencelockSession{locker: locker} }
}

// go-redsync/redsync with one go-redis v9 pool per server

func openRedsyncRedlock(b testing.TB, addrs []string) func() session {
	pools := make([]redsyncredis.Pool, len(addrs))
	for i, addr := range addrs {
		pools[i] = goredis.NewPool(newGoRedis(b, addr))
	}
	rs := redsync.New(pools...)
	expiry := redsync.WithExpiry(ttl)
	return func() session { return &redsyncSession{rs: rs, expiry: expiry} }
}
