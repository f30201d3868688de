package redlock

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/deployment"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// A lease is one token's lease on the quorum: its keys, the same on every
// node, and which nodes hold it.
type lease struct {
	q     *Quorum
	spec  store.Spec
	call  *call // shared by the call's tokens
	keys  keys.Lease
	args  [keys.N]any
	token string
	arg   any
	owner any
	held  atomic.Uint64 // a bit for each node that granted or extended the lock to the token

	mu    sync.Mutex
	fence int64     // guarded by mu; issued at the grant
	until time.Time // guarded by mu; the end of the lease's validity, for repairs (see Extend)
}

// A call is what the tokens of one waiting Acquire share: its place in the
// first node's line.
type call struct {
	last  *lease // its latest token's (gaveUp in lineWakeup.Leave)
	line  string // the call's id in the line; "" when it does not wait
	lined bool   // its last attempt found the lock busy on the first node, which keeps its entry
	ahead int64  // and how many were ahead of it there
}

var _ store.Lease = (*lease)(nil)

// Lock returns the lease of spec's token on the quorum.
func (q *Quorum) Lock(spec store.Spec) store.Lease { return q.newLease(spec, &call{}) }

func (q *Quorum) newLease(spec store.Spec, c *call) *lease {
	k := &lease{q: q, spec: spec, call: c, keys: keys.ForLease(q.cfg.KeyPrefix, spec.Name, spec.Token), owner: spec.Owner}
	if spec.Owner == q.cfg.Owner {
		k.owner = q.cfg.Owner // the Locker's own, boxed once per lease
	}
	marker := k.keys[keys.MarkerKey]
	k.token = marker[len(marker)-len(spec.Token):]
	k.arg = keys.Box(&k.token)
	for i := range k.keys {
		k.args[i] = keys.Box(&k.keys[i])
	}
	c.last = k
	return k
}

func (k *lease) Key() string { return k.keys[keys.LockKey] }

// Line returns the call's id in the line: "" until it waits.
func (k *lease) Line() string  { return k.call.line }
func (k *lease) Token() string { return k.token }

func (k *lease) Next(token []byte) store.Lease {
	spec := k.spec
	spec.Token = token
	return k.q.newLease(spec, k.call)
}

// nodeGrant is one node's reply to redlock_grant.lua.
type nodeGrant struct {
	node  int
	ok    bool
	pttl  time.Duration // the holder's, when busy
	owner string        // the holder's, when busy
	fence int64         // stored with the lock on this node, when ok
	ahead int64         // when busy: how many are ahead of the attempt's call in the node's line; -1: not in it
	err   error
}

// grant runs redlock_grant.lua on node i: phase 1 with fence 0, a repair
// with the lease's fence. With lineID the call keeps its place in the node's
// line while the lock is busy, and leaves it when granted.
func (k *lease) grant(ctx context.Context, i int, ttl time.Duration, fence int64, lineID string) nodeGrant {
	q := k.q
	reply, err := q.nodes[i].Run(ctx, script.RedlockGrant, false, k.args[:], k.arg,
		store.Millis(ttl), strconv.FormatInt(fence, 10), k.owner, q.retention, lineID, q.entryTTL)
	g := decodeGrant(reply)
	if err != nil {
		// Too few replicas count as no grant; a busy answer (which wrote
		// only the line) stands.
		if !store.ReplicaShort(err) || g.err != nil || g.ok {
			g = nodeGrant{err: err}
		}
	}
	g.node = i
	if g.ok {
		k.held.Or(1 << i)
	}
	return g
}

// decodeGrant decodes redlock_grant.lua's reply.
func decodeGrant(reply any) nodeGrant {
	arr, _ := reply.([]any)
	flag := int64(-1)
	if len(arr) > 0 {
		flag, _ = arr[0].(int64)
	}
	switch {
	case flag == 1 && len(arr) == 3:
		f, _ := arr[1].(string)
		if fence, err := strconv.ParseInt(f, 10, 64); err == nil {
			return nodeGrant{ok: true, fence: fence}
		}
	case flag == 0 && (len(arr) == 3 || len(arr) == 4):
		pttl, isInt := arr[1].(int64)
		owner, isStr := arr[2].(string)
		g := nodeGrant{pttl: time.Duration(pttl) * time.Millisecond, owner: owner, ahead: -1}
		inLine := true
		if len(arr) == 4 {
			g.ahead, inLine = arr[3].(int64)
		}
		if isInt && isStr && inLine {
			return g
		}
	case flag == 2 && len(arr) == 1:
		return nodeGrant{err: store.ErrRetired}
	}
	return nodeGrant{err: store.BadReply("redlock_grant", reply)}
}

// releaseNode runs redlock_release.lua on node d in mode, taking lineID (if
// not "") out of its line; whatever the mode, its marker refuses a grant
// still in flight for as long as the lock would live.
func (k *lease) releaseNode(ctx context.Context, d *deployment.Deployment, mode store.Mode, ttl time.Duration, lineID string) (store.Result, error, error) {
	argv := []any{k.arg, d.ChannelArg(k.Key(), k.args[keys.LockKey]), store.ModeArg(mode), d.MarkerArg(store.Abandon, ttl)}
	if lineID != "" {
		argv = append(argv, lineID)
	}
	reply, err := d.Eval(ctx, script.RedlockRelease, []any{k.args[keys.LockKey], k.args[keys.MarkerKey], k.args[keys.QueueKey], k.args[keys.QueueInfoKey]}, argv...)
	if err != nil {
		return store.Gone, nil, err
	}
	return store.ReleaseReply("redlock_release", reply)
}

