package fencelock_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/conformance"
)

// goRedisClient is go-redis as the conformance suite drives it.
var goRedisClient = conformance.Client{
	Name: "go-redis",
	New: func(target conformance.Target, opts *fencelock.Options) (*fencelock.Locker, func(), error) {
		c := newGoRedis(target)
		l, err := fencelock.New(c, opts)
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		return l, func() { _ = c.Close() }, nil
	},
	NewRedlock: func(targets []conformance.Target, opts *fencelock.Options) (*fencelock.Locker, func(), error) {
		clients := make([]redis.UniversalClient, len(targets))
		for i, target := range targets {
			clients[i] = newGoRedis(target)
		}
		closeAll := func() {
			for _, c := range clients {
				_ = c.Close()
			}
		}
		l, err := fencelock.NewRedlock(clients, opts)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		return l, closeAll, nil
	},
}

// newGoRedis returns a go-redis client of target: a ClusterClient for a
// Cluster, else a Client.
func newGoRedis(target conformance.Target) redis.UniversalClient {
	if target.Cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: target.Addrs,
			Username: target.Username, Password: target.Password})
	}
	return redis.NewClient(&redis.Options{Addr: target.Addrs[0],
		Username: target.Username, Password: target.Password})
}

// TestConformance runs the conformance suite that every client library's
// adapter runs (internal/conformance) against go-redis.
func TestConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, goRedisClient)
}
