package fencelock

import (
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/deployment"
	"github.com/fencelock/fencelock/internal/goredis"
	"github.com/fencelock/fencelock/internal/redlock"
)

// NewRedlock returns a Locker whose locks are held on a quorum of
// independent Redis deployments, the Redlock algorithm with fences ordered
// without trusting clocks ("How Redlock works"), its leases used as New's. A
// lock is held when len(clients)/2+1 deployments granted it within its
// validity; a minority down or hung is not an outage. Use an odd number (four
// tolerate the loss of one, as three do), none a replica of another or a node
// of the same Cluster, given in the same order in every process: waiters wait
// in line on the first. It returns an error matching ErrInvalid, with no Redis
// call, for no clients or more than 64, a nil client, the same client twice,
// or an option it cannot honour. It adds New's dial hook to every client.
func NewRedlock(clients []redis.UniversalClient, opts *Options) (*Locker, error) {
	if err := goredis.UsableAll(clients); err != nil {
		return nil, invalidf("%v", err)
	}
	connect := make([]Connector, len(clients))
	for i, c := range clients {
		connect[i] = goRedis(c)
	}
	return NewRedlockWith(connect, opts)
}

// NewRedlockWith is NewRedlock for the clients connect makes, one per node:
// what the adapter modules call. It returns an error matching ErrInvalid,
// with no Redis call, for none or more than 64, a nil one, or an option it
// cannot honour.
func NewRedlockWith(connect []Connector, opts *Options) (*Locker, error) {
	if len(connect) == 0 || len(connect) > 64 {
		return nil, invalidf("%d redis clients: a Redlock needs 1 to 64", len(connect))
	}
	for i, c := range connect {
		if c == nil {
			return nil, invalidf("redis client %d is nil", i)
		}
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l := newLocker(o)
	nodes := make([]*deployment.Deployment, len(connect))
	for i, connect := range connect {
		c := connect(l.clientOptions())
		name := "node " + strconv.Itoa(i)
		if addr := c.Addr(); addr != "" {
			name += " (" + addr + ")"
		}
		nodes[i] = deployment.New(c, l.deploymentConfig(name))
		l.checks = append(l.checks, checkNode{client: c, single: nodes[i], name: name})
	}
	q := redlock.New(nodes, redlock.Config{KeyPrefix: o.KeyPrefix, Owner: o.Owner, ReleaseTimeout: o.ReleaseTimeout,
		FenceRetention: o.FenceRetention, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
		Clock: o.Clock, Tasks: l.bg, Closed: l.closed})
	l.store, l.traits = q, q.Traits()
	l.lock = kind{lease: q.Lock}
	return l, nil
}
