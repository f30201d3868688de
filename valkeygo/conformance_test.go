package fencevalkey_test

import (
	"testing"

	"github.com/valkey-io/valkey-go"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/conformance"
	fencevalkey "github.com/fencelock/fencelock/valkeygo"
)

// valkeyClient is valkey-go as the conformance suite drives it: a client
// with valkey-go's defaults (client-side caching off: fencelock reads no key
// through it).
var valkeyClient = conformance.Client{
	Name: "valkey-go",
	New: func(target conformance.Target, opts *fencelock.Options) (*fencelock.Locker, func(), error) {
		c, err := newValkey(target)
		if err != nil {
			return nil, nil, err
		}
		l, err := fencevalkey.New(c, opts)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		return l, c.Close, nil
	},
	NewRedlock: func(targets []conformance.Target, opts *fencelock.Options) (*fencelock.Locker, func(), error) {
		var clients []valkey.Client
		closeAll := func() {
			for _, c := range clients {
				c.Close()
			}
		}
		for _, target := range targets {
			c, err := newValkey(target)
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			clients = append(clients, c)
		}
		l, err := fencevalkey.NewRedlock(clients, opts)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		return l, closeAll, nil
	},
}

func newValkey(target conformance.Target) (valkey.Client, error) {
	return valkey.NewClient(valkey.ClientOption{InitAddress: target.Addrs, DisableCache: true,
		Username: target.Username, Password: target.Password})
}

// TestConformance runs the suite go-redis passes (internal/conformance)
// on valkey-go.
func TestConformance(t *testing.T) {
	t.Parallel()
	conformance.Run(t, valkeyClient)
}
