package deployment

import (
	"time"

	"github.com/fencelock/fencelock/internal/store"
)

// ClientOptions are what a Client needs of the Locker's options.
type ClientOptions struct {
	Replicas       int // how many replicas acknowledge a script's writes (WAIT); 0: none
	ReplicaTimeout time.Duration
	ReplicaFsync   bool // WAITAOF
}

// Wait returns the command a Client sends after a script on the connection
// that wrote it: WAIT, or WAITAOF with ReplicaFsync.
func (o ClientOptions) Wait() []any {
	if o.ReplicaFsync {
		return []any{"WAITAOF", 1, o.Replicas, store.Millis(o.ReplicaTimeout)}
	}
	return []any{"WAIT", o.Replicas, store.Millis(o.ReplicaTimeout)}
}

// Acknowledged reads Wait's reply: a *store.ReplicaError when too few
// replicas acknowledged, or the master did not fsync.
func (o ClientOptions) Acknowledged(reply any) error {
	acked, local := int64(0), int64(1)
	switch v := reply.(type) {
	case int64: // WAIT
		acked = v
	case []any: // WAITAOF: [local, replicas]
		if len(v) == 2 {
			local, _ = v[0].(int64)
			acked, _ = v[1].(int64)
		}
	}
	if acked < int64(o.Replicas) || local < 1 {
		return &store.ReplicaError{Acked: acked, Want: o.Replicas, Local: local, Fsync: o.ReplicaFsync, Timeout: o.ReplicaTimeout}
	}
	return nil
}
