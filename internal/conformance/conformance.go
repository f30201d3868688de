// Package conformance is a test suite that runs the same behaviour tests
// against every Redis client library fencelock supports (go-redis, and the
// rueidis and valkey-go adapters), on redis-server processes it starts
// (internal/redistest): a client's tests call Run with a Client that makes
// Lockers on that library's clients.
//
// Beside the Lockers of the client under test, the suite makes Lockers of its
// own on go-redis clients, to check that both take the same locks: each
// excludes the other, fences increase across both, and a release by one wakes
// a waiter of the other.
package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
)

// A Target is where a client connects: one server (a standalone or a master), or a Cluster's seeds.
type Target struct {
	Addrs              []string
	Cluster            bool
	Username, Password string // "" : the default user
}

// A Client is one Redis client library as the suite drives it.
type Client struct {
	Name string
	// New returns a Locker on a new client of target, configured by opts, and a
	// func that closes that client (Locker.Close does not close it). err is
	// the client library's own constructor error (rueidis dials at once).
	New func(target Target, opts *fencelock.Options) (l *fencelock.Locker, closeClient func(), err error)
	// NewRedlock is NewRedlock on one new client per target.
	NewRedlock func(targets []Target, opts *fencelock.Options) (l *fencelock.Locker, closeClient func(), err error)
}

// Run runs the suite against c on redis-server processes it starts (internal/redistest).
func Run(t *testing.T, c Client) {
	t.Helper()
	if c.New == nil || c.NewRedlock == nil {
		t.Fatalf("conformance: Client %q needs both New and NewRedlock", c.Name)
	}
	s := &suite{c: c}
	for _, st := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"Standalone", s.standalone},
		{"CrossClient", s.crossClient},
		{"Fair", s.fair},
		{"Semaphore", s.semaphore},
		{"RWLock", s.rwlock},
		{"AcquireAll", s.acquireAll},
		{"InspectAndCheck", s.inspectAndCheck},
		{"Deadline", s.deadline},
		{"Replicas", s.replicas},
		{"Cluster", s.cluster},
		{"Redlock", s.redlock},
		{"ACL", s.acl},
		{"Errors", s.errors},
	} {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			st.run(t)
			t.Logf("%s: %s ran in %v", c.Name, t.Name(), time.Since(start).Round(time.Millisecond))
		})
	}
}

type suite struct{ c Client }

// Patience bounds: how long a test waits for what must happen, far longer
// than it takes on a busy machine, and far shorter than what would happen
// without the behaviour tested (a waiter's pause between attempts, a TTL).
const (
	// within bounds a wait for what happens at once on an idle machine.
	within = 20 * time.Second
	// holdTTL is the TTL of a holder whose release a waiter awaits: a
	// plain waiter sleeps no longer than the holder's TTL, so a waiter with
	// patient's backoff obtaining the lock within `within` of the release
	// was woken by it.
	holdTTL = time.Minute
)

// patient are Options under which a waiter not woken by a release waits
// for the holder's TTL (holdTTL, far longer than within) between attempts.
func patient() *fencelock.Options {
	return &fencelock.Options{MinRetryBackoff: 10 * time.Minute, MaxRetryBackoff: 10 * time.Minute}
}

// bg is the context of the suite's calls: not t.Context(), which ends before
// the cleanups that release leases.
var bg = context.Background()

// callCtx returns a context for one call, ended after within.
func callCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, within)
	t.Cleanup(cancel)
	return ctx
}

// locker returns a Locker of the client under test on target, closed (and
// its client) when the test ends.
func (s *suite) locker(t *testing.T, target Target, opts *fencelock.Options) *fencelock.Locker {
	t.Helper()
	l, closeClient, err := s.c.New(target, opts)
	if err != nil {
		if closeClient != nil {
			closeClient()
		}
		t.Fatalf("%s: New(%v): %v", s.c.Name, target.Addrs, err)
	}
	require.NotNil(t, l, "%s: New returned no Locker", s.c.Name)
	t.Cleanup(func() {
		_ = l.Close()
		if closeClient != nil {
			closeClient()
		}
	})
	return l
}

// redlockOn returns a NewRedlock Locker of the client under test on targets,
// closed (and its clients) when the test ends.
func (s *suite) redlockOn(t *testing.T, targets []Target, opts *fencelock.Options) *fencelock.Locker {
	t.Helper()
	l, closeClient, err := s.c.NewRedlock(targets, opts)
	if err != nil {
		if closeClient != nil {
			closeClient()
		}
		t.Fatalf("%s: NewRedlock: %v", s.c.Name, err)
	}
	require.NotNil(t, l, "%s: NewRedlock returned no Locker", s.c.Name)
	t.Cleanup(func() {
		_ = l.Close()
		if closeClient != nil {
			closeClient()
		}
	})
	return l
}

// goRedisClient returns the suite's own go-redis client of target.
func goRedisClient(target Target) redis.UniversalClient {
	if target.Cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: target.Addrs,
			Username: target.Username, Password: target.Password})
	}
	return redis.NewClient(&redis.Options{Addr: target.Addrs[0],
		Username: target.Username, Password: target.Password})
}

// reference returns a Locker of the suite's own go-redis client on target,
// closed (and its client) when the test ends.
func reference(t *testing.T, target Target, opts *fencelock.Options) *fencelock.Locker {
	t.Helper()
	c := goRedisClient(target)
	l, err := fencelock.New(c, opts)
	if err != nil {
		_ = c.Close()
		t.Fatalf("go-redis reference: New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close(); _ = c.Close() })
	return l
}

// referenceRedlock returns a NewRedlock Locker of the suite's own go-redis
// clients on targets, closed (and its clients) when the test ends.
func referenceRedlock(t *testing.T, targets []Target, opts *fencelock.Options) *fencelock.Locker {
	t.Helper()
	var clients []redis.UniversalClient
	for _, target := range targets {
		clients = append(clients, goRedisClient(target))
	}
	closeAll := func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}
	l, err := fencelock.NewRedlock(clients, opts)
	if err != nil {
		closeAll()
		t.Fatalf("go-redis reference: NewRedlock: %v", err)
	}
	t.Cleanup(func() { _ = l.Close(); closeAll() })
	return l
}

// targetOf returns the Target of one server.
func targetOf(srv *redistest.Server) Target { return Target{Addrs: []string{srv.Addr}} }

// pause stops srv with SIGSTOP until the test ends (or an earlier Resume).
// Call it after the Lockers on srv were made, so that the server runs again
// before their Close waits for what runs in the background.
func pause(t *testing.T, srv *redistest.Server) {
	t.Helper()
	srv.Pause()
	t.Cleanup(srv.Resume)
}