// nodeReply is one node's answer to an extension or a release.
type nodeReply struct {
	node      int
	r         store.Result
	perr, err error // perr: a release's publishing error
}

// Extend extends the lock on every node, detached, and repairs it with its
// fence on a node that lost or never got it while the lease is valid; the
// node refuses a repair where its counter is beyond the fence ("How Redlock
// works"), and the deadline only spares the repairs of no use.
func (k *lease) Extend(ctx context.Context, ttl time.Duration, renewal bool) (store.Result, error) {
	q := k.q
	start := q.cfg.Clock.Now()
	k.mu.Lock()
	fence := k.fence
	k.mu.Unlock()
	exts := each(ctx, q, ttl-store.Drift(ttl), true, func(ctx context.Context, i int, d *deployment.Deployment) nodeReply {
		reply, err := d.Run(ctx, script.Extend, renewal, k.args[keys.LockKey:keys.LockKey+1], k.arg, store.Millis(ttl))
		r, err := store.ExtendReply("extend", reply, err)
		if err == nil && r == store.Gone && q.cfg.Clock.Now().Before(k.validUntil()) {
			r, err = k.repair(ctx, i, ttl, fence)
		}
		if r == store.Done {
			k.held.Or(1 << i)
		}
		return nodeReply{node: i, r: r, err: err}
	})
	defer exts.stop()
	r, err := q.extended(ctx, exts)
	if r == store.Done && err == nil {
		k.mu.Lock()
		k.until = start.Add(ttl - store.Drift(ttl))
		k.mu.Unlock()
	}
	return r, err
}

// repair grants the lock to the lease again on node i with its fence.
func (k *lease) repair(ctx context.Context, i int, ttl time.Duration, fence int64) (store.Result, error) {
	switch g := k.grant(ctx, i, ttl, fence, ""); {
	case g.ok:
		return store.Done, nil
	case g.err == nil:
		return store.Taken, nil // taken meanwhile
	case store.ReplicaShort(g.err):
		return store.Gone, g.err // repaired, but too few replicas have it
	}
	return store.Gone, nil
}

func (k *lease) validUntil() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.until
}

// extended counts the nodes' extensions: held when a quorum extended it,
// not when too many found it gone or another's.
func (q *Quorum) extended(ctx context.Context, exts *results[nodeReply]) (store.Result, error) {
	var ours, other, gone int
	var errs nodeErrs
	exts.collect(func(e nodeReply) bool {
		switch {
		case e.err != nil:
			errs.add(q.nodes[e.node], e.err)
		case e.r == store.Done:
			ours++
		case e.r == store.Gone:
			gone++
		default:
			other++
		}
		return ours >= q.n || other+gone > len(q.nodes)-q.n
	})
	switch {
	case ours >= q.n:
		return store.Done, nil
	case other+gone > len(q.nodes)-q.n:
		if other > 0 {
			return store.Taken, nil
		}
		return store.Gone, nil
	case ctx.Err() != nil:
		return store.Gone, ctx.Err()
	}
	msg := fmt.Sprintf("the lock's expiry was set on %d of %d nodes, %d needed", ours, len(q.nodes), q.n)
	return store.Gone, errs.error(store.Unavailable, msg)
}

// Release releases the lock on every node, detached; it was held only if
// still held on a quorum, a node that did not answer counting if it held it.
func (k *lease) Release(ctx context.Context, mode store.Mode, ttl time.Duration) (store.Result, error, error) {
	q := k.q
	rels := each(ctx, q, q.cfg.ReleaseTimeout, true, func(ctx context.Context, i int, d *deployment.Deployment) nodeReply {
		lineID := ""
		if i == 0 {
			lineID = k.call.line // the lease's Acquire, or one that gave up, is out of line
		}
		r, perr, err := k.releaseNode(ctx, d, mode, ttl, lineID)
		return nodeReply{node: i, r: r, perr: perr, err: err}
	})
	defer rels.stop()
	return q.released(ctx, rels, k.held.Load())
}

// released counts the releases of a lease that held the nodes of held.
func (q *Quorum) released(ctx context.Context, rels *results[nodeReply], held uint64) (store.Result, error, error) {
	var deleted, other, gone, maybe int
	var perr error
	var errs nodeErrs
	answered := make([]bool, len(q.nodes))
	rels.collect(func(r nodeReply) bool {
		answered[r.node] = true
		switch {
		case r.err != nil:
			errs.add(q.nodes[r.node], r.err)
			if held&(1<<r.node) != 0 {
				maybe++ // it held the lock, and may still
			}
		case r.r == store.Done:
			deleted++
			if perr == nil {
				perr = r.perr
			}
		case r.r == store.Gone:
			gone++
		default:
			other++
		}
		return deleted >= q.n || other+gone > len(q.nodes)-q.n
	})
	for i, a := range answered {
		if !a && held&(1<<i) != 0 {
			maybe++ // no answer in time from a node that held it
		}
	}
	switch {
	case deleted >= q.n:
		return store.Done, perr, nil
	case deleted+maybe >= q.n && ctx.Err() != nil:
		return store.Gone, nil, ctx.Err()
	case deleted+maybe < q.n && other > 0:
		return store.Taken, nil, nil
	case deleted+maybe < q.n:
		return store.Gone, nil, nil
	}
	msg := fmt.Sprintf("%d of %d nodes released the lock, %d needed to know it was held", deleted, len(q.nodes), q.n)
	return store.Gone, nil, errs.error(store.Unavailable, msg)
}

// Read reads the lock as Inspect does.
func (k *lease) Read(ctx context.Context) (store.Holding, error) {
	return k.q.Inspect(ctx, k.spec.Name, false)
}
