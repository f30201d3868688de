package fencerueidis_test

import (
	"testing"

	"github.com/redis/rueidis"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/conformance"
	fencerueidis "github.com/fencelock/fencelock/rueidis"
)

// rueidisClient is rueidis as the conformance suite drives it: a client
// with rueidis's defaults (client-side caching off: fencelock reads no key
// through it).
var rueidisClient = conformance.Client{
	Name: "rueidis",
	New: func(target conformance.Target, opts *fencelock.Options) (*fencelock.Locker, func(), error) {
		c, err := newRueidis(target)
		if err != nil {
			return nil, nil, err
		}
		l, err := fencerueidis.New(c, opts)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		return l, c.Close, nil
	},
	NewRedlock: func(targets []conformance.Target, opts *fencelock.Options) (*fencelock.Locker, func(), error) {
		var clients []rueidis.Client
		closeAll := func() {
			for _, c := range clients {
				c.Close()
			}
		}
		for _, target := range targets {
			c, err := newRueidis(target)
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			clients = append(clients, c)
		}
		l, err := fencerueidis.NewRedlock(clients, opts)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		return l, closeAll, nil
	},
}

func newRueidis(target conformance.Target) (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{InitAddress: target.Addrs, DisableCache: true,
		Username: target.Username, Password: target.Password})
}

// TestConformance runs the suite go-redis passes (internal/conformance)
// on rueidis.
func TestConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, rueidisClient)
}
