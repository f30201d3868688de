package store

import (
	"context"
	"time"

	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/script"
)

// Single is what one deployment offers beyond Store, set by New: what fair
// waiting and the kinds of lock that live on one deployment (semaphores,
// read-write locks, several names in one script) run there. A quorum has
// none.
type Single interface {
	Store
	// FairLock returns the lease of spec's token on its lock, which can
	// wait in the lock's line.
	FairLock(spec Spec) Queued
	// Run runs s on keys (EVALSHA, then EVAL; EVAL alone with eval), with
	// WAIT for Options.Replicas on the connection that wrote: a
	// *ReplicaError comes with the script's reply when too few replicas
	// acknowledged.
	Run(ctx context.Context, s *script.Script, eval bool, keys []any, argv ...any) (any, error)
	// Eval runs s on keys, without waiting for replicas.
	Eval(ctx context.Context, s *script.Script, keys []any, argv ...any) (any, error)
	// Took is the attempt of a run of k's acquire script: reply and err
	// as Run returned them, a as the script's decoder read the reply. A
	// lock taken short of replicas is given back.
	Took(ctx context.Context, k Lease, reply any, err error, a Attempt) Attempt
	// GiveBack abandons k in the background (Abandon: it deletes what k
	// holds and retires its token), trying for ttl at least.
	GiveBack(k Lease, what string, ttl time.Duration)
	// Listen registers a waiter on the wake-up channel of key, woken (on
	// wake if not nil) as h decides; nil after Close.
	Listen(key string, wake chan struct{}, h notify.Hearer) *notify.Waiter
	// Releases returns the wake-ups of a plain waiter on key's channel.
	Releases(key string) Wakeup
	// ChannelArg returns the wake-up channel of key as a script's argument
	// (boxed is key, boxed).
	ChannelArg(key string, boxed any) any
	// MarkerArg is how long, in ms, a release in mode keeps a token's
	// marker, for a lease of ttl.
	MarkerArg(mode Mode, ttl time.Duration) any
	// Subscribers returns how many connections subscribe to key's
	// wake-up channel.
	Subscribers(ctx context.Context, key string) (int, error)
	// Together reports whether one script can take the locks of all of
	// names.
	Together(names []string) bool
}
